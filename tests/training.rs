//! End-to-end training: the shipped PPO recipes learn, runs are reproducible, run directories
//! hold what they promise.

#[path = "common/mod.rs"]
mod common;

use std::path::Path;
use std::sync::Barrier;

use rein_recipe::LoadedRecipe;

fn recipe(name: &str, overrides: &[String]) -> LoadedRecipe {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    LoadedRecipe::load(&root.join("recipes").join(name), overrides).unwrap()
}

fn plugin_dir() -> std::path::PathBuf {
    common::plugin_path("cartpole").parent().unwrap().to_path_buf()
}

fn runs_dir(tag: &str) -> String {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("runs-{tag}-{}", std::process::id()));
    format!("train.runs_dir={:?}", dir.display().to_string())
}

/// Seeds every outcome test trains with: a recipe must reach its target on each, not on one
/// lucky seed.
const SEEDS: [u64; 3] = [1, 2, 3];

#[test]
fn ppo_solves_cartpole_on_every_seed() {
    let mut eval_returns = Vec::new();
    for seed in SEEDS {
        let loaded = recipe(
            "ppo-cartpole.toml",
            &[runs_dir(&format!("cartpole-{seed}")), format!("seed={seed}")],
        );
        let outcome = rein_train::run_env(&loaded, &plugin_dir(), true).unwrap();
        let mean = outcome.mean_return.unwrap();
        assert!(mean >= 475.0, "seed {seed}: last-20 mean return {mean}");
        assert!(outcome.solved_at.is_some(), "seed {seed}");
        eval_returns.push(outcome.eval_return.unwrap());
        if seed != SEEDS[0] {
            continue;
        }
        let dir = outcome.run_dir.unwrap();
        for file in ["recipe.toml", "metrics.jsonl", "policy.safetensors"] {
            assert!(dir.join(file).is_file(), "{file} missing in {}", dir.display());
        }
        let metrics = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
        let lines: Vec<serde_json::Value> = metrics.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), outcome.updates);
        for key in [
            "global_step",
            "time/elapsed_s",
            "charts/episodic_return",
            "losses/policy_loss",
            "losses/value_loss",
            "losses/approx_kl",
            "losses/clipfrac",
            "charts/sps",
        ] {
            assert!(lines[0].get(key).is_some(), "metrics lack `{key}`");
        }
        // The saved recipe is the resolved one and loads again.
        LoadedRecipe::load(&dir.join("recipe.toml"), &[]).unwrap();
    }
    // The deterministic policy balances: 500 is the most an episode can return.
    let mean_eval = eval_returns.iter().sum::<f64>() / eval_returns.len() as f64;
    assert!(mean_eval >= 450.0, "deterministic policies return {eval_returns:?}");
}

#[test]
fn ppo_solves_pendulum_on_every_seed() {
    for seed in SEEDS {
        let loaded = recipe(
            "ppo-pendulum.toml",
            &[runs_dir(&format!("pendulum-{seed}")), format!("seed={seed}")],
        );
        let outcome = rein_train::run_env(&loaded, &plugin_dir(), false).unwrap();
        let mean = outcome.mean_return.unwrap();
        assert!(mean >= -200.0, "seed {seed}: last-20 mean return {mean}");
    }
}

/// The shipped SAC and TD3 recipes reach their target (the last 10 episodes ≥ −200) on every
/// seed, well inside their 20 000 steps.
#[test]
fn sac_and_td3_solve_pendulum_on_every_seed() {
    for file in ["sac-pendulum.toml", "td3-pendulum.toml"] {
        for seed in SEEDS {
            let overrides = [runs_dir(&format!("{file}-{seed}")), format!("seed={seed}")];
            let outcome = rein_train::run_env(&recipe(file, &overrides), &plugin_dir(), false).unwrap();
            let (steps, _) = outcome
                .solved_at
                .unwrap_or_else(|| panic!("{file}, seed {seed}: last-10 mean return {:?}", outcome.mean_return));
            assert!(
                steps <= 12_000,
                "{file}, seed {seed}: reached the target only after {steps} env steps"
            );
            let eval = outcome.eval_return.unwrap();
            assert!(
                eval >= -200.0,
                "{file}, seed {seed}: deterministic policy's return {eval}"
            );
        }
    }
}

