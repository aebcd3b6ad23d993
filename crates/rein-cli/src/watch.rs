//! `rein watch RUN_DIR`: a run at a glance in the terminal, refreshed as it writes — whether it
//! is running, finished or stopped, its stage, step, speed and ETA, the phase the watchdog last
//! saw, each metric's last value with a sparkline of its recent steps, and the last sampled
//! completions with their rewards. Plain text and ANSI screen clearing, so it works over SSH
//! and in any terminal; it only reads the run directory (`metrics.jsonl`, `status.json`,
//! `recipe.toml`, `report.md`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde_json::Value;

#[derive(Args, Debug)]
pub(crate) struct WatchArgs {
    /// A run directory (`runs/<recipe>-<timestamp>`).
    run_dir: PathBuf,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Print the view once and exit.
    #[arg(long)]
    once: bool,
}

impl WatchArgs {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.run_dir.join("recipe.toml").is_file(),
            "{} is not a run directory (no recipe.toml)",
            self.run_dir.display()
        );
        anyhow::ensure!(
            self.interval > 0.0 && self.interval.is_finite(),
            "--interval must be a positive number of seconds"
        );
        let width = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(100);
        if self.once {
            print!("{}", view(&self.run_dir, width));
            return Ok(());
        }
        loop {
            // Home, clear the screen, then the view.
            print!("\x1b[H\x1b[2J{}", view(&self.run_dir, width));
            std::io::Write::flush(&mut std::io::stdout())?;
            std::thread::sleep(Duration::from_secs_f64(self.interval));
        }
    }
}

/// Keys that place a record rather than measure something.
const POSITION_KEYS: [&str; 6] = ["stage", "when", "step", "update", "global_step", "samples"];
const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
/// Seconds without a heartbeat after which a run whose process cannot be checked is called
/// stopped (the watchdog writes `status.json` at least every second during steps).
const STALE_S: f64 = 15.0;

/// The whole view of `run` for a terminal `width` columns wide.
pub(crate) fn view(run: &Path, width: usize) -> String {
    let records: Vec<Value> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let status: Option<Value> =
        (std::fs::read_to_string(run.join("status.json")).ok()).and_then(|text| serde_json::from_str(&text).ok());
    let recipe: toml::Table = (std::fs::read_to_string(run.join("recipe.toml")).ok())
        .and_then(|text| text.parse().ok())
        .unwrap_or_default();
    let mut out = vec![format!("rein watch · {}", run.display()), state(run, status.as_ref())];
    let training: Vec<&Value> = records.iter().filter(|r| r["stage"] != "eval").collect();
    let Some(last) = training.last() else {
        out.push("no steps logged yet".into());
        return finish(out, width);
    };
    let stage = last["stage"].as_str();
    let steps: Vec<&Value> = training
        .iter()
        .copied()
        .filter(|r| r["stage"].as_str() == stage)
        .collect();
    out.push(progress(&steps, stage, &recipe, status.as_ref()));
    out.push(String::new());
    out.extend(metrics(&steps, width));
    let evals: Vec<String> = (records.iter().filter(|r| r["stage"] == "eval"))
        .filter_map(|r| {
            let accuracy = r["eval/greedy_accuracy"]
                .as_f64()
                .or(r["eval/pairwise_accuracy"].as_f64())?;
            Some(format!(
                "{} {:.1}%",
                r["when"].as_str().unwrap_or("eval"),
                100.0 * accuracy
            ))
        })
        .collect();
    if !evals.is_empty() {
        out.push(String::new());
        out.push(format!("held-out accuracy: {}", evals.join(", ")));
    }
    if let Some(samples) = (steps.iter().rev()).find_map(|r| r["samples"].as_array().filter(|s| !s.is_empty())) {
        out.push(String::new());
        out.push("last samples:".into());
        for sample in samples {
            out.push(format!("  {}", one_line(sample["prompt"].as_str().unwrap_or(""))));
            out.push(format!(
                "    → {}   reward {}",
                one_line(sample["completion"].as_str().unwrap_or("")),
                sample["reward"].as_f64().map_or("?".into(), |r| format!("{r:.3}"))
            ));
        }
    }
    finish(out, width)
}

