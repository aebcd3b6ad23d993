//! `cargo xtask bench ppo`: wall-clock time until the shipped PPO recipes reach their target
//! return, over 10 seeds (the median and the worst, which must reach the target too), with
//! where the time goes; for CartPole, Stable-Baselines3 and a CleanRL-style PyTorch PPO run on
//! the same seeds in the same invocation. Every clock starts after the environments and the
//! model exist and stops when the last 20 episodes average the target.

use std::path::Path;

use rein_recipe::LoadedRecipe;

use crate::report::{Report, Row};

/// Seeds each recipe is run with.
const SEEDS: u64 = 10;

pub fn run(plugin_dir: &Path) -> anyhow::Result<Report> {
    let mut report = Report::default();
    // Issue 14's targets: CartPole ≤ 1 s median and ≥ 10× SB3; Pendulum ≤ 2 s median.
    for (recipe, target_s) in [("recipes/ppo-cartpole.toml", 1.0), ("recipes/ppo-pendulum.toml", 2.0)] {
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
        let peers = match recipe.contains("cartpole") {
            true => PEERS.iter().filter_map(peer_median).collect(),
            false => Vec::new(),
        };
        let target = Some((format!("≤ {target_s} s"), median <= target_s));
        if peers.is_empty() {
            report.push(Row {
                name: format!("{recipe}: median time to target (s)"),
                value: median,
                unit: "s",
                baseline: None,
                target: target.clone(),
            });
        }
        for (label, peer_median) in peers {
            let target = match label.starts_with("Stable-Baselines3") {
                true => Some((
                    format!("≤ {target_s} s and ≥ 10× SB3"),
                    median <= target_s && 10.0 * median <= peer_median,
                )),
                false => target.clone(),
            };
            report.push(Row {
                name: format!("{recipe}: median time to target (s)"),
                value: median,
                unit: "s",
                baseline: Some((label, peer_median)),
                target,
            });
        }
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

/// Peers run on the same seeds (scripts in benches/peers/, with `.venv`'s Python): the label
/// and the script.
const PEERS: &[(&str, &str)] = &[
    ("Stable-Baselines3 PPO, rl-zoo hyperparameters", "sb3_ppo.py"),
    ("CleanRL-style ppo.py, rein's hyperparameters", "cleanrl_ppo.py"),
];

/// Runs a peer on seeds 1..=SEEDS, prints each seed, and returns its label (with the versions
/// it reported) and its median seconds to the target; `None` when it cannot run.
fn peer_median((label, script): &(&str, &str)) -> Option<(String, f64)> {
    println!("{label} (benches/peers/{script}): {SEEDS} seeds");
    let stdout = crate::peers::run(script, (1..=SEEDS).map(|s| s.to_string()))?;
    let mut versions = String::new();
    let mut times = Vec::new();
    for line in stdout.lines() {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if let Some(v) = value.get("versions").and_then(|v| v.as_object()) {
            versions = v
                .iter()
                .map(|(k, v)| format!("{k} {}", v.as_str().unwrap_or("?")))
                .collect::<Vec<_>>()
                .join(", ");
            continue;
        }
        let seconds = value["seconds"].as_f64().unwrap_or(f64::INFINITY);
        let solved = value["solved"].as_bool().unwrap_or(false);
        println!(
            "  seed {}: {} in {seconds:.2} s after {} env steps",
            value["seed"],
            if solved { "target reached" } else { "NOT reached" },
            value["steps"]
        );
        times.push(if solved { seconds } else { f64::INFINITY });
    }
    if times.is_empty() {
        return None;
    }
    times.sort_by(f64::total_cmp);
    let worst = times[times.len() - 1];
    println!("  median {:.2} s, worst {worst:.2} s", times[times.len() / 2]);
    Some((format!("{label} ({versions})"), times[times.len() / 2]))
}