/// Two runs with the same seed, training at the same time in two threads of one process while
/// a third run with another seed trains beside them, write the same metrics and the same
/// policy file: a run shares no random stream, and no state that changes its numbers, with
/// the others in its process (a sweep in one process, a server beside a trainer, a library
/// caller with two runs).
#[test]
fn same_seed_runs_in_one_process_are_identical_whatever_runs_beside_them() {
    let start = Barrier::new(3);
    let run = |tag: &str, seed: u64| {
        let overrides = vec![
            runs_dir(tag),
            format!("seed={seed}"),
            "train.total_steps=6144".to_string(),
            "train.stop_at_return=1000".to_string(),
            "train.eval_episodes=0".to_string(),
        ];
        let loaded = recipe("ppo-cartpole.toml", &overrides);
        start.wait();
        let outcome = rein_train::run_env(&loaded, &plugin_dir(), true).unwrap();
        let dir = outcome.run_dir.unwrap();
        let policy = std::fs::read(dir.join("policy.safetensors")).unwrap();
        (common::metrics_without_timings(&dir), policy)
    };
    let (a, b, c) = std::thread::scope(|s| {
        let a = s.spawn(|| run("same-a", 1));
        let c = s.spawn(|| run("other-c", 2));
        let b = s.spawn(|| run("same-b", 1));
        (a.join().unwrap(), b.join().unwrap(), c.join().unwrap())
    });
    assert_eq!(a.0.len(), 24);
    for (update, (x, y)) in a.0.iter().zip(&b.0).enumerate() {
        assert_eq!(x, y, "update {}: two runs of seed 1 in one process differ", update + 1);
    }
    assert!(a.1 == b.1, "the two policy.safetensors files differ");
    assert_ne!(c.0, a.0, "another seed gives another run");
}

/// PPO's default flat networks and the burn module trained through autodiff
/// (`model.autodiff = true`) take the same updates up to rounding: their first records' losses
/// agree, for the categorical (CartPole) and the Gaussian (Pendulum) head.
#[test]
fn ppo_flat_and_autodiff_runs_log_the_same_losses() {
    for (file, steps) in [("ppo-cartpole.toml", 768), ("ppo-pendulum.toml", 8192)] {
        let run = |autodiff: bool| {
            let overrides = [
                runs_dir(&format!("{file}-{autodiff}")),
                format!("model.autodiff={autodiff}"),
                format!("train.total_steps={steps}"),
                "train.eval_episodes=1".into(),
            ];
            let outcome = rein_train::run_env(&recipe(file, &overrides), &plugin_dir(), true).unwrap();
            common::metrics_without_timings(&outcome.run_dir.unwrap())
        };
        let (flat, burn) = (run(false), run(true));
        assert_eq!(flat.len(), burn.len(), "{file}");
        for (record, (ours, theirs)) in flat.iter().zip(&burn).take(2).enumerate() {
            for key in [
                "losses/policy_loss",
                "losses/value_loss",
                "losses/entropy",
                "losses/approx_kl",
            ] {
                let (a, b) = (ours[key].as_f64().unwrap(), theirs[key].as_f64().unwrap());
                let error = (a - b).abs() / b.abs().max(1e-3);
                assert!(
                    error < 1e-3,
                    "{file}, record {}: {key} flat {a} vs autodiff {b} ({error:.1e})",
                    record + 1
                );
            }
        }
    }
}

#[test]
fn a_failing_env_plugin_stops_training_with_its_error() {
    let overrides = vec![
        runs_dir("hostile"),
        format!(
            "env.plugin={:?}",
            common::test_plugin_path("hostile-env").display().to_string()
        ),
        "env.config.attack=\"loop-after-3\"".into(),
        "env.config.horizon=100".into(),
        "env.limits.timeout_ms=1000".into(),
    ];
    let err = rein_train::run_env(&recipe("ppo-cartpole.toml", &overrides), &plugin_dir(), false).unwrap_err();
    assert!(
        err.to_string()
            .contains("plugin `hostile-env` (step): exceeded its time limit of 1000 ms"),
        "{err}"
    );
}

