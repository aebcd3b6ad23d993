//! Reproducibility across instruction sets: the same recipe and seed, run by `rein run` with
//! `REIN_CPU=native` (the widest kernels this CPU has) and with `REIN_CPU` set to every other
//! instruction set it has, scalar code always among them, writes the same metrics (timings
//! aside) and byte-identical model files. On an AVX2 machine that compares AVX2 with scalar
//! code; on an AVX-512 machine AVX-512 with AVX2 and scalar code; on a machine with neither,
//! two runs of the scalar code (native and forced).

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use rein_kernels::Isa;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `recipe` with `overrides` under `REIN_CPU=isa`; returns its run directory.
fn run(recipe: &str, overrides: &[&str], isa: &str, tag: &str) -> PathBuf {
    let runs = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("reproducible-{tag}-{isa}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&runs);
    let mut command = Command::new(env!("CARGO_BIN_EXE_rein"));
    command
        .arg("run")
        .arg(root().join(recipe))
        .arg("--plugin-dir")
        .arg(common::plugin_path("math-answer").parent().unwrap())
        .arg("--set")
        .arg(format!("train.runs_dir={:?}", runs.display().to_string()))
        .env("REIN_CPU", isa)
        .env(
            "REIN_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"),
        );
    for o in overrides {
        command.arg("--set").arg(o);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "REIN_CPU={isa} rein run {recipe} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_dir(&runs).unwrap().next().unwrap().unwrap().path()
}

/// Runs the recipe on every available instruction set and checks the metrics and `files` are
/// equal to the first's.
fn same_on_every_instruction_set(recipe: &str, overrides: &[&str], files: &[&str]) {
    // `native` is the widest level; every narrower one is forced, scalar code always.
    let widest = Isa::detected();
    let isas: Vec<&str> = std::iter::once("native")
        .chain(
            Isa::available()
                .into_iter()
                .filter(|&isa| isa != widest || isa == Isa::Scalar)
                .map(Isa::name),
        )
        .collect();
    assert!(isas.len() >= 2 && isas.contains(&"scalar"), "{isas:?}");
    // Tests run at once in one process: each recipe and set of overrides its own run directories.
    let overrides_hash = {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::hash::DefaultHasher::new();
        overrides.hash(&mut hasher);
        hasher.finish()
    };
    let name = recipe.trim_start_matches("recipes/").trim_end_matches(".toml");
    let tag = &format!("{name}-{overrides_hash:016x}");
    let first = run(recipe, overrides, isas[0], tag);
    let metrics = common::metrics_without_timings(&first);
    assert!(!metrics.is_empty());
    for &isa in &isas[1..] {
        let other = run(recipe, overrides, isa, tag);
        assert_eq!(
            common::metrics_without_timings(&other),
            metrics,
            "{recipe}: REIN_CPU={isa} logged other metrics than REIN_CPU={}",
            isas[0]
        );
        for file in files {
            let (a, b) = (
                std::fs::read(first.join(file)).unwrap(),
                std::fs::read(other.join(file)).unwrap(),
            );
            assert!(
                a == b,
                "{recipe}: {file} differs between REIN_CPU={} and {isa}",
                isas[0]
            );
        }
    }
}

#[test]
fn ppo_is_the_same_on_every_instruction_set() {
    same_on_every_instruction_set(
        "recipes/ppo-cartpole.toml",
        &[
            "train.total_steps=5120",
            "train.stop_at_return=1000",
            "train.eval_episodes=2",
        ],
        &["policy.safetensors"],
    );
}

/// A small run of the main job: SFT then GRPO.
const SFT_AND_GRPO: [&str; 9] = [
    "sft.steps=3",
    "sft.batch_size=8",
    "algorithm.steps=2",
    "algorithm.prompts_per_step=2",
    "sampler.n=4",
    "sampler.max_new_tokens=16",
    "data.task.train=200",
    "data.task.test=4",
    "eval.k=2",
];

const SFT_AND_GRPO_FILES: [&str; 4] = [
    "data/train.jsonl",
    "sft/model.safetensors",
    "final/model.safetensors",
    "final/config.json",
];

#[test]
fn sft_and_grpo_are_the_same_on_every_instruction_set() {
    same_on_every_instruction_set("recipes/grpo-arithmetic.toml", &SFT_AND_GRPO, &SFT_AND_GRPO_FILES);
}

/// With each batch split across two devices (burn-collective's all-reduce of two shares is
/// `a + b = b + a`), as `train.devices` promises.
#[test]
fn sft_and_grpo_on_two_devices_are_the_same_on_every_instruction_set() {
    let overrides: Vec<&str> = SFT_AND_GRPO.into_iter().chain(["train.devices=2"]).collect();
    same_on_every_instruction_set("recipes/grpo-arithmetic.toml", &overrides, &SFT_AND_GRPO_FILES);
}
