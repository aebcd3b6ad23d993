//! What a plugin sees of time, and how long it may wait for anything.
//!
//! **Virtual clocks (the default).** Both WASI clocks count the same virtual nanoseconds: the
//! monotonic clock from 0 when the instance is created, the wall clock from the Unix epoch
//! (1970-01-01T00:00:00Z) plus that count. Reading either clock advances it by [`READ_STEP`];
//! waiting on a clock subscription (`sleep`, `poll` with a timeout, `setTimeout`) advances it to
//! the subscription's deadline at once instead of blocking. The same calls therefore see the
//! same times on every run, and a sleep costs no real time. A call whose virtual time passes its
//! `timeout_ms` (sleeping an hour, or spinning on `Date.now()` for longer than the limit) ends
//! with the same `Timeout` as a call that runs out of real time.
//!
//! **Real clocks** (`real_clock = true` in a plugin's limits): the host's clocks, and waits last
//! real time, cut off at the call's deadline.
//!
//! **Every wait is bounded.** `wasi:io/poll` (`poll`, `pollable.block`) is provided here, not by
//! wasmtime-wasi, so that no wait outlasts the call's real deadline whatever it waits on: past
//! it, the call ends with `Timeout` and the instance is replaced, exactly as for a spin loop
//! (epoch interruption alone cannot stop a guest blocked inside a host call).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use wasmtime::Trap;
use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::p2::bindings::clocks::{monotonic_clock, wall_clock};
use wasmtime_wasi::p2::bindings::sync::io::poll as sync_poll;
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};
use wasmtime_wasi_io::bindings::wasi::io::poll as async_poll;

/// How far a virtual clock advances each time it is read (also its reported resolution).
pub const READ_STEP: Duration = Duration::from_micros(1);

/// One instance's clocks and the current call's time budget.
pub(crate) struct Clocks {
    real: bool,
    /// Virtual nanoseconds since the instance was created (shared with pending subscriptions).
    now: Arc<AtomicU64>,
    /// Real time at creation, for the real monotonic clock.
    created: Instant,
    /// Virtual time when the current call began.
    call_start: u64,
    /// The current call's limit, in nanoseconds.
    budget: u64,
    /// The current call's real deadline.
    deadline: Instant,
}

impl Clocks {
    pub(crate) fn new(real: bool) -> Self {
        let now = Instant::now();
        Self {
            real,
            now: Arc::new(AtomicU64::new(0)),
            created: now,
            call_start: 0,
            budget: u64::MAX,
            deadline: now + Duration::from_secs(3600),
        }
    }

    /// Starts a call limited to `timeout`.
    pub(crate) fn begin_call(&mut self, timeout: Duration) {
        self.call_start = self.now.load(Ordering::Relaxed);
        self.budget = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        self.deadline = Instant::now() + timeout;
    }

    /// A trap when the call's virtual time has passed its limit.
    fn check_budget(&self) -> wasmtime::Result<()> {
        if !self.real && self.now.load(Ordering::Relaxed).saturating_sub(self.call_start) > self.budget {
            return Err(Trap::Interrupt.into());
        }
        Ok(())
    }

    /// The monotonic clock in nanoseconds (advancing a virtual one by a step).
    fn monotonic(&mut self) -> wasmtime::Result<u64> {
        if self.real {
            return Ok(u64::try_from(self.created.elapsed().as_nanos()).unwrap_or(u64::MAX));
        }
        let step = READ_STEP.as_nanos() as u64;
        self.now.fetch_add(step, Ordering::Relaxed);
        self.check_budget()?;
        Ok(self.now.load(Ordering::Relaxed))
    }

    /// A pollable ready at monotonic time `at` (nanoseconds).
    fn deadline_at(&self, at: u64, table: &mut ResourceTable) -> wasmtime::Result<Resource<DynPollable>> {
        if self.real {
            let wait = Duration::from_nanos(at.saturating_sub(self.created.elapsed().as_nanos() as u64));
            let until = tokio::time::Instant::now().checked_add(wait);
            let pollable = table.push(RealDeadline(until))?;
            return subscribe(table, pollable);
        }
        let pollable = table.push(VirtualDeadline {
            now: self.now.clone(),
            at,
        })?;
        subscribe(table, pollable)
    }
}

/// Ready at once; when waited on, moves virtual time forward to its deadline.
struct VirtualDeadline {
    now: Arc<AtomicU64>,
    at: u64,
}

#[wasmtime_wasi::async_trait]
impl Pollable for VirtualDeadline {
    async fn ready(&mut self) {
        self.now.fetch_max(self.at, Ordering::Relaxed);
    }
}

/// Ready at a real instant (`None`: never).
struct RealDeadline(Option<tokio::time::Instant>);

#[wasmtime_wasi::async_trait]
impl Pollable for RealDeadline {
    async fn ready(&mut self) {
        match self.0 {
            Some(until) => tokio::time::sleep_until(until).await,
            None => std::future::pending().await,
        }
    }
}

/// What the clock and poll interfaces reach of a store.
pub(crate) struct ClockView<'a> {
    pub(crate) clocks: &'a mut Clocks,
    pub(crate) table: &'a mut ResourceTable,
}

struct ClockData;

impl HasData for ClockData {
    type Data<'a> = ClockView<'a>;
}

