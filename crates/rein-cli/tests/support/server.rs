//! A `rein serve` process for the tests that talk to one (`serve.rs`, `served_models.rs`).

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A `rein serve` process on a free port, killed when dropped.
pub struct Server {
    child: Child,
    pub url: String,
}

impl Server {
    pub fn start(model: &Path) -> Self {
        Self::start_with(model, &[])
    }

    /// A server of `model` with the `rein serve` options `extra`.
    pub fn start_with(model: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rein"))
            .args(["serve", "--port", "0", "--model"])
            .arg(model)
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines.next().expect("rein serve printed its address").unwrap();
            if let Some(at) = line.find("http://") {
                break line[at..].trim().to_string();
            }
        };
        // Keep draining its log so it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Self { child, url }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}
