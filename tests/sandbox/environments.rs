//! Environment plugins: spaces, shapes and finiteness are checked; traps are survived.

use rein_core::{Action, BatchActions, Environment, OutputError, PluginErrorKind, VecEnv};

use super::quick_limits;
use crate::common::{load_with, test_plugin_path};

/// The hostile env plugin; each test picks its attack through the env config.
fn hostile_env() -> rein_plugin::Plugin {
    load_with(&test_plugin_path("hostile-env"), quick_limits())
}

#[test]
fn a_short_observation_is_rejected() {
    let plugin = hostile_env();
    let mut env = plugin.environment(r#"{"attack": "short-obs"}"#).unwrap();
    let error = env.reset(Some(0)).unwrap_err();
    assert!(
        matches!(
            error.kind,
            PluginErrorKind::InvalidOutput(OutputError::SpaceMismatch { .. })
        ),
        "{error}"
    );
    let mut batch = plugin.vec_env(r#"{"attack": "short-obs"}"#, 3).unwrap();
    let error = batch.reset(0).unwrap_err();
    let expected = OutputError::WrongLength {
        what: "observations".into(),
        expected: 6,
        got: 3,
    };
    assert_eq!(error.kind, PluginErrorKind::InvalidOutput(expected));
}

#[test]
fn nan_observations_and_rewards_are_rejected() {
    let plugin = hostile_env();
    let mut env = plugin.environment(r#"{"attack": "nan-obs"}"#).unwrap();
    assert!(matches!(
        env.reset(Some(0)).unwrap_err().kind,
        PluginErrorKind::InvalidOutput(OutputError::NonFinite { .. })
    ));
    let mut env = plugin.environment(r#"{"attack": "nan-reward"}"#).unwrap();
    env.reset(Some(0)).unwrap();
    let error = env.step(&Action::Discrete(0)).unwrap_err();
    assert!(
        matches!(
            error.kind,
            PluginErrorKind::InvalidOutput(OutputError::NonFinite { .. })
        ),
        "{error}"
    );
    let mut batch = plugin.vec_env(r#"{"attack": "nan-reward"}"#, 2).unwrap();
    batch.reset(0).unwrap();
    let error = batch.step(&BatchActions::Discrete(vec![0, 1])).unwrap_err();
    assert_eq!(
        error.to_string(),
        "plugin `hostile-env` (step): returned a non-finite reward of env 0: NaN"
    );
}

#[test]
fn an_invalid_space_is_rejected_at_open() {
    let error = hostile_env().environment(r#"{"attack": "bad-space"}"#).unwrap_err();
    assert!(error.to_string().contains("low 1 > high 0"), "{error}");
}

#[test]
fn actions_outside_the_space_never_reach_the_plugin() {
    let mut env = hostile_env().environment("{}").unwrap();
    env.reset(Some(0)).unwrap();
    assert!(env.step(&Action::Discrete(4)).is_err());
    assert!(env.step(&Action::Continuous(vec![0.0])).is_err());
    env.step(&Action::Discrete(3)).expect("a valid action still works");
    let mut batch = hostile_env().vec_env("{}", 2).unwrap();
    batch.reset(0).unwrap();
    assert!(batch.step(&BatchActions::Discrete(vec![0])).is_err());
    assert!(batch.step(&BatchActions::Discrete(vec![0, 9])).is_err());
}

#[test]
fn stepping_an_ended_episode_is_an_error_until_reset() {
    let mut env = hostile_env().environment(r#"{"horizon": 2}"#).unwrap();
    assert!(env.step(&Action::Discrete(0)).is_err(), "step before reset");
    env.reset(Some(1)).unwrap();
    env.step(&Action::Discrete(0)).unwrap();
    assert!(env.step(&Action::Discrete(0)).unwrap().truncated);
    let error = env.step(&Action::Discrete(0)).unwrap_err();
    assert!(matches!(error.kind, PluginErrorKind::Guest { .. }), "{error}");
    env.reset(None).unwrap();
    env.step(&Action::Discrete(0)).unwrap();
}

#[test]
fn a_looping_env_is_interrupted_and_reset_recovers() {
    let plugin = hostile_env();
    let mut env = plugin
        .environment(r#"{"attack": "loop-after-3", "horizon": 100}"#)
        .unwrap();
    env.reset(Some(0)).unwrap();
    for _ in 0..3 {
        env.step(&Action::Discrete(0)).unwrap();
    }
    let error = env.step(&Action::Discrete(0)).unwrap_err();
    assert!(matches!(error.kind, PluginErrorKind::Timeout { .. }), "{error}");
    let error = env.step(&Action::Discrete(0)).unwrap_err();
    assert!(error.to_string().contains("call reset"), "{error}");
    env.reset(Some(0)).expect("reset opens a fresh instance");
    env.step(&Action::Discrete(0)).expect("the fresh instance steps");

    let mut batch = plugin
        .vec_env(r#"{"attack": "loop-after-3", "horizon": 100}"#, 4)
        .unwrap();
    batch.reset(0).unwrap();
    for _ in 0..3 {
        batch.step(&BatchActions::Discrete(vec![0; 4])).unwrap();
    }
    assert!(matches!(
        batch.step(&BatchActions::Discrete(vec![0; 4])).unwrap_err().kind,
        PluginErrorKind::Timeout { .. }
    ));
    assert_eq!(batch.reset(0).expect("reset after the trap").len(), 8);
}
