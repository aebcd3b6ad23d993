//! Reading `metrics.jsonl` into figures of series.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::PlotError;

/// Keys that say where a line is, not what was measured.
const POSITION_KEYS: [&str; 6] = ["stage", "when", "step", "update", "global_step", "time/elapsed_s"];
/// The x axis, by preference: the first of these a line has (else its line number).
const X_KEYS: [&str; 3] = ["global_step", "step", "update"];

/// One metric over the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The metric's key, e.g. `train/reward`.
    pub name: String,
    /// The x-axis key (`global_step`, `step`, `update` or `line`).
    pub x_label: String,
    /// `(x, value)` for every line with a finite value, in file order.
    pub points: Vec<(f64, f64)>,
}

/// The series shown together in one image.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// File name stem: the stage and the metrics' common prefix, e.g. `grpo-train`.
    pub name: String,
    /// The series, by name.
    pub series: Vec<Series>,
}

/// Reads a metrics file and groups its numeric metrics into figures. Lines without a number
/// for a metric (or with `null`, NaN or ±∞) leave a gap.
pub fn read_metrics(path: &Path) -> Result<Vec<Figure>, PlotError> {
    let text = std::fs::read_to_string(path).map_err(|source| PlotError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    // figure name → metric name → series
    let mut figures: BTreeMap<String, BTreeMap<String, Series>> = BTreeMap::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let malformed = |message: String| PlotError::Malformed {
            path: path.to_path_buf(),
            line: index + 1,
            message,
        };
        let object = match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(object)) => object,
            Ok(other) => return Err(malformed(format!("found {}", kind(&other)))),
            Err(e) => return Err(malformed(e.to_string())),
        };
        let (x_label, x) = X_KEYS
            .iter()
            .find_map(|&k| object.get(k).and_then(Value::as_f64).map(|x| (k.to_string(), x)))
            .unwrap_or_else(|| ("line".to_string(), (index + 1) as f64));
        let stage = object.get("stage").and_then(Value::as_str);
        for (key, value) in &object {
            if POSITION_KEYS.contains(&key.as_str()) {
                continue;
            }
            let Some(y) = value.as_f64().filter(|y| y.is_finite()) else {
                continue;
            };
            let series = figures
                .entry(figure_name(stage, key))
                .or_default()
                .entry(key.clone())
                .or_insert_with(|| Series {
                    name: key.clone(),
                    x_label: x_label.clone(),
                    points: Vec::new(),
                });
            series.points.push((x, y));
        }
    }
    if figures.is_empty() {
        return Err(PlotError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(figures
        .into_iter()
        .map(|(name, series)| Figure {
            name,
            series: series.into_values().collect(),
        })
        .collect())
}

/// `<stage>-<prefix>`, or the one of them there is: `grpo-train`, `sft`, `charts`.
fn figure_name(stage: Option<&str>, key: &str) -> String {
    let prefix = key.split('/').next().unwrap_or(key);
    let name = match stage {
        Some(stage) if stage != prefix => format!("{stage}-{prefix}"),
        _ => prefix.to_string(),
    };
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_follow_stage_and_prefix() {
        assert_eq!(figure_name(Some("sft"), "sft/loss"), "sft");
        assert_eq!(figure_name(Some("grpo"), "train/reward/math-answer"), "grpo-train");
        assert_eq!(figure_name(None, "losses/value_loss"), "losses");
        assert_eq!(figure_name(Some("a b"), "c/d"), "a_b-c");
    }
}
