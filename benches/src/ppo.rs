//! `cargo xtask bench ppo`: wall-clock time until the shipped PPO recipes reach their target
//! return, over 10 seeds (the median and the worst, which must reach the target too), with
//! where the time goes; rein's burn module through autodiff (`model.autodiff = true`) and, for
//! CartPole, Stable-Baselines3 and a CleanRL-style PyTorch PPO run on the same seeds in the same
//! invocation. Every clock starts after the environments and the
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
        let (times, env_steps) = rein_seeds(recipe, SEEDS, &[], plugin_dir)?;
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
        let (autodiff_times, _) = rein_seeds(recipe, SEEDS, &["model.autodiff=true"], plugin_dir)?;
        let autodiff_median = crate::report::median(&autodiff_times).unwrap_or(f64::INFINITY);
        report.push(Row {
            name: format!("{recipe}: median time to target, flat networks (s)"),
            value: median,
            unit: "s",
            baseline: Some((
                "rein, burn module through autodiff (model.autodiff = true)".to_string(),
                autodiff_median,
            )),
            target: None,
        });
        for peer in PEERS.iter().filter(|_| recipe.contains("cartpole")) {
            let peer = match peer_median(peer.0, peer.1, &[], SEEDS) {
                Ok(peer) => peer,
                Err(reason) => {
                    report.not_measured(&name, peer.0, reason);
                    continue;
                }
            };
            let sb3 = peer.label.starts_with("Stable-Baselines3");
            let target = match sb3 {
                true => (
                    format!("≤ {target_s} s and ≥ 10× SB3"),
                    median <= target_s && 10.0 * median <= peer.seconds,
                ),
                false => target.clone(),
            };
            report.push(Row {
                name: name.clone(),
                value: median,
                unit: "s",
                baseline: Some((peer.label.clone(), peer.seconds)),
                target: Some(target),
            });
            let steps = crate::report::median(&env_steps).unwrap_or(f64::INFINITY);
            report.push(Row {
                name: format!("{recipe}: median env steps to target"),
                value: steps,
                unit: "env steps",
                baseline: Some((peer.label, peer.env_steps)),
                target: sb3.then(|| ("≤ 1.5× SB3's".to_string(), steps <= 1.5 * peer.env_steps)),
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

/// Times rein on `recipe` for seeds 1..=`seeds`, printing each: seconds to the target
/// (infinite where it was not reached) and env steps to it (all of them where not), per seed.
pub fn rein_seeds(recipe: &str, seeds: u64, extra: &[&str], plugin_dir: &Path) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    println!("{recipe} {}: {seeds} seeds", extra.join(" "));
    let (mut times, mut env_steps) = (Vec::new(), Vec::new());
    for seed in 1..=seeds {
        let mut overrides = vec![format!("seed={seed}"), "train.eval_episodes=0".to_string()];
        overrides.extend(extra.iter().map(|o| o.to_string()));
        let loaded = LoadedRecipe::load(Path::new(recipe), &overrides)?;
        let outcome = rein_train::run_env(&loaded, plugin_dir, false)?;
        let t = outcome.timings;
        let total = t.total.as_secs_f64();
        let (steps, secs) = outcome.solved_at.unwrap_or((outcome.env_steps, f64::INFINITY));
        println!(
            "  seed {seed}: {} in {secs:.2} s after {steps} env steps, {} updates, {:.0} steps/s | env {:.2} s, inference {:.2} s, backward {:.2} s, optimizer {:.2} s, other {:.2} s",
            if secs.is_finite() {
                "target reached"
            } else {
                "NOT reached"
            },
            outcome.updates,
            outcome.env_steps as f64 / total,
            t.env.as_secs_f64(),
            t.inference.as_secs_f64(),
            t.backward.as_secs_f64(),
            t.optimizer.as_secs_f64(),
            total - (t.env + t.inference + t.backward + t.optimizer).as_secs_f64(),
        );
        times.push(secs);
        env_steps.push(steps as f64);
    }
    Ok((times, env_steps))
}

/// What a peer measured over its seeds.
pub struct PeerMedians {
    /// Its label, with the versions it reported.
    pub label: String,
    /// Median seconds to the target (infinite when most seeds missed it).
    pub seconds: f64,
    /// Median env steps to the target (all of them where it was missed).
    pub env_steps: f64,
}

/// Runs peer `script` (with `args` before the seeds) on seeds 1..=`seeds`, prints each seed,
/// and returns its medians; why not, when it cannot run.
pub fn peer_median(label: &str, script: &str, args: &[&str], seeds: u64) -> Result<PeerMedians, String> {
    println!("{label} (benches/peers/{script} {}): {seeds} seeds", args.join(" "));
    let arguments = args
        .iter()
        .map(|a| a.to_string())
        .chain((1..=seeds).map(|s| s.to_string()));
    let value = crate::peers::run(script, arguments)?;
    crate::peers::describe(script, &value);
    let runs = value["runs"].as_array().ok_or("its output has no `runs`")?;
    let (mut times, mut env_steps) = (Vec::new(), Vec::new());
    for run in runs {
        let seconds = run["seconds"].as_f64().unwrap_or(f64::INFINITY);
        let solved = run["solved"].as_bool().unwrap_or(false);
        let updates = run.get("updates").map(|u| format!("{u} updates, ")).unwrap_or_default();
        println!(
            "  seed {}: {} in {seconds:.2} s after {updates}{} env steps",
            run["seed"],
            if solved { "target reached" } else { "NOT reached" },
            run["env_steps"]
        );
        times.push(if solved { seconds } else { f64::INFINITY });
        env_steps.push(run["env_steps"].as_f64().unwrap_or(f64::INFINITY));
    }
    if times.len() != seeds as usize {
        return Err(format!("{} runs reported for {seeds} seeds", times.len()));
    }
    let median = median(&times).unwrap_or(f64::INFINITY);
    let worst = times.iter().copied().fold(0.0, f64::max);
    println!("  median {median:.2} s, worst {worst:.2} s");
    Ok(PeerMedians {
        label: format!("{label} ({})", crate::peers::versions(&value)),
        seconds: median,
        env_steps: crate::report::median(&env_steps).unwrap_or(f64::INFINITY),
    })
}
