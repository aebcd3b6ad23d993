//! Blocking and clocks: a plugin that sleeps, polls or spins on the clock, in any call and in
//! any guest language, ends with `Timeout` within twice its limit; the clocks it reads are
//! virtual, so the same calls give the same results on every run.

use std::time::{Duration, Instant};

use rein_core::{Action, Environment, PluginError, PluginErrorKind, RewardFn};
use rein_plugin::{RewardPlugin, SandboxLimits};

use super::{attack, attack_fails, common, scores_good_batch};

/// One second per call: a generous limit for a loaded machine, against which "stopped within
/// twice the limit" still means stopped.
const LIMIT: Duration = Duration::from_secs(1);

fn limits() -> SandboxLimits {
    SandboxLimits {
        timeout_ms: LIMIT.as_millis() as u64,
        memory_mib: 64,
        ..SandboxLimits::default()
    }
}

fn reward(name: &str, limits: SandboxLimits) -> RewardPlugin {
    let plugin = common::load_with(&common::test_plugin_path(name), limits);
    plugin.reward("{}").expect("the hostile rewards accept an empty config")
}

/// Runs `f`, which must fail with a timeout of [`LIMIT`] in `call`, within twice the limit.
fn times_out<T: std::fmt::Debug>(call: &str, f: impl FnOnce() -> Result<T, PluginError>) {
    let start = Instant::now();
    let error = f().expect_err("the blocking call was not stopped");
    let elapsed = start.elapsed();
    assert_eq!(error.kind, PluginErrorKind::Timeout { limit: LIMIT }, "{error}");
    assert_eq!(error.call, Some(call), "{error}");
    assert!(elapsed < 2 * LIMIT, "stopped after {elapsed:?}, over twice the limit");
}

#[test]
fn sleeping_for_an_hour_in_score_times_out() {
    let mut reward = reward("hostile-reward", limits());
    times_out("score", || reward.score(&attack("sleep")));
    assert_eq!(reward.failures().timeouts, 1);
    scores_good_batch(&mut reward);
}

#[test]
fn sleeping_in_a_loop_times_out() {
    let mut reward = reward("hostile-reward", limits());
    times_out("score", || reward.score(&attack("sleep-forever")));
    scores_good_batch(&mut reward);
}

#[test]
fn spinning_on_the_clock_times_out() {
    let mut reward = reward("hostile-reward", limits());
    times_out("score", || reward.score(&attack("spin-on-clock")));
    scores_good_batch(&mut reward);
}

#[test]
fn sleeping_in_init_times_out() {
    let plugin = common::load_with(&common::test_plugin_path("hostile-reward"), limits());
    for attack in ["sleep", "sleep-forever"] {
        times_out("init", || plugin.reward(&format!(r#"{{"attack": "{attack}"}}"#)));
    }
    scores_good_batch(&mut plugin.reward("{}").unwrap());
}

#[test]
fn an_environment_sleeping_in_step_times_out() {
    let plugin = common::load_with(&common::test_plugin_path("hostile-env"), limits());
    let mut env = plugin.environment(r#"{"attack": "sleep-on-step"}"#).unwrap();
    env.reset(Some(1)).unwrap();
    times_out("step", || env.step(&Action::Discrete(0)));
    assert_eq!(env.failures().timeouts, 1);
    // The instance was replaced: a reset opens a fresh one.
    env.reset(Some(1)).unwrap();
}

/// The `clock` attack's first score: the wall clock in seconds; its `slept_ns` component: how
/// long a 5 ms sleep took on the monotonic clock.
fn clock_reading(reward: &mut RewardPlugin) -> (f64, f64) {
    let scores = reward.score(&attack("clock")).expect("reading the clock is allowed");
    let first = &scores[0][0];
    let slept = first
        .components
        .iter()
        .find(|(name, _)| name == "slept_ns")
        .map_or(f64::NAN, |c| c.1);
    (first.score.unwrap(), slept)
}

#[test]
fn clocks_are_virtual_and_the_same_on_every_run() {
    for name in ["hostile-reward", "hostile-reward-py", "hostile-reward-js"] {
        let first = clock_reading(&mut reward(name, limits()));
        let second = clock_reading(&mut reward(name, limits()));
        assert_eq!(
            first.0.to_bits(),
            second.0.to_bits(),
            "{name}: the wall clock differs between runs"
        );
        assert_eq!(
            first.1.to_bits(),
            second.1.to_bits(),
            "{name}: the monotonic clock differs"
        );
        // Virtual time starts at the Unix epoch and advances by microseconds per read.
        assert!(
            first.0 < 60.0,
            "{name}: the wall clock reads {} s after the epoch",
            first.0
        );
    }
    let (_, slept) = clock_reading(&mut reward("hostile-reward", limits()));
    assert!(
        (5e6..5.1e6).contains(&slept),
        "a 5 ms sleep moves virtual time by 5 ms (plus reads): {slept} ns"
    );
}

#[test]
fn a_real_clock_is_real_and_its_waits_still_end_at_the_deadline() {
    let real = SandboxLimits {
        real_clock: true,
        ..limits()
    };
    let mut reward = reward("hostile-reward", real);
    let (wall, slept) = clock_reading(&mut reward);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (wall - now).abs() < 60.0,
        "the real wall clock reads {wall}, the host {now}"
    );
    assert!(slept >= 5e6, "a real 5 ms sleep took {slept} ns");
    let start = Instant::now();
    times_out("score", || reward.score(&attack("sleep")));
    assert!(start.elapsed() >= LIMIT, "a real sleep ended before the deadline");
    scores_good_batch(&mut reward);
}

#[test]
fn python_and_javascript_guests_blocking_on_the_clock_time_out() {
    for (name, attacks) in [
        ("hostile-reward-py", &["sleep", "spin-on-clock"][..]),
        ("hostile-reward-js", &["spin-on-clock"][..]),
    ] {
        let mut reward = reward(name, limits());
        for attack in attacks {
            let start = Instant::now();
            let error = attack_fails(&mut reward, attack);
            assert_eq!(
                error.kind,
                PluginErrorKind::Timeout { limit: LIMIT },
                "{name} {attack}: {error}"
            );
            assert!(start.elapsed() < 2 * LIMIT, "{name} {attack}: {:?}", start.elapsed());
            scores_good_batch(&mut reward);
        }
    }
}

#[test]
fn guests_blocking_in_init_time_out() {
    for (name, attack) in [("hostile-reward-py", "sleep"), ("hostile-reward-js", "spin-on-clock")] {
        let plugin = common::load_with(&common::test_plugin_path(name), limits());
        times_out("init", || plugin.reward(&format!(r#"{{"attack": "{attack}"}}"#)));
    }
}

#[test]
fn a_javascript_timer_left_pending_does_not_hold_the_call() {
    let mut reward = reward("hostile-reward-js", limits());
    let start = Instant::now();
    let outcome = reward.score(&attack("set-timeout"));
    assert!(start.elapsed() < 2 * LIMIT, "{:?}", start.elapsed());
    // Either the call returns (the timer never runs) or the wait for it times out.
    if let Err(error) = outcome {
        assert_eq!(error.kind, PluginErrorKind::Timeout { limit: LIMIT }, "{error}");
    }
    scores_good_batch(&mut reward);
}
