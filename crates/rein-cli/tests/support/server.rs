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

    /// POSTs the JSON `body` to `path` (the connection closed after the answer): the status and
    /// the answer's body.
    pub fn post(&self, path: &str, body: &str) -> (u16, String) {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(self.url.trim_start_matches("http://")).unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let status = (answer.split_whitespace().nth(1).and_then(|s| s.parse().ok()))
            .unwrap_or_else(|| panic!("no HTTP answer: {answer:?}"));
        (status, answer.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string())
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
