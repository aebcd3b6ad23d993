//! The Python peers in `benches/peers/`, run in the same invocation as rein's figure (see
//! benches/peers/README.md): `.venv`'s interpreter (plain `python3` for the standard-library
//! ones), the same thread count as rein, the same allocator settings rein gives itself, and
//! each peer's stderr kept in a log file the bench names.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The threads every side runs with (`--threads`), set once by `main`.
static THREADS: OnceLock<usize> = OnceLock::new();

/// Sets the thread count of rein's side (rayon's global pool) and of every peer.
pub fn set_threads(threads: usize) -> anyhow::Result<()> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .map_err(|e| anyhow::anyhow!("cannot size rayon's pool to {threads} threads: {e}"))?;
    THREADS
        .set(threads)
        .map_err(|_| anyhow::anyhow!("the thread count was set twice"))
}

/// The thread count every side runs with.
pub fn threads() -> usize {
    *THREADS.get().unwrap_or(&rayon::current_num_threads())
}

/// Which interpreter runs a peer.
#[derive(Clone, Copy)]
pub enum Python {
    /// `.venv/bin/python`, with the packages of benches/peers/requirements.txt.
    Venv,
    /// The system's `python3`: the standard library is all the peer needs.
    System,
}

/// Runs `benches/peers/<script>` with `args` (and `--threads`) and returns the JSON object it
/// printed last on stdout; otherwise why it could not be measured (no `.venv`, a failure: the
/// last line of its stderr, and the log that holds the rest).
pub fn run(script: &str, args: impl IntoIterator<Item = impl AsRef<OsStr>>) -> Result<serde_json::Value, String> {
    run_with(Python::Venv, script, args)
}

/// [`run`] with the interpreter chosen.
pub fn run_with(
    python: Python,
    script: &str,
    args: impl IntoIterator<Item = impl AsRef<OsStr>>,
) -> Result<serde_json::Value, String> {
    let interpreter = match python {
        Python::Venv => {
            let venv = Path::new(".venv/bin/python");
            if !venv.exists() {
                return Err("no .venv (create it as benches/peers/README.md says)".into());
            }
            venv.to_path_buf()
        }
        Python::System => PathBuf::from("python3"),
    };
    let log = log_path(script);
    let stderr = std::fs::File::create(&log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    println!("  peer {script}: its log is {}", log.display());
    let out = Command::new(&interpreter)
        .arg(Path::new("benches/peers").join(script))
        .args(args)
        .arg(format!("--threads={}", threads()))
        // rein's own allocator settings (`keep_freed_memory`), through glibc's environment.
        .env("MALLOC_MMAP_THRESHOLD_", (32 << 20).to_string())
        .env("MALLOC_TRIM_THRESHOLD_", i32::MAX.to_string())
        .stdin(Stdio::null())
        .stderr(stderr)
        .output()
        .map_err(|e| format!("cannot start {}: {e}", interpreter.display()))?;
    if !out.status.success() {
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        let last = logged.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
        return Err(format!("{} ({last}; see {})", out.status, log.display()));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
    serde_json::from_str(line).map_err(|e| format!("printed no JSON object ({e}; see {})", log.display()))
}

/// `target/bench/logs/<script>-<n>.log`, `n` counting this process's peer runs.
fn log_path(script: &str) -> PathBuf {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let dir = Path::new("target/bench/logs");
    let _ = std::fs::create_dir_all(dir);
    let stem = script.trim_end_matches(".py");
    dir.join(format!("{stem}-{}.log", RUNS.fetch_add(1, Ordering::Relaxed) + 1))
}

/// `"name version, …"` of a peer's `versions` object, python first.
pub fn versions(value: &serde_json::Value) -> String {
    let Some(versions) = value["versions"].as_object() else {
        return "versions not reported".into();
    };
    let mut parts: Vec<String> = versions
        .iter()
        .map(|(k, v)| format!("{k} {}", v.as_str().unwrap_or("?")))
        .collect();
    parts.sort_by_key(|p| !p.starts_with("python "));
    parts.join(", ")
}

/// Prints what a peer said about its threads and numerical libraries.
pub fn describe(script: &str, value: &serde_json::Value) {
    let blas = value["blas"].as_str().map(|b| format!("; {b}")).unwrap_or_default();
    println!(
        "  peer {script}: {} threads{blas}; {}",
        value["threads"],
        versions(value)
    );
}

/// A TRL trainer peer's step figures: runs `script` with `args`, checks that gradient
/// checkpointing was as asked, and returns its label (`what` and the versions), seconds per
/// step and peak resident memory in MiB, or why it could not run.
pub fn trl_step(
    script: &str,
    args: Vec<String>,
    what: &str,
    checkpointing: bool,
) -> Result<(String, f64, Option<f64>), String> {
    let value = run(script, args)?;
    describe(script, &value);
    if value["checkpointing_active"].as_bool() != Some(checkpointing) {
        return Err(format!(
            "asked for gradient checkpointing {checkpointing}, TRL reports {}",
            value["checkpointing_active"]
        ));
    }
    let seconds = value["seconds_per_step"].as_f64().ok_or("no `seconds_per_step`")?;
    let rss = value["peak_rss_mib"].as_f64();
    println!(
        "  TRL: {seconds:.3} s per step, peak RSS {:.0} MiB",
        rss.unwrap_or(f64::NAN)
    );
    Ok((format!("{what} ({})", versions(&value)), seconds, rss))
}

#[cfg(test)]
mod tests {
    /// Every peer script imports and reads rein's files (plugins, recipes) as the bench runs
    /// it, with the heavy packages stubbed: a peer broken by a change elsewhere in rein fails
    /// here, in CI, not in a benchmark run months later.
    #[test]
    fn every_peer_script_imports_and_reads_reins_files() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = std::process::Command::new("python3")
            .arg("benches/peers/check_imports.py")
            .current_dir(&root)
            .output()
            .expect("python3 runs (cargo xtask test needs it)");
        assert!(
            out.status.success(),
            "benches/peers/check_imports.py failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
