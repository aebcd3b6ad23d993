//! The value a world's `init` builds (a reward, a tool, a text environment with its episodes),
//! kept for the calls after it. Type-erased: the export adapters are generic, statics are not.
//! A component exports one world, so one slot serves whichever it is.

use std::any::Any;
use std::cell::RefCell;

thread_local! {
    static INSTANCE: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

/// Keeps `value` (what `init` built), replacing any earlier one.
pub(crate) fn set<T: 'static>(value: T) {
    INSTANCE.with(|cell| *cell.borrow_mut() = Some(Box::new(value)));
}

/// Runs `f` on the value `init` built; an error naming `call` when `init` has not built one.
pub(crate) fn with<T: 'static, R>(call: &str, f: impl FnOnce(&mut T) -> R) -> Result<R, String> {
    INSTANCE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let value = (slot.as_mut())
            .and_then(|v| v.downcast_mut::<T>())
            .ok_or_else(|| format!("`{call}` called before `init`"))?;
        Ok(f(value))
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_call_before_init_is_an_error_naming_it() {
        assert_eq!(
            super::with::<u32, _>("score", |_| ()),
            Err("`score` called before `init`".into())
        );
        super::set(41u32);
        assert_eq!(super::with::<u32, _>("score", |n| *n + 1), Ok(42));
        // Another type than init built is the same error, not a panic.
        assert!(super::with::<String, _>("call", |_| ()).is_err());
    }
}
