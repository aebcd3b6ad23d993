//! `rein plot RUN_DIR`: charts and summary.md of a run directory (also drawn after every run).

use std::path::{Path, PathBuf};

use clap::Args;

#[derive(Args, Debug)]
pub(crate) struct PlotArgs {
    /// A run directory (`runs/<recipe>-<timestamp>`, holding metrics.jsonl).
    run_dir: PathBuf,
}

impl PlotArgs {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        for file in rein_plot::plot_run(&self.run_dir)? {
            println!("{}", file.display());
        }
        Ok(())
    }
}

/// Plots a finished run; a failure is reported but does not fail the run, whose results are
/// already on disk.
pub(crate) fn after_run(run_dir: &Path) {
    match rein_plot::plot_run(run_dir) {
        Ok(files) => eprintln!(
            "charts: {} ({} files) and {}",
            run_dir.join("plots").display(),
            files.len() - 1,
            run_dir.join("summary.md").display()
        ),
        Err(e) => eprintln!("warning: no charts: {e}"),
    }
}
