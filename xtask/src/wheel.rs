//! `cargo xtask wheel`: the `rein-sandbox` Python wheel (crates/rein-py) in target/wheels/,
//! built by maturin with the plugins written in Rust inside it as built-ins, and the check that
//! `cargo xtask test` runs on it: the wheel installed into a fresh venv passes its pytest suite.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, ensure};
use clap::Args;

use crate::build_plugins::BuildPlugins;
use crate::guest;
use crate::workspace::{plugin_dir, root, run, target_dir};

/// Test dependencies of the Python package, pinned.
const PYTEST: &str = "pytest==9.0.2";
const GYMNASIUM: &str = "gymnasium==1.2.2";

#[derive(Args)]
pub(crate) struct Wheel {
    /// Build with the release profile (the default, dev, reuses the test build's optimised
    /// wasmtime and is what the tests install).
    #[arg(long)]
    release: bool,
}

impl Wheel {
    /// Builds the wheel and returns its path.
    pub(crate) fn run(&self) -> anyhow::Result<PathBuf> {
        BuildPlugins::for_running().run()?;
        let package = root().join("crates/rein-py");
        let builtins = package.join("python/rein_sandbox/plugins");
        copy_builtins(&builtins)?;
        let maturin = guest::maturin()?;
        let out = target_dir().join("wheels");
        std::fs::create_dir_all(&out)?;
        for old in wheels(&out)? {
            std::fs::remove_file(old)?;
        }
        eprintln!("building the rein-sandbox wheel");
        let mut command = Command::new(maturin.join("bin/maturin"));
        command
            .args(["build", "--quiet", "--compatibility", "linux", "--manifest-path"])
            .arg(package.join("Cargo.toml"))
            .arg("--out")
            .arg(&out)
            .env("PYTHONPATH", &maturin)
            .current_dir(root());
        if self.release {
            command.arg("--release");
        }
        run(&mut command)?;
        let wheel = wheels(&out)?.pop().context("maturin wrote no wheel")?;
        let size = std::fs::metadata(&wheel)?.len();
        eprintln!("  {} ({:.1} MiB)", wheel.display(), size as f64 / (1 << 20) as f64);
        Ok(wheel)
    }
}

fn wheels(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("rein_sandbox-") && n.ends_with(".whl"))
        })
        .collect();
    found.sort();
    Ok(found)
}

/// Copies the Rust plugins of plugins/ (tens of KiB to a few MiB each) into the package as its
/// built-ins. Python and JavaScript plugins (12–18 MiB each, a whole interpreter) stay out:
/// users pass their `.wasm` path.
fn copy_builtins(dest: &Path) -> anyhow::Result<()> {
    if dest.exists() {
        std::fs::remove_dir_all(dest)?;
    }
    std::fs::create_dir_all(dest)?;
    let mut names = Vec::new();
    for entry in std::fs::read_dir(root().join("plugins"))? {
        let dir = entry?.path();
        let Some(name) = dir.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let wasm = plugin_dir().join(format!("{name}.wasm"));
        if dir.join("Cargo.toml").is_file() && wasm.is_file() {
            std::fs::copy(&wasm, dest.join(format!("{name}.wasm")))?;
            names.push(name.to_string());
        }
    }
    ensure!(!names.is_empty(), "no Rust plugins built in {}", plugin_dir().display());
    names.sort();
    eprintln!("  built-in plugins: {}", names.join(", "));
    Ok(())
}

/// Builds the wheel, installs it into a new venv with pytest and Gymnasium, and runs
/// crates/rein-py/tests against it (`rein plugin score` as the reference, the test plugins
/// as the hostile ones).
pub(crate) fn check() -> anyhow::Result<()> {
    let wheel = Wheel { release: false }.run()?;
    guest::pip_available("Python 3 (python3 with venv and pip) is needed to test the Python package")?;
    let venv = target_dir().join("tmp/rein-sandbox-venv");
    if venv.exists() {
        std::fs::remove_dir_all(&venv)?;
    }
    eprintln!("installing the wheel into a new venv ({})", venv.display());
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    let python = venv.join("bin/python");
    run(Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        .arg(&wheel)
        .args([PYTEST, GYMNASIUM])
        .env("PIP_ROOT_USER_ACTION", "ignore"))
    .context("cannot install the wheel and its test dependencies into a venv")?;
    eprintln!("testing the Python package (pytest crates/rein-py/tests)");
    run(Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(root().join("crates/rein-py/tests"))
        .env("REIN_BIN", target_dir().join("debug/rein"))
        .env("REIN_PLUGIN_DIR", plugin_dir())
        .env("REIN_TEST_PLUGIN_DIR", target_dir().join("test-plugins"))
        // Tests import the installed package, never the source tree.
        .current_dir(venv))
}

/// For `cargo xtask bench plugins`: the wheel installed (it requires nothing) under
/// `<target>/tools/rein-sandbox-bench`, and math-verify under `<target>/tools/math-verify`.
pub(crate) fn bench_packages() -> anyhow::Result<(PathBuf, PathBuf)> {
    let wheel = Wheel { release: false }.run()?;
    let dir = target_dir().join("tools/rein-sandbox-bench");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    guest::pip_install_into(&dir, &[&wheel])?;
    Ok((dir, guest::math_verify()?))
}
