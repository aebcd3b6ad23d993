//! TensorBoard event files read back by TensorBoard's own reader (the `tensorboard` Python
//! package's `EventAccumulator`, through `tests/tensorboard_read.py`): every scalar of
//! `metrics.jsonl`, at its stage and step, for a finished run, a run killed mid-way, and a run
//! killed and resumed (where TensorBoard must show each step once); and the recipe and the
//! report as texts.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{root, scratch};
use serde_json::Value;

/// `(event directory, tag)` → `[(step, value)]`, in the order written.
type Scalars = BTreeMap<(String, String), Vec<(u64, f32)>>;

/// The tiny SFT-then-GRPO run: two stages, an evaluation before and after.
fn rein_run(runs: &Path, resume: Option<&Path>) -> Command {
    let mut command = common::tiny_grpo_run(
        env!("CARGO_BIN_EXE_rein"),
        runs,
        &["algorithm.steps=12", "train.checkpoint_every=4"],
    );
    if let Some(dir) = resume {
        command.arg("--resume").arg(dir);
    }
    command
}

fn only_run(runs: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(runs).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(dirs.len(), 1, "one run directory in {}", runs.display());
    dirs[0].clone()
}

/// What TensorBoard reads from the run's event files.
fn read_back(run: &Path) -> Value {
    let pythonpath = std::env::var_os("REIN_TENSORBOARD_PYTHONPATH")
        .map(PathBuf::from)
        .or_else(|| {
            let installed = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../tools/tensorboard");
            installed.is_dir().then_some(installed)
        })
        .expect("the tensorboard package is not installed: run the suite with `cargo xtask test`, which installs it");
    let out = Command::new("python3")
        .arg(root().join("tests/tensorboard_read.py"))
        .arg(run)
        .env("PYTHONPATH", pythonpath)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The scalars TensorBoard shows.
fn tensorboard_scalars(read: &Value) -> Scalars {
    let mut scalars = Scalars::new();
    for (dir, content) in read.as_object().unwrap() {
        for (tag, events) in content["scalars"].as_object().unwrap() {
            let events = (events.as_array().unwrap().iter())
                .map(|e| (e[0].as_u64().unwrap(), e[1].as_f64().unwrap() as f32))
                .collect();
            scalars.insert((dir.clone(), tag.clone()), events);
        }
    }
    scalars
}

/// The scalars `metrics.jsonl` says TensorBoard should show: each number of each record, in
/// its stage's directory (`.` without one), at its step, under its TensorBoard tag.
fn expected_scalars(run: &Path, records: usize) -> Scalars {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let mut scalars = Scalars::new();
    for line in text.lines().take(records) {
        let record: Value = serde_json::from_str(line).unwrap();
        let dir = record["stage"].as_str().unwrap_or(".").to_string();
        let step = ["global_step", "step", "update"]
            .iter()
            .find_map(|k| record[k].as_u64())
            .unwrap();
        for (key, value) in record.as_object().unwrap() {
            if ["stage", "when", "step", "update", "global_step"].contains(&key.as_str()) {
                continue;
            }
            if let Some(value) = value.as_f64() {
                let tag = rein_run::tensorboard_tag(key).to_string();
                scalars
                    .entry((dir.clone(), tag))
                    .or_default()
                    .push((step, value as f32));
            }
        }
    }
    scalars
}

fn lines(run: &Path) -> usize {
    std::fs::read_to_string(run.join("metrics.jsonl")).map_or(0, |t| t.lines().count())
}

/// Starts a run and kills it (SIGKILL) once `metrics.jsonl` has `lines` lines.
fn kill_after(runs: &Path, resume: Option<&Path>, at: usize) {
    let mut child = rein_run(runs, resume).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before line {at}");
        let run = std::fs::read_dir(runs)
            .ok()
            .and_then(|mut d| d.next())
            .map(|e| e.unwrap().path());
        if run.is_some_and(|run| lines(&run) >= at) {
            break;
        }
        assert!(Instant::now() < deadline, "no progress to line {at}");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A finished run: every scalar, in order, and the recipe and report as texts.
#[test]
fn tensorboard_reads_back_every_metric_of_a_run() {
    let runs = scratch("tb-finished");
    let out = rein_run(&runs, None).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run = only_run(&runs);
    let read = read_back(&run);
    assert_eq!(tensorboard_scalars(&read), expected_scalars(&run, usize::MAX));
    let dirs: Vec<&String> = read.as_object().unwrap().keys().collect();
    assert_eq!(dirs, [".", "eval", "grpo", "sft"], "a directory per stage");
    assert!(read["."]["scalars"].as_object().unwrap().is_empty());
    let text = |tag: &str| read["."]["texts"][tag][0].as_str().unwrap().to_string();
    let recipe = std::fs::read_to_string(run.join("recipe.toml")).unwrap();
    assert_eq!(text("recipe"), format!("```\n{recipe}\n```"));
    assert_eq!(text("report"), std::fs::read_to_string(run.join("report.md")).unwrap());
    // TRL's names where they mean the same.
    assert!(read["grpo"]["scalars"]["train/clip_ratio"].is_array());
    assert!(read["grpo"]["scalars"]["train/reward"].is_array());
}

/// A run killed in its RL stage: what TensorBoard shows is what `metrics.jsonl` holds (the
/// last record excepted, when the kill fell between writing it there and to the event file).
#[test]
fn a_killed_run_loses_nothing_it_logged() {
    let runs = scratch("tb-killed");
    kill_after(&runs, None, 20);
    let run = only_run(&runs);
    let shown = tensorboard_scalars(&read_back(&run));
    let written = lines(&run);
    let all = expected_scalars(&run, written);
    let but_last = expected_scalars(&run, written - 1);
    assert!(
        shown == all || shown == but_last,
        "TensorBoard shows neither what metrics.jsonl holds nor all but its last line"
    );
}

/// Killed in each stage and resumed: the interrupted process had logged steps after its last
/// checkpoint, which the resumed one logs again; TensorBoard shows each step once, equal to
/// `metrics.jsonl`.
#[test]
fn a_resumed_run_shows_each_step_once() {
    let runs = scratch("tb-resumed");
    kill_after(&runs, None, 7);
    let run = only_run(&runs);
    kill_after(&runs, Some(&run), 19);
    let out = rein_run(&runs, Some(&run)).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("resuming "), "{stderr}");
    let files = |dir: &str| std::fs::read_dir(run.join("tb").join(dir)).unwrap().count();
    assert!(
        files("sft") >= 2 && files("grpo") >= 2,
        "each resume appends a new file"
    );
    let read = read_back(&run);
    assert_eq!(tensorboard_scalars(&read), expected_scalars(&run, usize::MAX));
    // The texts: the recipe the first process wrote, the report the last one did, once each.
    let texts = &read["."]["texts"];
    assert_eq!(texts["recipe"].as_array().map(Vec::len), Some(1), "{texts}");
    assert_eq!(texts["report"].as_array().map(Vec::len), Some(1), "{texts}");
}