/// Replaces wasmtime-wasi's clocks and `wasi:io/poll` in `linker` (which already holds the rest
/// of WASI) with the ones described in the module docs.
pub(crate) fn add_to_linker<T: 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> ClockView<'_>,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    wall_clock::add_to_linker::<T, ClockData>(linker, view)?;
    monotonic_clock::add_to_linker::<T, ClockData>(linker, view)?;
    sync_poll::add_to_linker::<T, ClockData>(linker, view)?;
    linker.allow_shadowing(false);
    Ok(())
}

impl wall_clock::Host for ClockView<'_> {
    fn now(&mut self) -> wasmtime::Result<wall_clock::Datetime> {
        let since_epoch = if self.clocks.real {
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
        } else {
            Duration::from_nanos(self.clocks.monotonic()?)
        };
        Ok(wall_clock::Datetime {
            seconds: since_epoch.as_secs(),
            nanoseconds: since_epoch.subsec_nanos(),
        })
    }

    fn resolution(&mut self) -> wasmtime::Result<wall_clock::Datetime> {
        Ok(wall_clock::Datetime {
            seconds: 0,
            nanoseconds: READ_STEP.subsec_nanos(),
        })
    }
}

impl monotonic_clock::Host for ClockView<'_> {
    fn now(&mut self) -> wasmtime::Result<monotonic_clock::Instant> {
        self.clocks.monotonic()
    }

    fn resolution(&mut self) -> wasmtime::Result<monotonic_clock::Duration> {
        Ok(READ_STEP.as_nanos() as u64)
    }

    fn subscribe_instant(&mut self, when: monotonic_clock::Instant) -> wasmtime::Result<Resource<DynPollable>> {
        self.clocks.deadline_at(when, self.table)
    }

    fn subscribe_duration(&mut self, wait: monotonic_clock::Duration) -> wasmtime::Result<Resource<DynPollable>> {
        let now = if self.clocks.real {
            self.clocks.created.elapsed().as_nanos() as u64
        } else {
            self.clocks.now.load(Ordering::Relaxed)
        };
        self.clocks.deadline_at(now.saturating_add(wait), self.table)
    }
}

impl ClockView<'_> {
    /// Runs a wait until the call's real deadline, then checks its virtual budget.
    fn bounded<R>(&mut self, wait: impl AsyncFnOnce(&mut ResourceTable) -> wasmtime::Result<R>) -> wasmtime::Result<R> {
        let deadline = tokio::time::Instant::from_std(self.clocks.deadline);
        let table = &mut *self.table;
        // The timer must be made inside the runtime that drives it.
        let outcome =
            wasmtime_wasi::runtime::in_tokio(async move { tokio::time::timeout_at(deadline, wait(table)).await });
        match outcome {
            Ok(result) => {
                let value = result?;
                self.clocks.check_budget()?;
                Ok(value)
            }
            Err(_elapsed) => Err(Trap::Interrupt.into()),
        }
    }
}

impl sync_poll::Host for ClockView<'_> {
    fn poll(&mut self, pollables: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
        self.bounded(async move |table| async_poll::Host::poll(table, pollables).await)
    }
}

impl sync_poll::HostPollable for ClockView<'_> {
    fn block(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        self.bounded(async move |table| async_poll::HostPollable::block(table, pollable).await)
    }

    fn ready(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<bool> {
        self.bounded(async move |table| async_poll::HostPollable::ready(table, pollable).await)
    }

    fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        async_poll::HostPollable::drop(self.table, pollable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_a_virtual_clock_advances_it_and_the_budget_runs_out() {
        let mut clocks = Clocks::new(false);
        clocks.begin_call(Duration::from_micros(3));
        assert_eq!(clocks.monotonic().unwrap(), 1_000);
        assert_eq!(clocks.monotonic().unwrap(), 2_000);
        assert_eq!(clocks.monotonic().unwrap(), 3_000);
        let err = clocks.monotonic().unwrap_err();
        assert_eq!(err.downcast_ref::<Trap>(), Some(&Trap::Interrupt));
        // The next call has a fresh budget from where time stands.
        clocks.begin_call(Duration::from_micros(3));
        assert_eq!(clocks.monotonic().unwrap(), 5_000);
    }

    #[test]
    fn a_virtual_wait_moves_time_to_its_deadline_without_sleeping() {
        let mut clocks = Clocks::new(false);
        clocks.begin_call(Duration::from_secs(1));
        let mut table = ResourceTable::new();
        let started = Instant::now();
        let pollable = clocks.deadline_at(30_000_000_000, &mut table).unwrap();
        let mut view = ClockView {
            clocks: &mut clocks,
            table: &mut table,
        };
        // Thirty virtual seconds, past the one-second limit: a timeout, at once.
        let err = sync_poll::HostPollable::block(&mut view, pollable).unwrap_err();
        assert_eq!(err.downcast_ref::<Trap>(), Some(&Trap::Interrupt));
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(clocks.now.load(Ordering::Relaxed), 30_000_000_000);
    }

    #[test]
    fn a_real_wait_is_cut_off_at_the_call_deadline() {
        let mut clocks = Clocks::new(true);
        clocks.begin_call(Duration::from_millis(50));
        let mut table = ResourceTable::new();
        let started = Instant::now();
        let pollable = clocks.deadline_at(u64::MAX, &mut table).unwrap();
        let mut view = ClockView {
            clocks: &mut clocks,
            table: &mut table,
        };
        let err = sync_poll::Host::poll(&mut view, vec![pollable]).unwrap_err();
        assert_eq!(err.downcast_ref::<Trap>(), Some(&Trap::Interrupt));
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(50) && waited < Duration::from_secs(10),
            "{waited:?}"
        );
    }
}
