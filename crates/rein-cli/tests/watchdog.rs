//! The watchdog end to end: a `rein run` child whose `backward` phase hangs (injected with
//! `REIN_TEST_STALL`, rein-run's fault injection) is stopped with an error naming the phase and
//! the step, after saving the last completed step, which `--resume` continues from to exactly
//! the metrics of an uninterrupted run.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn rein(runs: &Path, extra: &[&str]) -> Command {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut command = Command::new(env!("CARGO_BIN_EXE_rein"));
    command
        .arg("run")
        .arg(root.join("recipes/ppo-cartpole.toml"))
        .arg("--plugin-dir")
        .arg(common::plugin_path("cartpole").parent().unwrap());
    for set in [
        format!("train.runs_dir={:?}", runs.display().to_string()),
        "train.total_steps=2560".into(),
        "train.stop_at_return=1000".into(),
        "train.eval_episodes=0".into(),
        // No checkpoint would be due before the stall: the watchdog writes the one resumed from.
        "train.checkpoint_every=100".into(),
        "train.stall_timeout_s=2".into(),
    ] {
        command.arg("--set").arg(set);
    }
    command.args(extra).env_remove("REIN_TEST_STALL");
    command
}

fn scratch(tag: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("watchdog-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn only_run(runs: &Path) -> PathBuf {
    std::fs::read_dir(runs).unwrap().next().unwrap().unwrap().path()
}

#[test]
fn a_stalled_phase_is_named_saved_and_resumable() {
    let reference = scratch("reference");
    let out = rein(&reference, &[]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let runs = scratch("stalled");
    let started = Instant::now();
    let out = rein(&runs, &[]).env("REIN_TEST_STALL", "backward@5").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(3),
        "the watchdog's exit code; stderr:\n{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(120), "{:?}", started.elapsed());
    assert!(
        stderr.contains("step 5: phase `backward` made no progress for"),
        "the error names the step and phase:\n{stderr}"
    );
    assert!(stderr.contains("(waiting on the loss and its gradients)"), "{stderr}");
    assert!(stderr.contains("saved step 4 in"), "{stderr}");
    let run = only_run(&runs);
    let (newest, _) = rein_run::checkpoint::CheckpointDir::of_run(&run).latest().unwrap();
    assert_eq!(newest.expect("the watchdog saved a checkpoint").step, 4);

    let out = rein(&runs, &["--resume", run.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        common::metrics_without_timings(&run),
        common::metrics_without_timings(&only_run(&reference))
    );
}
