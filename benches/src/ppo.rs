//! `cargo xtask bench ppo`: wall-clock time until the shipped PPO recipes reach their target
//! return, over 10 seeds (the median and the worst, which must reach the target too), with
//! where the time goes; for CartPole, Stable-Baselines3 and a CleanRL-style PyTorch PPO run on
//! the same seeds in the same invocation. Every clock starts after the environments and the
//! model exist and stops at the first update after which the last 20 finished episodes average
//! the target (the same check, at the same granularity, on all three sides).

use std::path::Path;

use rein_recipe::LoadedRecipe;

use crate::report::{Report, Row, median};

/// Seeds each recipe is run with.
const SEEDS: u64 = 10;

pub fn run(plugin_dir: &Path) -> anyhow::Result<Report> {
    let mut report = Report::default();
    // The targets: CartPole ≤ 1 s median and ≥ 10× SB3; Pendulum ≤ 2 s median.
    for (recipe, target_s) in [("recipes/ppo-cartpole.toml", 1.0), ("recipes/ppo-pendulum.toml", 2.0)] {
        println!("{recipe}: {SEEDS} seeds");
        let mut times = Vec::new();
        for seed in 1..=SEEDS {
            let overrides = vec![format!("seed={seed}"), "train.eval_episodes=0".to_string()];
            let loaded = LoadedRecipe::load(Path::new(recipe), &overrides)?;
            let outcome = rein_train::run_env(&loaded, plugin_dir, false)?;
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
        let median = median(&times).unwrap_or(f64::INFINITY);
        let worst = times.iter().copied().fold(0.0, f64::max);
        let name = format!("{recipe}: median time to target (s)");
        let target = (format!("≤ {target_s} s"), median <= target_s);
        if !recipe.contains("cartpole") {
            report.push(Row {
                name: name.clone(),
                value: median,
                unit: "s",
                baseline: None,
                target: Some(target.clone()),
            });
        }
        for peer in PEERS.iter().filter(|_| recipe.contains("cartpole")) {
            let peer_median = match peer_median(peer) {
                Ok(peer_median) => peer_median,
                Err(reason) => {
                    report.not_measured(&name, peer.0, reason);
                    continue;
                }
            };
            let target = match peer.1 == "sb3_ppo.py" {
                true => (
                    format!("≤ {target_s} s and ≥ 10× SB3"),
                    median <= target_s && 10.0 * median <= peer_median.1,
                ),
                false => target.clone(),
            };
            report.push(Row {
                name: name.clone(),
                value: median,
                unit: "s",
                baseline: Some(peer_median),
                target: Some(target),
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

/// Peers run on the same seeds (scripts in benches/peers/, with `.venv`'s Python), each
/// checking the target as rein does: once after each whole update (rollout and optimisation),
/// on the mean return of the last 20 finished training episodes. Their label and script.
const PEERS: &[(&str, &str)] = &[
    ("Stable-Baselines3 PPO, rl-zoo hyperparameters", "sb3_ppo.py"),
    ("CleanRL-style ppo.py, rein's hyperparameters", "cleanrl_ppo.py"),
];

/// Runs a peer on seeds 1..=SEEDS, prints each seed, and returns its label (with the versions
/// it reported) and its median seconds to the target; why not, when it cannot run.
fn peer_median((label, script): &(&str, &str)) -> Result<(String, f64), String> {
    println!("{label} (benches/peers/{script}): {SEEDS} seeds");
    let value = crate::peers::run(script, (1..=SEEDS).map(|s| s.to_string()))?;
    crate::peers::describe(script, &value);
    let runs = value["runs"].as_array().ok_or("its output has no `runs`")?;
    let mut times = Vec::new();
    for run in runs {
        let seconds = run["seconds"].as_f64().unwrap_or(f64::INFINITY);
        let solved = run["solved"].as_bool().unwrap_or(false);
        println!(
            "  seed {}: {} in {seconds:.2} s after {} updates, {} env steps",
            run["seed"],
            if solved { "target reached" } else { "NOT reached" },
            run["updates"],
            run["env_steps"]
        );
        times.push(if solved { seconds } else { f64::INFINITY });
    }
    if times.len() != SEEDS as usize {
        return Err(format!("{} runs reported for {SEEDS} seeds", times.len()));
    }
    let median = median(&times).unwrap_or(f64::INFINITY);
    let worst = times.iter().copied().fold(0.0, f64::max);
    println!("  median {median:.2} s, worst {worst:.2} s");
    Ok((format!("{label} ({})", crate::peers::versions(&value)), median))
}
