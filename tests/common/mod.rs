//! Shared by the integration tests: where the built plugins are, one runtime per test binary.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::LazyLock;

use rein_plugin::{ArtifactCache, Plugin, PluginRuntime, SandboxLimits};

/// `<target>/<dir>/<name>.wasm`, built by `cargo xtask build-plugins`.
fn built(dir: &str, name: &str) -> PathBuf {
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir")
        .to_path_buf();
    let path = target.join(dir).join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: run `cargo xtask test` (it builds the plugins first)",
        path.display()
    );
    path
}

/// A plugin from plugins/.
pub fn plugin_path(name: &str) -> PathBuf {
    built("plugins", name)
}

/// An adversarial plugin from tests/plugins/.
pub fn test_plugin_path(name: &str) -> PathBuf {
    built("test-plugins", name)
}

/// One runtime per test binary, caching compiled components under the target directory.
pub fn runtime() -> &'static PluginRuntime {
    static RUNTIME: LazyLock<PluginRuntime> = LazyLock::new(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("component-cache");
        PluginRuntime::new(Some(ArtifactCache::new(dir)))
    });
    &RUNTIME
}

/// Loads a plugin from plugins/ with default limits.
pub fn load(name: &str) -> Plugin {
    load_with(&plugin_path(name), SandboxLimits::default())
}

/// Loads a plugin file with the given limits, failing the test with the error.
pub fn load_with(path: &std::path::Path, limits: SandboxLimits) -> Plugin {
    runtime()
        .load(path, limits)
        .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

/// A run directory's metrics, without what depends on the wall clock or the machine (`time/…`,
/// `sys/…` such as the peak memory, `…sps`,
/// `…tokens_per_s`).
pub fn metrics_without_timings(dir: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    text.lines()
        .map(|line| {
            let mut record: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line).unwrap();
            record.retain(|k, _| {
                !(k.starts_with("time/") || k.starts_with("sys/") || k.ends_with("sps") || k.ends_with("tokens_per_s"))
            });
            serde_json::Value::Object(record)
        })
        .collect()
}

/// The repository's root (the test crate's or rein-cli's ancestor that holds `recipes/`).
pub fn root() -> PathBuf {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|dir| dir.join("recipes/grpo-arithmetic.toml").is_file())
        .unwrap()
        .to_path_buf()
}

/// Where the built plugins are (`--plugin-dir`).
pub fn plugin_dir() -> PathBuf {
    plugin_path("math-answer").parent().unwrap().to_path_buf()
}

/// A fresh, empty directory for one test: `<target tmp>/<tag>-<pid>`.
pub fn scratch(tag: &str) -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The metric records of `stage` in the one run directory under `runs`.
pub fn stage_records(runs: &std::path::Path, stage: &str) -> Vec<serde_json::Value> {
    let run = std::fs::read_dir(runs).unwrap().next().unwrap().unwrap().path();
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    (metrics.lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|l: &serde_json::Value| l["stage"] == stage)
        .collect()
}

/// `rein run` of the main job's recipe shrunk to seconds (a tiny SFT stage, then GRPO on two
/// prompts × two completions of up to 12 tokens, 8 held-out problems) into `runs`, with
/// `overrides` after those; `rein` is the binary (`env!("CARGO_BIN_EXE_rein")` in rein-cli's
/// tests). Its output goes nowhere; stderr is piped.
pub fn tiny_grpo_run(rein: &str, runs: &std::path::Path, overrides: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(rein);
    command
        .arg("run")
        .arg(root().join("recipes/grpo-arithmetic.toml"))
        .arg("--plugin-dir")
        .arg(plugin_dir())
        .env(
            "REIN_CACHE_DIR",
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let base = [
        "data.task.train=400",
        "data.task.test=8",
        "sft.steps=12",
        "sft.batch_size=8",
        "algorithm.prompts_per_step=2",
        "sampler.n=2",
        "sampler.max_new_tokens=12",
        "eval.k=2",
    ];
    for o in base.iter().chain(overrides) {
        command.arg("--set").arg(o);
    }
    command
        .arg("--set")
        .arg(format!("train.runs_dir={:?}", runs.display().to_string()));
    command
}