#[test]
fn a_non_finite_loss_stops_at_its_update_and_keeps_the_checkpoints_before_it() {
    // Rewards of 1e38 from the 41st step of each environment (update 3 of 16 steps) are finite,
    // so the host passes them, but the value loss overflows.
    let runs = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("runs-nan-{}", std::process::id()));
    let overrides = vec![
        format!("train.runs_dir={:?}", runs.display().to_string()),
        format!(
            "env.plugin={:?}",
            common::test_plugin_path("hostile-env").display().to_string()
        ),
        "env.config.attack=\"huge-reward\"".into(),
        "env.config.after=40".into(),
        "env.config.horizon=10".into(),
        "env.num_envs=4".into(),
        "algorithm.num_steps=16".into(),
        "train.total_steps=640".into(),
        "train.checkpoint_every=1".into(),
    ];
    let err = rein_train::run_env(&recipe("ppo-cartpole.toml", &overrides), &plugin_dir(), true).unwrap_err();
    let rein_train::TrainError::Run(rein_run::RunError::NonFinite { step, ref what, .. }) = err else {
        panic!("expected a non-finite error, got {err}")
    };
    assert_eq!(step, 3, "{err}");
    assert!(what.contains("loss"), "{err}");
    assert!(err.to_string().starts_with("step 3: PPO loss is not finite"), "{err}");
    let run = std::fs::read_dir(&runs).unwrap().next().unwrap().unwrap().path();
    let checkpoints = rein_run::checkpoint::CheckpointDir::of_run(&run);
    let (newest, skipped) = checkpoints.latest().unwrap();
    assert!(skipped.is_empty());
    assert_eq!(newest.expect("the updates before it were checkpointed").step, 2);
}

/// SAC and TD3 refuse an environment whose actions are discrete, naming the algorithm and the
/// space, and a replay buffer larger than memory, naming the key and the size, before training.
#[test]
fn off_policy_recipes_refuse_discrete_actions_and_oversized_buffers() {
    for (file, name) in [("sac-pendulum.toml", "SAC"), ("td3-pendulum.toml", "TD3")] {
        let cartpole = recipe(file, &[runs_dir("discrete"), "env.plugin=\"cartpole\"".into()]);
        let err = rein_train::run_env(&cartpole, &plugin_dir(), false).unwrap_err();
        assert!(
            err.to_string().contains(&format!(
                "environment `cartpole`: {name} needs continuous (box) actions; this environment's action space is Discrete(2)"
            )),
            "{err}"
        );
        let huge = recipe(
            file,
            &[runs_dir("huge"), "algorithm.buffer_size=1_000_000_000_000".into()],
        );
        let err = rein_train::run_env(&huge, &plugin_dir(), false)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("`algorithm.buffer_size` = 1000000000000: a replay buffer of 1000000000000 transitions (9 floats each) needs 33527.6 GiB;"),
            "{err}"
        );
    }
}

