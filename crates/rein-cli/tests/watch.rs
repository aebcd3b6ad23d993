//! `rein watch` in a real terminal: tmux runs it in a detached session (`new-session -d`) and
//! the screen is read back with `capture-pane`, for a run while it trains, the same run
//! finished, and a run killed mid-way.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::scratch;

/// The tiny SFT-then-GRPO run, `steps` GRPO steps.
fn rein_run(runs: &Path, steps: usize) -> Command {
    let steps = format!("algorithm.steps={steps}");
    let mut command = common::tiny_grpo_run(env!("CARGO_BIN_EXE_rein"), runs, &[&steps]);
    command.stderr(Stdio::null());
    command
}

/// The run directory under `runs`, once it exists.
fn run_dir(runs: &Path) -> PathBuf {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(dir) = std::fs::read_dir(runs).ok().and_then(|mut d| d.next()) {
            return dir.unwrap().path();
        }
        assert!(Instant::now() < deadline, "no run directory in {}", runs.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A detached tmux session running `rein watch` on `run`, 120 × 50; killed when dropped.
struct Terminal {
    session: String,
}

impl Terminal {
    fn watch(run: &Path, tag: &str) -> Self {
        let session = format!("rein-watch-{tag}-{}", std::process::id());
        let command = format!(
            "COLUMNS=120 {} watch {} --interval 0.3",
            env!("CARGO_BIN_EXE_rein"),
            run.display()
        );
        let status = Command::new("tmux")
            .args(["new-session", "-d", "-s", &session, "-x", "120", "-y", "50", &command])
            .status()
            .expect("tmux is needed for this test (apt install tmux)");
        assert!(status.success(), "tmux new-session failed");
        Self { session }
    }

    /// The screen once it shows `wanted` (or after 30 s).
    fn screen_with(&self, wanted: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = Command::new("tmux")
                .args(["capture-pane", "-p", "-t", &self.session])
                .output()
                .unwrap();
            let screen = String::from_utf8_lossy(&out.stdout).into_owned();
            if screen.contains(wanted) || Instant::now() > deadline {
                return screen;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.session])
            .status();
    }
}

fn kill(mut child: Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

/// While the run trains the view says so, with its stage, step and phase, and follows it; once
/// it finishes it says finished, with the held-out accuracy and the last samples.
#[test]
fn watching_a_run_while_it_trains_and_after() {
    let runs = scratch("watch-live");
    let child = rein_run(&runs, 80).spawn().unwrap();
    let run = run_dir(&runs);
    let terminal = Terminal::watch(&run, "live");
    let screen = terminal.screen_with("stage grpo");
    assert!(screen.contains("running (pid"), "{screen}");
    assert!(
        screen.contains("stage grpo · step ") && screen.contains("/80"),
        "{screen}"
    );
    assert!(screen.contains("phase "), "{screen}");
    let step = |screen: &str| -> u64 {
        let at = screen.find("stage grpo · step ").unwrap() + "stage grpo · step ".len();
        screen[at..].split('/').next().unwrap().parse().unwrap()
    };
    let first = step(&screen);
    std::thread::sleep(Duration::from_secs(2));
    let later = terminal.screen_with("stage grpo");
    assert!(step(&later) > first, "the view did not follow the run:\n{later}");
    assert!(
        later.contains("train/reward") && later.contains("last samples:"),
        "{later}"
    );
    assert!(
        later.chars().any(|c| ('▁'..='█').contains(&c)),
        "no sparkline:\n{later}"
    );
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let done = terminal.screen_with("finished");
    assert!(done.contains("finished (report.md written)"), "{done}");
    assert!(
        done.contains("step 80/80") && done.contains("held-out accuracy: before"),
        "{done}"
    );
}

/// A run killed mid-way is shown as stopped, with how to resume it, and what it had logged.
#[test]
fn watching_a_killed_run() {
    let runs = scratch("watch-killed");
    let child = rein_run(&runs, 200).spawn().unwrap();
    let run = run_dir(&runs);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !std::fs::read_to_string(run.join("metrics.jsonl")).is_ok_and(|m| m.contains("\"stage\":\"grpo\"")) {
        assert!(Instant::now() < deadline, "no GRPO step logged");
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(child);
    let terminal = Terminal::watch(&run, "killed");
    let screen = terminal.screen_with("stopped");
    assert!(
        screen.contains("stopped: process") && screen.contains("--resume"),
        "{screen}"
    );
    assert!(
        screen.contains("stage grpo · step ") && screen.contains("train/reward"),
        "{screen}"
    );
}
