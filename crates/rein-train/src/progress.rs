//! Live progress on stderr: one rewritten line on a terminal, a line per report otherwise.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// A live status line for a long loop (training, generation).
pub struct Progress {
    terminal: bool,
    last: Option<Instant>,
    every: Duration,
}

impl Progress {
    /// A line on stderr, rewritten at most every 100 ms on a terminal, every 2 s otherwise.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        let terminal = std::io::stderr().is_terminal();
        Self {
            terminal,
            last: None,
            every: if terminal {
                Duration::from_millis(100)
            } else {
                Duration::from_secs(2)
            },
        }
    }

    /// Shows `line` if enough time passed since the last one (or `force`).
    pub fn show(&mut self, line: &str, force: bool) {
        if !force && self.last.is_some_and(|t| t.elapsed() < self.every) {
            return;
        }
        self.last = Some(Instant::now());
        let mut err = std::io::stderr().lock();
        let _ = if self.terminal {
            write!(err, "\r\x1b[2K{line}")
        } else {
            writeln!(err, "{line}")
        };
        let _ = err.flush();
    }

    /// Ends the live line.
    pub fn finish(&mut self) {
        if self.terminal && self.last.take().is_some() {
            eprintln!();
        }
    }
}

impl Drop for Progress {
    /// A loop left early (an error) still ends its line, so the error prints on its own.
    fn drop(&mut self) {
        self.finish();
    }
}
