//! Printing and saving benchmark results.

use std::time::{Duration, Instant};

use crate::machine::Machine;

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

/// A peer that could not be measured: the row it would have been compared in, and why.
pub struct NotMeasured {
    pub row: String,
    pub peer: String,
    pub reason: String,
}

#[derive(Default)]
pub struct Report {
    rows: Vec<Row>,
    not_measured: Vec<NotMeasured>,
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

    /// Records that `peer` could not be measured for `row`: a row that says so, never a row
    /// that silently goes missing.
    pub fn not_measured(&mut self, row: impl Into<String>, peer: impl Into<String>, reason: impl Into<String>) {
        let missing = NotMeasured {
            row: row.into(),
            peer: peer.into(),
            reason: reason.into(),
        };
        println!(
            "{:<44} {:>14}  | {}: {}",
            missing.row, "NOT MEASURED", missing.peer, missing.reason
        );
        self.not_measured.push(missing);
    }

    /// Prints and saves the results with where they were measured; an error when a peer was
    /// not measured, unless `allow_missing_peers`.
    pub fn finish(self, suite: &str, machine: &Machine, allow_missing_peers: bool) -> anyhow::Result<()> {
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
        let not_measured: Vec<_> = (self.not_measured.iter())
            .map(|m| serde_json::json!({"row": m.row, "peer": m.peer, "reason": m.reason}))
            .collect();
        let dir = std::path::Path::new("target/bench");
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("{suite}.json"));
        let saved = serde_json::json!({"machine": machine.json(), "rows": rows, "not_measured": not_measured});
        std::fs::write(&path, serde_json::to_string_pretty(&saved)?)?;
        println!("measured {}", machine.line());
        println!("results written to {}", path.display());
        if !self.not_measured.is_empty() && !allow_missing_peers {
            let peers: Vec<String> = (self.not_measured.iter())
                .map(|m| format!("{} for `{}`: {}", m.peer, m.row, m.reason))
                .collect();
            anyhow::bail!(
                "{} peer figure(s) NOT MEASURED (pass --allow-missing-peers to accept that):\n  {}",
                peers.len(),
                peers.join("\n  ")
            );
        }
        Ok(())
    }
}

/// How many times better rein is: for rates rein / baseline, for times baseline / rein.
fn ratio(value: f64, baseline: f64, unit: &str) -> f64 {
    if matches!(unit, "µs" | "s" | "MiB" | "env steps") {
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

/// The true median (the mean of the two middle values for an even count), as every peer
/// computes it (`statistics.median`); `None` when empty. Infinities (runs that never reached a
/// target) sort last.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

pub use rein_run::memory::peak_rss_mib;

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[1.0, f64::INFINITY]), Some(f64::INFINITY));
        assert_eq!(median(&[]), None);
    }
}
