//! The `cartpole` and `pendulum` plugins against Gymnasium, and batched stepping against
//! stepping each env alone.
//!
//! Fixtures: `tests/fixtures/*_gymnasium.json`, written by `tests/fixtures/gen_gymnasium.py`
//! (Gymnasium 1.4.0) from fixed initial states and action sequences.

#[path = "common/mod.rs"]
mod common;

use proptest::prelude::*;
use rein_core::{Action, BatchActions, Environment, Observation, VecEnv};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    episodes: Vec<Episode>,
}

#[derive(Deserialize)]
struct Episode {
    initial_state: Vec<f64>,
    steps: Vec<FixtureStep>,
}

#[derive(Deserialize)]
struct FixtureStep {
    action: serde_json::Value,
    observation: Vec<f32>,
    reward: f64,
    terminated: bool,
    truncated: bool,
}

fn fixture(name: &str) -> Fixture {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn action(value: &serde_json::Value) -> Action {
    match value {
        serde_json::Value::Array(v) => Action::Continuous(v.iter().map(|x| x.as_f64().unwrap() as f32).collect()),
        v => Action::Discrete(v.as_u64().unwrap() as u32),
    }
}

/// Replays every fixture episode from its initial state and compares step by step.
fn matches_gymnasium(plugin: &str, fixture_name: &str) {
    let plugin = common::load(plugin);
    for (e, episode) in fixture(fixture_name).episodes.iter().enumerate() {
        let config = serde_json::json!({ "initial_state": episode.initial_state }).to_string();
        let mut env = plugin.environment(&config).unwrap();
        env.reset(Some(0)).unwrap();
        for (t, expected) in episode.steps.iter().enumerate() {
            let step = env.step(&action(&expected.action)).unwrap();
            let Observation::Vector(obs) = &step.observation else {
                panic!("vector observations")
            };
            for (got, want) in obs.iter().zip(&expected.observation) {
                assert!(
                    (got - want).abs() <= 1e-6,
                    "episode {e}, step {}: observation {obs:?} vs {:?}",
                    t + 1,
                    expected.observation
                );
            }
            assert!(
                (step.reward - expected.reward).abs() <= 1e-9,
                "episode {e}, step {}: reward {} vs {}",
                t + 1,
                step.reward,
                expected.reward
            );
            assert_eq!(
                (step.terminated, step.truncated),
                (expected.terminated, expected.truncated),
                "episode {e}, step {}",
                t + 1
            );
        }
        // The fixture episode ended on its last step, so must ours.
        let last = episode.steps.last().unwrap();
        assert!(last.terminated || last.truncated);
    }
}

#[test]
fn cartpole_matches_gymnasium_step_for_step() {
    matches_gymnasium("cartpole", "cartpole_gymnasium.json");
}

#[test]
fn pendulum_matches_gymnasium_step_for_step() {
    matches_gymnasium("pendulum", "pendulum_gymnasium.json");
}

#[test]
fn the_fixtures_cover_termination_and_truncation() {
    let cartpole = fixture("cartpole_gymnasium.json");
    let ends = |f: &Fixture, pick: fn(&FixtureStep) -> bool| {
        f.episodes.iter().filter(|e| pick(e.steps.last().unwrap())).count()
    };
    assert!(ends(&cartpole, |s| s.terminated) >= 3);
    assert!(ends(&cartpole, |s| s.truncated && s.observation.len() == 4) >= 1);
    assert!(cartpole.episodes.iter().any(|e| e.steps.len() == 500));
    assert!(
        fixture("pendulum_gymnasium.json")
            .episodes
            .iter()
            .all(|e| e.steps.len() == 200)
    );
}

/// Steps `n` envs as a batch and as `n` single envs with the same seeds and actions; the
/// batch must report the same rewards, flags and observations, and auto-reset ended envs.
fn batched_equals_single(plugin_name: &str, n: usize, seed: u64, actions: &[Vec<f32>], discrete: bool) {
    let plugin = common::load(plugin_name);
    let mut batch = plugin.vec_env("{}", n).unwrap();
    let mut singles: Vec<_> = (0..n).map(|_| plugin.environment("{}").unwrap()).collect();
    let obs_dim = batch.spec().observation.flat_dim();
    let mut expected_obs = Vec::new();
    for (i, env) in singles.iter_mut().enumerate() {
        let Observation::Vector(v) = env.reset(Some(seed + i as u64)).unwrap() else {
            unreachable!()
        };
        expected_obs.extend(v);
    }
    assert_eq!(batch.reset(seed).unwrap(), expected_obs);
    for row in actions {
        let row = &row[..n];
        let batch_actions = if discrete {
            BatchActions::Discrete(row.iter().map(|a| *a as u32).collect())
        } else {
            BatchActions::Continuous(row.to_vec())
        };
        let step = batch.step(&batch_actions).unwrap();
        let mut expected_final = Vec::new();
        for (i, env) in singles.iter_mut().enumerate() {
            let action = if discrete {
                Action::Discrete(row[i] as u32)
            } else {
                Action::Continuous(vec![row[i]])
            };
            let single = env.step(&action).unwrap();
            assert_eq!(step.rewards[i], single.reward);
            assert_eq!(
                (step.terminated[i], step.truncated[i]),
                (single.terminated, single.truncated)
            );
            let Observation::Vector(obs) = single.observation else {
                unreachable!()
            };
            let observed = if single.terminated || single.truncated {
                expected_final.extend(obs);
                let Observation::Vector(fresh) = env.reset(None).unwrap() else {
                    unreachable!()
                };
                fresh
            } else {
                obs
            };
            assert_eq!(
                &step.observations[i * obs_dim..(i + 1) * obs_dim],
                observed.as_slice(),
                "env {i}"
            );
        }
        assert_eq!(step.final_observations, expected_final);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn batched_cartpole_equals_stepping_each_env_alone(
        n in 1usize..6,
        seed in 0u64..1000,
        actions in prop::collection::vec(prop::collection::vec(0u32..2, 6), 1..120),
    ) {
        let rows: Vec<Vec<f32>> = actions.iter().map(|r| r.iter().map(|&a| a as f32).collect()).collect();
        batched_equals_single("cartpole", n, seed, &rows, true);
    }

    #[test]
    fn batched_pendulum_equals_stepping_each_env_alone(
        n in 1usize..5,
        seed in 0u64..1000,
        actions in prop::collection::vec(prop::collection::vec(-3.0f32..3.0, 5), 190..230),
    ) {
        batched_equals_single("pendulum", n, seed, &actions, false);
    }
}
