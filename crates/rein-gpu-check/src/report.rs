//! The rows a check produces, written to `results.json` after every row (so a run cut short
//! still leaves what it measured) and printed as one table at the end.

use std::path::PathBuf;

use serde::Serialize;

/// What a row is: a gate (parity) or a figure (speed, information).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Holds within its bound or the run fails.
    Parity,
    /// A measurement; never fails the run.
    Speed,
    /// Something the reader needs to interpret the rest (device, versions).
    Info,
}

/// One line of the summary.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// What was checked or measured, e.g. `logits qwen2-gqa (fused)`.
    pub check: String,
    /// Gate or figure.
    pub kind: Kind,
    /// The measured value (worst difference, tokens/s, …).
    pub value: f64,
    /// The unit of `value`.
    pub unit: String,
    /// The bound a parity row must stay within (`value <= bound`).
    pub bound: Option<f64>,
    /// Whether the row holds (always true for figures).
    pub ok: bool,
    /// Anything else worth reading: the failure, the settings.
    pub detail: String,
}

/// The rows so far, and where they are written.
pub struct Report {
    rows: Vec<Row>,
    path: Option<PathBuf>,
    device: String,
}

impl Report {
    /// An empty report for `device`, written to `path` as it grows.
    pub fn new(device: &str, path: Option<PathBuf>) -> Self {
        Self {
            rows: Vec::new(),
            path,
            device: device.to_string(),
        }
    }

    /// A parity row: `value` must be at most `bound` (a NaN never is).
    pub fn parity(&mut self, check: impl Into<String>, value: f64, bound: f64, unit: &str, detail: impl Into<String>) {
        let ok = value <= bound;
        self.push(Row {
            check: check.into(),
            kind: Kind::Parity,
            value,
            unit: unit.into(),
            bound: Some(bound),
            ok,
            detail: detail.into(),
        });
    }

    /// A row that failed before it could measure anything (an error or a panic); only a
    /// parity row's failure fails the run.
    pub fn failed(&mut self, check: impl Into<String>, kind: Kind, why: impl Into<String>) {
        self.push(Row {
            check: check.into(),
            kind,
            value: f64::NAN,
            unit: String::new(),
            bound: None,
            ok: false,
            detail: why.into(),
        });
    }

    /// A measured figure.
    pub fn speed(&mut self, check: impl Into<String>, value: f64, unit: &str, detail: impl Into<String>) {
        self.push(Row {
            check: check.into(),
            kind: Kind::Speed,
            value,
            unit: unit.into(),
            bound: None,
            ok: true,
            detail: detail.into(),
        });
    }

    /// A line of information.
    pub fn info(&mut self, check: impl Into<String>, detail: impl Into<String>) {
        self.push(Row {
            check: check.into(),
            kind: Kind::Info,
            value: f64::NAN,
            unit: String::new(),
            bound: None,
            ok: true,
            detail: detail.into(),
        });
    }

    fn push(&mut self, row: Row) {
        eprintln!("{}", line(&row));
        self.rows.push(row);
        self.write();
    }

    /// Whether every parity row holds (and there is at least one).
    pub fn all_hold(&self) -> bool {
        let parity: Vec<&Row> = self.rows.iter().filter(|r| r.kind == Kind::Parity).collect();
        !parity.is_empty() && parity.iter().all(|r| r.ok)
    }

    fn write(&self) {
        let Some(path) = &self.path else { return };
        let json = serde_json::json!({ "device": self.device, "rows": self.rows });
        if let Err(e) = std::fs::write(path, serde_json::to_string_pretty(&json).unwrap_or_default()) {
            eprintln!("warning: cannot write {}: {e}", path.display());
        }
    }

    /// The summary table, one row per line.
    pub fn table(&self) -> String {
        let mut out = format!("rein-gpu-check on {}\n", self.device);
        out += &format!(
            "{:<6} {:<44} {:>14} {:>10}  {}\n",
            "", "check", "value", "bound", "detail"
        );
        for row in &self.rows {
            out += &line(row);
            out.push('\n');
        }
        let parity = self.rows.iter().filter(|r| r.kind == Kind::Parity);
        let failed = parity.clone().filter(|r| !r.ok).count();
        out += &format!("{} parity rows, {failed} failed\n", parity.count());
        out
    }
}

fn line(row: &Row) -> String {
    let status = match (row.kind, row.ok) {
        (Kind::Parity, true) => "ok",
        (Kind::Parity, false) => "FAIL",
        (Kind::Speed, true) => "speed",
        (Kind::Speed, false) => "error",
        (Kind::Info, _) => "info",
    };
    let value = if row.value.is_nan() {
        String::from("-")
    } else if row.value != 0.0 && (row.value.abs() < 1e-2 || row.value.abs() >= 1e6) {
        format!("{:.3e} {}", row.value, row.unit)
    } else {
        format!("{:.3} {}", row.value, row.unit)
    };
    let bound = match row.bound {
        Some(0.0) => String::from("0"),
        Some(b) => format!("{b:.0e}"),
        None => String::new(),
    };
    format!("{status:<6} {:<44} {value:>14} {bound:>10}  {}", row.check, row.detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nan_or_a_missing_measurement_never_holds() {
        let mut report = Report::new("test", None);
        assert!(!report.all_hold(), "no parity row at all is not a pass");
        report.parity("a", 1e-6, 1e-4, "", "");
        assert!(report.all_hold());
        report.speed("b", 10.0, "tok/s", "");
        assert!(report.all_hold(), "figures never fail the run");
        report.parity("c", f64::NAN, 1e-4, "", "");
        assert!(!report.all_hold());
        let mut report = Report::new("test", None);
        report.failed("d", Kind::Parity, "panicked");
        assert!(!report.all_hold());
        assert!(report.table().contains("FAIL"));
    }
}
