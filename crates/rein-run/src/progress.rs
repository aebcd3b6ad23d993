//! Live progress on stderr: an indicatif bar on a terminal, a plain line every 2 s otherwise
//! (logs and CI keep a readable record).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// A live status line for a long loop (training, generation).
pub struct Progress {
    bar: Option<ProgressBar>,
    last: Option<Instant>,
}

/// How often a line is printed when stderr is not a terminal.
const LOG_EVERY: Duration = Duration::from_secs(2);

impl Progress {
    /// Progress over `total` steps (`None`: unknown), shown on stderr.
    pub fn new(total: Option<u64>) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let (bar, template) = match total {
                Some(n) => (
                    ProgressBar::new(n),
                    "{bar:24} {pos}/{len} {elapsed} (eta {eta}) {wide_msg}",
                ),
                None => (ProgressBar::new_spinner(), "{spinner} {elapsed} {wide_msg}"),
            };
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style);
            }
            bar
        });
        Self { bar, last: None }
    }

    /// Shows `line` at step `position`: on a terminal at once (indicatif limits redraws),
    /// otherwise if 2 s passed since the last line (or `force`).
    pub fn show(&mut self, position: u64, line: &str, force: bool) {
        if let Some(bar) = &self.bar {
            bar.set_position(position);
            bar.set_message(line.replace('\n', " | "));
            if force && line.contains('\n') {
                bar.println(line.split_once('\n').map_or(line, |(_, rest)| rest));
            }
            return;
        }
        if !force && self.last.is_some_and(|t| t.elapsed() < LOG_EVERY) {
            return;
        }
        self.last = Some(Instant::now());
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{line}");
        let _ = err.flush();
    }

    /// Ends the live line, leaving it on screen.
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.abandon();
        }
    }
}

impl Drop for Progress {
    /// A loop left early (an error) still ends its line, so the error prints on its own.
    fn drop(&mut self) {
        self.finish();
    }
}