/// A short SAC and TD3 run writes what a PPO run writes: metrics with the losses, the policy,
/// the report; two runs of one seed are identical; the burn-autodiff networks
/// (`model.autodiff = true`) log the same losses as the default flat ones, up to rounding.
#[test]
fn off_policy_runs_log_their_losses_and_reproduce() {
    let sac_losses = [
        "losses/qf1_loss",
        "losses/actor_loss",
        "losses/alpha",
        "losses/alpha_loss",
    ];
    let td3_losses = ["losses/qf1_loss", "losses/qf2_loss", "losses/actor_loss"];
    // (recipe, envs, env steps, its losses, (updates, episodes, records)): one update per
    // vector step past the 100 warm-up env steps, a record every 100 vector steps.
    for (file, envs, steps, losses, expected) in [
        ("sac-pendulum.toml", 1, 600, &sac_losses[..], (499, 3, 6)),
        ("td3-pendulum.toml", 4, 1600, &td3_losses[..], (374, 8, 4)),
    ] {
        let run = |tag: &str, autodiff: bool| {
            let overrides = [
                runs_dir(tag),
                format!("model.autodiff={autodiff}"),
                format!("env.num_envs={envs}"),
                format!("train.total_steps={steps}"),
                "algorithm.log_every=100".into(),
                "algorithm.learning_starts=100".into(),
                "algorithm.batch_size=32".into(),
                "model.hidden=[16, 16]".into(),
                "train.eval_episodes=1".into(),
            ];
            let outcome = rein_train::run_env(&recipe(file, &overrides), &plugin_dir(), true).unwrap();
            assert_eq!(
                (outcome.env_steps, outcome.updates, outcome.episodes),
                (steps, expected.0, expected.1),
                "{file}"
            );
            assert!(outcome.eval_return.is_some_and(|r| r < 0.0), "{file}");
            let dir = outcome.run_dir.unwrap();
            assert!(dir.join("policy.safetensors").is_file() && dir.join("report.md").is_file());
            common::metrics_without_timings(&dir)
        };
        let (a, b) = (run(&format!("{file}-a"), false), run(&format!("{file}-b"), false));
        assert_eq!(a.len(), expected.2, "{file}: one record per 100 vector steps");
        let last = &a[expected.2 - 1];
        for key in losses {
            assert!(
                last[*key].as_f64().is_some_and(f64::is_finite),
                "{file}: {key} in {last}"
            );
        }
        // The first record's updates: one per vector step `g` of 0..100 with `g · envs > 100`.
        let first_updates = 100usize.saturating_sub(100 / envs + 1);
        assert_eq!(a[0]["charts/updates"], first_updates as u64, "{file}");
        if first_updates == 0 {
            assert!(
                a[0].get("losses/qf1_loss").is_none(),
                "{file}: no losses before an update"
            );
        }
        assert_eq!(a, b, "{file}: two runs of one seed differ");
        // The two paths round differently, so their runs part slowly; the second record's
        // losses (100–174 updates in) still agree closely.
        let reference = run(&format!("{file}-autodiff"), true);
        for key in losses {
            let (flat, burn) = (a[1][*key].as_f64().unwrap(), reference[1][*key].as_f64().unwrap());
            let error = (flat - burn).abs() / burn.abs().max(1.0);
            assert!(
                error < 1e-3,
                "{file}: {key} flat {flat} vs autodiff {burn} ({error:.1e})"
            );
        }
    }
}

/// SAC stops at the first update whose loss overflows (rewards of 1e38, finite, from the 301st
/// step), keeping the checkpoints before it; an action box without bounds is refused, since SAC
/// squashes its actions into the box.
#[test]
fn sac_stops_at_a_non_finite_loss_and_refuses_an_unbounded_box() {
    let runs = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("runs-sac-nan-{}", std::process::id()));
    let hostile = format!(
        "env.plugin={:?}",
        common::test_plugin_path("hostile-env").display().to_string()
    );
    let overrides = |actions: &str| {
        vec![
            format!("train.runs_dir={:?}", runs.display().to_string()),
            hostile.clone(),
            format!("env.config.actions={actions:?}"),
            "env.config.attack=\"huge-reward\"".into(),
            "env.config.after=300".into(),
            "env.config.horizon=10".into(),
            "algorithm.learning_starts=100".into(),
            "algorithm.batch_size=32".into(),
            "algorithm.log_every=50".into(),
            "model.hidden=[16, 16]".into(),
            "train.total_steps=2000".into(),
            "train.stop_at_return=1e9".into(),
            "train.checkpoint_every=1".into(),
        ]
    };
    let err = rein_train::run_env(&recipe("sac-pendulum.toml", &overrides("box")), &plugin_dir(), true).unwrap_err();
    let rein_train::TrainError::Run(rein_run::RunError::NonFinite { step, .. }) = err else {
        panic!("expected a non-finite error, got {err}")
    };
    assert!(step >= 7, "the rewards are finite until the 301st step: {err}");
    assert!(
        err.to_string()
            .starts_with(&format!("step {step}: losses/qf1_loss is not finite")),
        "{err}"
    );
    let run = std::fs::read_dir(&runs).unwrap().next().unwrap().unwrap().path();
    let (newest, _) = rein_run::checkpoint::CheckpointDir::of_run(&run).latest().unwrap();
    assert_eq!(
        newest.expect("the steps before it were checkpointed").step,
        step as u64 - 1
    );

    let err = rein_train::run_env(
        &recipe("sac-pendulum.toml", &overrides("unbounded-box")),
        &plugin_dir(),
        false,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("hostile-env.wasm`: SAC squashes its actions into the action box, whose bounds must be finite"),
        "{err}"
    );
}
