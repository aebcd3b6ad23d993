//! `cargo xtask bench ppo`: wall-clock time until the shipped PPO recipes reach their target
//! return, over 10 seeds (the median and the worst, which must reach the target too), with
//! where the time goes.

use std::path::Path;

use rein_recipe::LoadedRecipe;

use crate::report::{Report, Row};

/// Stable-Baselines3 2.9 (rl-zoo CartPole-v1 hyperparameters, 8 envs) on this machine, from
/// the issue: seconds to a last-20 mean return ≥ 475 for seeds 0–2.
const SB3_CARTPOLE_SECONDS: [f64; 3] = [76.0, 107.0, 145.0];

/// Seeds each recipe is run with.
const SEEDS: u64 = 10;

pub fn run(plugin_dir: &Path) -> anyhow::Result<Report> {
    let mut report = Report::default();
    for (recipe, target_s) in [("recipes/ppo-cartpole.toml", 5.0), ("recipes/ppo-pendulum.toml", 30.0)] {
        println!("{recipe}: {SEEDS} seeds");
        let mut times = Vec::new();
        for seed in 1..=SEEDS {
            let overrides = vec![format!("seed={seed}"), "train.eval_episodes=0".to_string()];
            let loaded = LoadedRecipe::load(Path::new(recipe), &overrides)?;
            let outcome = rein_train::run_ppo(&loaded, plugin_dir, false)?;
            let t = outcome.timings;
            let total = t.total.as_secs_f64();
            let (steps, secs) = outcome.solved_at.unwrap_or((outcome.env_steps, f64::INFINITY));
            println!(
                "  seed {seed}: {} in {secs:.2} s after {steps} env steps, {:.0} steps/s | env {:.2} s, inference {:.2} s, backward {:.2} s, optimizer {:.2} s, other {:.2} s",
                if secs.is_finite() {
                    "target reached"
                } else {
                    "NOT reached"
                },
                outcome.env_steps as f64 / total,
                t.env.as_secs_f64(),
                t.inference.as_secs_f64(),
                t.backward.as_secs_f64(),
                t.optimizer.as_secs_f64(),
                total - (t.env + t.inference + t.backward + t.optimizer).as_secs_f64(),
            );
            times.push(secs);
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let worst = times[times.len() - 1];
        let baseline = recipe.contains("cartpole").then(|| {
            let mut sb3 = SB3_CARTPOLE_SECONDS.to_vec();
            sb3.sort_by(f64::total_cmp);
            ("SB3 2.9 (issue's figures, median of seeds 0-2)".to_string(), sb3[1])
        });
        report.push(Row {
            name: format!("{recipe}: median time to target (s)"),
            value: median,
            unit: "s",
            baseline,
            target: Some((format!("≤ {target_s} s"), median <= target_s)),
        });
        report.push(Row {
            name: format!("{recipe}: worst of {SEEDS} seeds (s)"),
            value: worst,
            unit: "s",
            baseline: None,
            target: Some(("every seed reaches the target".to_string(), worst.is_finite())),
        });
    }
    Ok(report)
}
