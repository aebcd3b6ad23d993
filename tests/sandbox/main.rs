//! Adversarial plugins against the sandbox: one module per mechanism. Every test asserts the
//! *kind* of failure, then shows the same host (and, for rewards, the same `RewardPlugin`)
//! still scores a good batch correctly afterwards.

#[path = "../common/mod.rs"]
mod common;

mod clocks;
mod code_tests;
mod environments;
mod guests;
mod images;
mod judge;
mod limits;
mod loading;
mod outputs;
mod tools;

use std::time::Duration;

use rein_core::{Group, PluginError, PluginErrorKind, RewardFn};
use rein_plugin::{RewardPlugin, SandboxLimits};

/// The deadline of [`quick_limits`]: short enough that the attacks which must hit it end soon,
/// long enough that a legitimate call (re-instantiating a Python guest after a trap, scoring
/// a batch) keeps a wide margin on a loaded 2-core machine.
pub const QUICK_TIMEOUT: Duration = Duration::from_secs(1);

/// Limits that make the attacks quick to run: [`QUICK_TIMEOUT`] per call, 64 MiB.
pub fn quick_limits() -> SandboxLimits {
    SandboxLimits {
        timeout_ms: QUICK_TIMEOUT.as_millis() as u64,
        memory_mib: 64,
        ..SandboxLimits::default()
    }
}

/// The hostile reward plugin under `limits`.
pub fn hostile(limits: SandboxLimits) -> RewardPlugin {
    let plugin = common::load_with(&common::test_plugin_path("hostile-reward"), limits);
    plugin.reward("{}").expect("hostile-reward accepts an empty config")
}

/// A group that asks the hostile plugin to run `attack`.
pub fn attack(attack: &str) -> Vec<Group> {
    vec![Group {
        prompt: "attack".into(),
        completions: vec!["a".into(), "b".into()],
        reference: Some("a".into()),
        metadata: format!(r#"{{"attack": "{attack}"}}"#),
        tokens: Vec::new(),
        images: Vec::new(),
    }]
}

/// Runs `attack` in `reward` (any of the hostile rewards) and returns the error it must
/// produce, which names the plugin and the call.
pub fn attack_fails(reward: &mut RewardPlugin, name: &str) -> PluginError {
    match reward.score(&attack(name)) {
        Ok(scores) => panic!("attack `{name}` on {} was not stopped: {scores:?}", reward.name()),
        Err(e) => {
            assert_eq!(e.plugin, reward.name());
            assert_eq!(e.call, Some("score"));
            e
        }
    }
}

/// Scores a good batch and checks the result: the instance (or its replacement) works.
pub fn scores_good_batch(reward: &mut RewardPlugin) {
    let groups = vec![
        Group {
            prompt: "p".into(),
            completions: vec!["x".into(), "y".into(), "x".into()],
            reference: Some("x".into()),
            ..Group::default()
        },
        Group {
            prompt: "q".into(),
            completions: vec!["z".into()],
            reference: Some("w".into()),
            ..Group::default()
        },
    ];
    let scores = reward.score(&groups).expect("a good batch scores after the attack");
    let values: Vec<Vec<Option<f64>>> = scores.iter().map(|g| g.iter().map(|s| s.score).collect()).collect();
    assert_eq!(values, vec![vec![Some(1.0), Some(0.0), Some(1.0)], vec![Some(0.0)]]);
}

/// Whether `kind` is the given variant (by discriminant).
pub fn is_kind(error: &PluginError, expected: &PluginErrorKind) -> bool {
    std::mem::discriminant(&error.kind) == std::mem::discriminant(expected)
}