/// Whether the run is running, finished or stopped.
fn state(run: &Path, status: Option<&Value>) -> String {
    if run.join("report.md").is_file() {
        return "finished (report.md written)".into();
    }
    let Some(status) = status else {
        return "starting (no status yet)".into();
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let age = now - status["written_unix_s"].as_f64().unwrap_or(0.0);
    let pid = status["pid"].as_u64().unwrap_or(0);
    let proc = Path::new("/proc");
    let alive = match proc.is_dir() {
        true => proc.join(pid.to_string()).is_dir(),
        false => age < STALE_S,
    };
    match (alive, age < STALE_S) {
        (true, true) => format!("running (pid {pid})"),
        (true, false) => format!("running (pid {pid}; no step for {age:.0} s: evaluating between stages, or busy)"),
        (false, _) => format!(
            "stopped: process {pid} ended without a report (crashed or killed); `rein run RECIPE --resume {}` continues it",
            run.display()
        ),
    }
}

/// Stage, step of total, speed, ETA and the phase the watchdog last saw.
fn progress(steps: &[&Value], stage: Option<&str>, recipe: &toml::Table, status: Option<&Value>) -> String {
    let last = steps.last().copied().unwrap_or(&Value::Null);
    let step = ["step", "update"].iter().find_map(|k| last[k].as_u64()).unwrap_or(0);
    let total = total_steps(recipe, stage, last);
    let recent: Vec<f64> = (steps.iter().rev().take(10))
        .filter_map(|r| r["time/step_s"].as_f64())
        .collect();
    let per_step = recent.iter().sum::<f64>() / recent.len().max(1) as f64;
    let mut parts = vec![format!("stage {}", stage.unwrap_or("train"))];
    parts.push(match total {
        Some(total) => format!("step {step}/{total}"),
        None => format!("step {step}"),
    });
    if per_step > 0.0 {
        parts.push(format!("{per_step:.2} s/step"));
        if let Some(total) = total.filter(|&t| t > step) {
            parts.push(format!("ETA {}", duration((total - step) as f64 * per_step)));
        }
    }
    if let Some(status) = status.filter(|s| s["stage"].as_str() == stage) {
        parts.push(format!(
            "phase {} for {:.1} s ({})",
            status["phase"].as_str().unwrap_or("?"),
            status["phase_s"].as_f64().unwrap_or(0.0),
            status["waiting_on"].as_str().unwrap_or("")
        ));
    }
    parts.join(" · ")
}

/// The stage's steps as the recipe sets them (PPO on environments: its updates).
fn total_steps(recipe: &toml::Table, stage: Option<&str>, last: &Value) -> Option<u64> {
    let int = |section: &str, key: &str| recipe.get(section)?.get(key)?.as_integer().map(|n| n as u64);
    match stage {
        Some("sft") if recipe.get("sft").is_some() => int("sft", "steps"),
        Some(_) => int("algorithm", "steps"),
        None if last.get("update").is_some() => {
            let per_update = int("env", "num_envs")? * int("algorithm", "num_steps")?;
            Some(int("train", "total_steps")?.div_ceil(per_update.max(1)))
        }
        None => int("algorithm", "steps"),
    }
}

/// Each numeric metric of the stage's last step with a sparkline of its recent steps.
fn metrics(steps: &[&Value], width: usize) -> Vec<String> {
    let Some(last) = steps.last().and_then(|r| r.as_object()) else {
        return Vec::new();
    };
    let name_width = 34;
    let spark = width.saturating_sub(name_width + 14).clamp(8, 60);
    let mut lines = vec![format!("{:<name_width$} {:>11}  last {spark} steps", "metric", "value")];
    for (key, value) in last {
        let Some(value) = value.as_f64() else { continue };
        if POSITION_KEYS.contains(&key.as_str()) || key.starts_with("time/") || key.starts_with("plugins/") {
            continue;
        }
        let series: Vec<f64> = (steps.iter().rev().take(spark).rev())
            .map(|r| r[key].as_f64().unwrap_or(f64::NAN))
            .collect();
        lines.push(format!(
            "{key:<name_width$} {:>11}  {}",
            short(value),
            sparkline(&series)
        ));
    }
    lines
}

/// `values` as bars between their lowest and highest (a constant series is a flat middle line;
/// missing values are blanks).
pub(crate) fn sparkline(values: &[f64]) -> String {
    let finite = values.iter().copied().filter(|v| v.is_finite());
    let (low, high) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| (l.min(v), h.max(v)));
    values
        .iter()
        .map(|&v| match (v.is_finite(), high > low) {
            (false, _) => ' ',
            (true, false) => BARS[3],
            (true, true) => BARS[(((v - low) / (high - low)) * 7.0).round() as usize],
        })
        .collect()
}

