//! Printing and saving benchmark results.

use std::time::{Duration, Instant};

/// One measured figure with what it is compared against.
pub struct Row {
    pub name: String,
    pub value: f64,
    pub unit: &'static str,
    /// A native-Rust or peer figure for the same work, with its label.
    pub baseline: Option<(String, f64)>,
    /// The target, as text (e.g. `≥ 10M/s`), and whether it is met.
    pub target: Option<(String, bool)>,
}

#[derive(Default)]
pub struct Report {
    rows: Vec<Row>,
}

impl Report {
    pub fn push(&mut self, row: Row) {
        let baseline = match &row.baseline {
            Some((label, b)) => format!(
                "  | {label}: {} (ratio {:.2}×)",
                human(*b, row.unit),
                ratio(row.value, *b, row.unit)
            ),
            None => String::new(),
        };
        let target = match &row.target {
            Some((t, met)) => format!("  | target {t}: {}", if *met { "met" } else { "NOT met" }),
            None => String::new(),
        };
        println!("{:<44} {:>14}{baseline}{target}", row.name, human(row.value, row.unit));
        self.rows.push(row);
    }

    pub fn finish(self, suite: &str) -> anyhow::Result<()> {
        let rows: Vec<_> = self
            .rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name, "value": r.value, "unit": r.unit,
                    "baseline": r.baseline.as_ref().map(|(l, v)| serde_json::json!({"label": l, "value": v})),
                    "target": r.target.as_ref().map(|(t, met)| serde_json::json!({"target": t, "met": met})),
                })
            })
            .collect();
        let dir = std::path::Path::new("target/bench");
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("{suite}.json"));
        std::fs::write(&path, serde_json::to_string_pretty(&rows)?)?;
        println!("results written to {}", path.display());
        Ok(())
    }
}

/// How many times better rein is: for rates rein / baseline, for times baseline / rein.
fn ratio(value: f64, baseline: f64, unit: &str) -> f64 {
    if matches!(unit, "µs" | "s" | "MiB") {
        baseline / value
    } else {
        value / baseline
    }
}

fn human(value: f64, unit: &str) -> String {
    match unit {
        "µs" => format!("{value:.2} µs"),
        "s" => format!("{value:.2} s"),
        "MiB" => format!("{value:.0} MiB"),
        _ if value >= 1e6 => format!("{:.2}M {unit}", value / 1e6),
        _ if value >= 1e3 => format!("{:.1}k {unit}", value / 1e3),
        _ => format!("{value:.1} {unit}"),
    }
}

/// Runs `f` (which does `work` units) repeatedly for about `budget`, in 7 rounds, and returns
/// the median rate in units per second.
pub fn rate(budget: Duration, work: f64, mut f: impl FnMut()) -> f64 {
    f(); // warm up
    let mut rates = Vec::new();
    for _ in 0..7 {
        let start = Instant::now();
        let mut iters = 0u64;
        while start.elapsed() < budget / 7 || iters == 0 {
            f();
            iters += 1;
        }
        rates.push(work * iters as f64 / start.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

pub use rein_train::memory::peak_rss_mib;
