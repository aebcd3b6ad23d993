//! `cargo xtask bench sac` / `bench td3`: wall-clock time until the shipped SAC or TD3 recipe
//! on Pendulum reaches its target return (the last 10 episodes averaging ≥ −200), over seeds
//! (`SEEDS`, or `REIN_BENCH_SEEDS`), with where the time goes; Stable-Baselines3's SAC or TD3 on
//! the same seeds in the same invocation, twice: at rl-zoo's Pendulum settings (what its users
//! run) and at the recipe's settings (the same networks, buffer, batch, warm-up and learning
//! rates). Every clock starts after the environments and the networks exist and stops at the
//! first environment step after which the target holds (the same check on both sides). rein's
//! own reference path, its burn modules through autodiff (`model.autodiff = true`), runs the
//! same seeds beside the default flat networks.

use std::path::Path;

use crate::ppo::{peer_median, rein_seeds};
use crate::report::{Report, Row, median};

/// Seeds each side is run with, unless `REIN_BENCH_SEEDS` says otherwise.
const SEEDS: u64 = 10;

/// The targets: a median ≤ 3 s, ≥ 10× SB3 at its own settings, and env steps to the target
/// within 1.5× of SB3's.
const TARGET_S: f64 = 3.0;

pub fn run(algorithm: &str, plugin_dir: &Path) -> anyhow::Result<Report> {
    let seeds = std::env::var("REIN_BENCH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n: &u64| n > 0)
        .unwrap_or(SEEDS);
    let recipe = format!("recipes/{algorithm}-pendulum.toml");
    let (times, steps) = rein_seeds(&recipe, seeds, &[], plugin_dir)?;
    let (autodiff_times, _) = rein_seeds(&recipe, seeds, &["model.autodiff=true"], plugin_dir)?;
    let (median_s, median_steps) = (
        median(&times).unwrap_or(f64::INFINITY),
        median(&steps).unwrap_or(f64::INFINITY),
    );
    let worst = times.iter().copied().fold(0.0, f64::max);
    let mut report = Report::default();
    let name = format!("{recipe}: median time to target (s)");
    let label = |settings: &str| format!("Stable-Baselines3 {}, {settings}", algorithm.to_uppercase());
    for (settings, description) in [("zoo", "rl-zoo's Pendulum settings"), ("rein", "the recipe's settings")] {
        let peer = match peer_median(
            &label(description),
            "sb3_off_policy.py",
            &[algorithm, "--settings", settings],
            seeds,
        ) {
            Ok(peer) => peer,
            Err(reason) => {
                report.not_measured(&name, label(description), reason);
                continue;
            }
        };
        let target = match settings {
            "zoo" => (
                format!("≤ {TARGET_S} s and ≥ 10× SB3"),
                median_s <= TARGET_S && 10.0 * median_s <= peer.seconds,
            ),
            _ => (format!("≤ {TARGET_S} s"), median_s <= TARGET_S),
        };
        report.push(Row {
            name: name.clone(),
            value: median_s,
            unit: "s",
            baseline: Some((peer.label.clone(), peer.seconds)),
            target: Some(target),
        });
        report.push(Row {
            name: format!("{recipe}: median env steps to target"),
            value: median_steps,
            unit: "env steps",
            baseline: Some((peer.label, peer.env_steps)),
            target: Some(("≤ 1.5× the peer's".to_string(), median_steps <= 1.5 * peer.env_steps)),
        });
    }
    report.push(Row {
        name: format!("{recipe}: median time to target, flat networks (s)"),
        value: median_s,
        unit: "s",
        baseline: Some((
            "rein, burn modules through autodiff (model.autodiff = true)".to_string(),
            median(&autodiff_times).unwrap_or(f64::INFINITY),
        )),
        target: None,
    });
    report.push(Row {
        name: format!("{recipe}: worst of {seeds} seeds (s)"),
        value: worst,
        unit: "s",
        baseline: None,
        target: Some(("every seed reaches the target".to_string(), worst.is_finite())),
    });
    Ok(report)
}