/// A number in at most 11 characters.
fn short(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e9 {
        format!("{value:.0}")
    } else if (1e-3..1e5).contains(&value.abs()) {
        format!("{value:.4}")
    } else {
        format!("{value:.3e}")
    }
}

fn duration(seconds: f64) -> String {
    match seconds {
        s if s < 120.0 => format!("{s:.0} s"),
        s if s < 7200.0 => format!("{:.0} min", s / 60.0),
        s => format!("{:.1} h", s / 3600.0),
    }
}

/// Newlines shown as `⏎`, so a completion stays on its line.
fn one_line(text: &str) -> String {
    text.trim().replace('\n', " ⏎ ")
}

/// The lines, each cut to `width` characters, ending in a newline.
fn finish(lines: Vec<String>, width: usize) -> String {
    lines
        .into_iter()
        .map(|line| line.chars().take(width).collect::<String>() + "\n")
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparklines_span_their_values() {
        assert_eq!(sparkline(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]), "▁▂▃▄▅▆▇█");
        assert_eq!(sparkline(&[3e-5; 4]), "▄▄▄▄");
        assert_eq!(sparkline(&[1.0, f64::NAN, 2.0]), "▁ █");
    }

    #[test]
    fn a_run_without_a_report_whose_process_is_gone_is_stopped() {
        let run = std::env::temp_dir().join(format!("rein-watch-{}", std::process::id()));
        std::fs::create_dir_all(&run).unwrap();
        std::fs::write(run.join("recipe.toml"), "[algorithm]\nname = \"grpo\"\nsteps = 10\n").unwrap();
        let line = |step: u64| {
            serde_json::json!({"step": step, "stage": "grpo", "train/reward": step as f64 / 10.0, "time/step_s": 2.0,
                "samples": [{"prompt": "What is 2 + 2?", "completion": "<answer>4</answer>", "reward": 1.0}]})
            .to_string()
        };
        let lines: Vec<String> = (1..=4).map(line).collect();
        std::fs::write(run.join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
        // No process has this id (above Linux's pid_max).
        std::fs::write(run.join("status.json"), r#"{"stage":"grpo","step":4,"phase":"generate","phase_s":1.0,"waiting_on":"sampling","pid":4294967295,"written_unix_s":0}"#).unwrap();
        let text = view(&run, 120);
        assert!(text.contains("step 4/10 · 2.00 s/step · ETA 12 s"), "{text}");
        assert!(
            text.contains("stopped: process 4294967295 ended without a report"),
            "{text}"
        );
        assert!(text.contains("train/reward") && text.contains("▁▃▆█"), "{text}");
        assert!(
            text.contains("What is 2 + 2?") && text.contains("→ <answer>4</answer>   reward 1.000"),
            "{text}"
        );
        std::fs::write(run.join("report.md"), "done").unwrap();
        assert!(view(&run, 120).contains("finished"));
        std::fs::remove_dir_all(&run).unwrap();
    }
}
