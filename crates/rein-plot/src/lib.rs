//! Charts and a summary of a run directory's `metrics.jsonl`.
//!
//! [`plot_run`] reads the metrics a run wrote (one JSON object per line), groups every numeric
//! metric into figures by stage and name prefix (`sft`, `train`, `time`, `eval`, `charts`,
//! `losses`, …), draws each figure as a grid of line charts in both PNG and SVG under
//! `plots/`, and writes `summary.md` (first, last, lowest and highest value of each metric, and
//! the figures).
//!
//! **Architecture invariant:** this crate only reads metrics files and writes charts. It knows
//! nothing of training, models or plugins; the CLI calls it at the end of a run and for
//! `rein plot`.

mod chart;
mod metrics;
mod summary;

use std::path::{Path, PathBuf};

pub use metrics::{Figure, Series, read_metrics};

/// What can go wrong plotting a run.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The metrics file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line of the metrics file is not a JSON object.
    #[error("{path}:{line}: not a JSON object of metrics: {message}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What the parser said.
        message: String,
    },
    /// The metrics file holds no numeric metric.
    #[error("{path}: no numeric metrics to plot")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// Drawing or writing a chart failed.
    #[error("cannot draw {path}: {message}")]
    Draw {
        /// The chart file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// Writing a file failed.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The lowest and highest of `values` (`(∞, −∞)` when there are none).
pub(crate) fn span(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values.fold((f64::INFINITY, f64::NEG_INFINITY), |(low, high), v| {
        (low.min(v), high.max(v))
    })
}

/// Integers as they are, others with four significant digits, plain or scientific as fits.
pub(crate) fn number(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e6 {
        format!("{value:.0}")
    } else if (1e-3..1e6).contains(&value.abs()) {
        let digits = (3 - value.abs().log10().floor() as i32).max(0) as usize;
        format!("{value:.digits$}")
    } else {
        format!("{value:.3e}")
    }
}

/// Plots `run_dir/metrics.jsonl` into `run_dir/plots/<figure>.{png,svg}` and writes
/// `run_dir/summary.md`. Returns the files written.
pub fn plot_run(run_dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let metrics = run_dir.join("metrics.jsonl");
    let figures = read_metrics(&metrics)?;
    let plots = run_dir.join("plots");
    std::fs::create_dir_all(&plots).map_err(|source| PlotError::Write {
        path: plots.clone(),
        source,
    })?;
    let mut written = Vec::new();
    for figure in &figures {
        for extension in ["png", "svg"] {
            let path = plots.join(format!("{}.{extension}", figure.name));
            chart::draw(figure, &path)?;
            written.push(path);
        }
    }
    let summary = run_dir.join("summary.md");
    let title = run_dir
        .file_name()
        .map_or_else(|| "run".into(), |n| n.to_string_lossy().into_owned());
    std::fs::write(&summary, summary::markdown(&title, &figures)).map_err(|source| PlotError::Write {
        path: summary.clone(),
        source,
    })?;
    written.push(summary);
    Ok(written)
}
