//! Where things are: the workspace root, the target directory, and running cargo.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};

/// The repository root (the parent of `xtask/`): from `CARGO_MANIFEST_DIR` as `cargo run` sets
/// it, so a binary built in another checkout that shares the target directory (cargo may reuse
/// it) still works on this one; the compile-time value otherwise.
pub(crate) fn root() -> PathBuf {
    let manifest_dir =
        std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    manifest_dir.parent().expect("xtask/ has a parent").to_path_buf()
}

/// The target directory cargo uses for this workspace (honours `CARGO_TARGET_DIR`).
pub(crate) fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() { dir } else { root().join(dir) }
        }
        _ => root().join("target"),
    }
}

/// Where built plugins go: `<target>/plugins`.
pub(crate) fn plugin_dir() -> PathBuf {
    target_dir().join("plugins")
}

/// Where fetched models go: `<target>/models` (`cargo xtask model NAME`).
pub(crate) fn model_dir() -> PathBuf {
    target_dir().join("models")
}

/// `cargo`, as invoked by the `cargo xtask` alias.
pub(crate) fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// `cargo run -p <package> --`: quiet once `binary` is built; the first time, with cargo's
/// progress and a word on how long it takes (burn and wasmtime compile for minutes).
pub(crate) fn cargo_run(package: &str, binary: &str) -> Command {
    let built = target_dir()
        .join("debug")
        .join(format!("{binary}{}", std::env::consts::EXE_SUFFIX));
    let mut command = cargo();
    command.arg("run");
    if built.exists() {
        command.arg("--quiet");
    } else {
        eprintln!(
            "building {binary} for the first time: burn and wasmtime take 20 to 25 minutes to compile on \
             2 cores (cargo's progress bar follows); later runs start in seconds"
        );
    }
    command.args(["-p", package, "--"]);
    command
}

/// Runs a command, failing with its command line when it fails.
pub(crate) fn run(command: &mut Command) -> anyhow::Result<()> {
    let status = command.status().with_context(|| format!("cannot start {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed ({status})");
    }
    Ok(())
}

/// Runs a command and returns its stdout.
pub(crate) fn output(command: &mut Command) -> anyhow::Result<String> {
    let out = command.output().with_context(|| format!("cannot start {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{command:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}
