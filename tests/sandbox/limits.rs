//! Time, fuel, memory and stack limits.

use std::time::Instant;

use rein_core::PluginErrorKind;
use rein_plugin::SandboxLimits;

use super::{QUICK_TIMEOUT, attack_fails, hostile, quick_limits, scores_good_batch};

#[test]
fn infinite_loop_is_interrupted_at_the_deadline() {
    let mut reward = hostile(quick_limits());
    let start = Instant::now();
    let error = attack_fails(&mut reward, "infinite-loop");
    let elapsed = start.elapsed();
    assert_eq!(error.kind, PluginErrorKind::Timeout { limit: QUICK_TIMEOUT });
    assert_eq!(error.call, Some("score"));
    assert!(elapsed >= QUICK_TIMEOUT, "interrupted before its deadline: {elapsed:?}");
    assert!(elapsed < 5 * QUICK_TIMEOUT, "interrupted far too late: {elapsed:?}");
    assert!(error.to_string().contains("time limit of 1000 ms"), "{error}");
    scores_good_batch(&mut reward);
}

#[test]
fn infinite_loop_runs_out_of_fuel() {
    let limits = SandboxLimits {
        fuel: Some(5_000_000),
        ..quick_limits()
    };
    let mut reward = hostile(limits);
    let error = attack_fails(&mut reward, "infinite-loop");
    assert_eq!(error.kind, PluginErrorKind::OutOfFuel { limit: 5_000_000 });
    // Fuel is refilled for every call: the good batch needs far less than the budget.
    scores_good_batch(&mut reward);
    scores_good_batch(&mut reward);
}

#[test]
fn memory_bomb_hits_the_memory_limit() {
    let mut reward = hostile(quick_limits());
    let error = attack_fails(&mut reward, "memory-bomb");
    assert_eq!(error.kind, PluginErrorKind::MemoryLimit { limit_bytes: 64 << 20 });
    assert!(
        error.to_string().contains("memory limit of 64 MiB (`memory_mib`)"),
        "{error}"
    );
    scores_good_batch(&mut reward);
}

#[test]
fn a_larger_memory_limit_is_honoured_and_still_enforced() {
    // With 256 MiB the bomb gets further, but is still stopped at the limit. The deadline is
    // far beyond the time growing to the limit takes (well under a second), so that a loaded
    // machine cannot turn the memory error into a timeout.
    let mut reward = hostile(SandboxLimits {
        timeout_ms: 30_000,
        ..SandboxLimits::default()
    });
    let error = attack_fails(&mut reward, "memory-bomb");
    assert_eq!(error.kind, PluginErrorKind::MemoryLimit { limit_bytes: 256 << 20 });
    scores_good_batch(&mut reward);
}

#[test]
fn deep_recursion_overflows_the_wasm_stack_not_the_host() {
    let mut reward = hostile(quick_limits());
    let error = attack_fails(&mut reward, "deep-recursion");
    assert_eq!(error.kind, PluginErrorKind::StackOverflow { limit_bytes: 512 << 10 });
    scores_good_batch(&mut reward);
}

#[test]
fn a_smaller_stack_limit_applies() {
    let mut reward = hostile(SandboxLimits {
        stack_kib: 64,
        ..quick_limits()
    });
    let error = attack_fails(&mut reward, "deep-recursion");
    assert_eq!(error.kind, PluginErrorKind::StackOverflow { limit_bytes: 64 << 10 });
    scores_good_batch(&mut reward);
}

#[test]
fn panic_is_a_trap_carrying_the_panic_message() {
    let mut reward = hostile(quick_limits());
    let error = attack_fails(&mut reward, "panic");
    let PluginErrorKind::Trap { message, stderr } = &error.kind else {
        panic!("expected a trap, got {error}")
    };
    assert!(message.contains("unreachable"), "{message}");
    assert!(stderr.contains("the hostile plugin panics on purpose"), "{stderr}");
    assert!(error.is_trap());
    scores_good_batch(&mut reward);
}

#[test]
fn invalid_limits_are_refused_by_name() {
    let path = crate::common::test_plugin_path("hostile-reward");
    for (limits, key) in [
        (
            SandboxLimits {
                memory_mib: 0,
                ..SandboxLimits::default()
            },
            "memory_mib",
        ),
        (
            SandboxLimits {
                memory_mib: 8192,
                ..SandboxLimits::default()
            },
            "memory_mib",
        ),
        (
            SandboxLimits {
                timeout_ms: 0,
                ..SandboxLimits::default()
            },
            "timeout_ms",
        ),
        (
            SandboxLimits {
                fuel: Some(0),
                ..SandboxLimits::default()
            },
            "fuel",
        ),
    ] {
        let error = crate::common::runtime().load(&path, limits).unwrap_err();
        assert!(error.to_string().contains(&format!("`{key}`")), "{error}");
    }
}

#[test]
fn nan_canonicalization_is_available_and_changes_nothing_else() {
    use rein_core::{Action, Environment};
    let path = crate::common::plugin_path("cartpole");
    let plain = crate::common::load_with(&path, SandboxLimits::default());
    let canonical = crate::common::load_with(
        &path,
        SandboxLimits {
            canonicalize_nans: true,
            ..SandboxLimits::default()
        },
    );
    let (mut a, mut b) = (plain.environment("{}").unwrap(), canonical.environment("{}").unwrap());
    assert_eq!(a.reset(Some(9)).unwrap(), b.reset(Some(9)).unwrap());
    for i in 0..200 {
        let action = Action::Discrete(u32::from(i % 3 == 0));
        let step = a.step(&action).unwrap();
        assert_eq!(step, b.step(&action).unwrap());
        if step.terminated || step.truncated {
            assert_eq!(a.reset(None).unwrap(), b.reset(None).unwrap());
        }
    }
}
