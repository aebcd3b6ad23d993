//! `cargo xtask build-plugins`: the Rust plugin workspaces with cargo, then the Python and
//! JavaScript plugins (see [`crate::guest`]).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use clap::Args;

use crate::guest::{self, Missing};
use crate::workspace::{cargo, output, plugin_dir, root, run, target_dir};

const WASM_TARGET: &str = "wasm32-wasip2";

#[derive(Args)]
pub(crate) struct BuildPlugins {
    /// Only build plugins/ (skip the adversarial test plugins in tests/plugins/).
    #[arg(long)]
    pub(crate) no_test_plugins: bool,
    /// Skip Python and JavaScript plugins whose compiler cannot be installed (no python3 or
    /// node, no registry), with a warning, instead of failing.
    #[arg(skip)]
    pub(crate) guests_optional: bool,
}

/// A cargo workspace of plugins and where its `.wasm` files go.
struct PluginWorkspace {
    manifest: PathBuf,
    out_dir: PathBuf,
}

impl BuildPlugins {
    /// What `run`, `eval`, `recipe check` and `bench` build: plugins/ only, and the Python
    /// and JavaScript ones only where their compilers can be installed.
    pub(crate) fn for_running() -> Self {
        Self {
            no_test_plugins: true,
            guests_optional: true,
        }
    }

    /// Builds the plugins and returns the `.wasm` files written.
    pub(crate) fn run(&self) -> anyhow::Result<Vec<PathBuf>> {
        ensure_wasm_target()?;
        let mut workspaces = vec![PluginWorkspace {
            manifest: root().join("plugins/Cargo.toml"),
            out_dir: plugin_dir(),
        }];
        if !self.no_test_plugins {
            workspaces.push(PluginWorkspace {
                manifest: root().join("tests/plugins/Cargo.toml"),
                out_dir: target_dir().join("test-plugins"),
            });
        }
        let mut built = Vec::new();
        for ws in &workspaces {
            built.extend(build_workspace(ws)?);
        }
        let missing = if self.guests_optional {
            Missing::Skip
        } else {
            Missing::Fail
        };
        for ws in &workspaces {
            let plugins = guest::find(ws.manifest.parent().unwrap_or(&ws.manifest))?;
            if !plugins.is_empty() {
                built.extend(guest::build_all(&plugins, &ws.out_dir, missing)?);
            }
        }
        Ok(built)
    }
}

/// Installs the wasm32-wasip2 standard library with rustup when it is missing.
fn ensure_wasm_target() -> anyhow::Result<()> {
    let sysroot = output(Command::new("rustc").args(["--print", "sysroot"]))?;
    if Path::new(sysroot.trim()).join("lib/rustlib").join(WASM_TARGET).exists() {
        return Ok(());
    }
    eprintln!("installing the {WASM_TARGET} target with rustup");
    run(Command::new("rustup").args(["target", "add", WASM_TARGET]))
        .with_context(|| format!("install it with `rustup target add {WASM_TARGET}`"))
}

fn build_workspace(ws: &PluginWorkspace) -> anyhow::Result<Vec<PathBuf>> {
    let wasm_target_dir = target_dir().join("wasm");
    let manifest = ws.manifest.to_str().context("non-UTF-8 path")?;
    eprintln!(
        "building plugins in {}",
        ws.manifest.parent().unwrap_or(&ws.manifest).display()
    );
    // On a terminal cargo shows its own live progress bar; elsewhere it would list every crate.
    let quiet = (!std::io::stderr().is_terminal()).then_some("--quiet");
    run(cargo()
        .args(["build", "--release"])
        .args(quiet)
        .args(["--target", WASM_TARGET, "--manifest-path", manifest])
        .arg("--target-dir")
        .arg(&wasm_target_dir))?;
    let metadata = output(cargo().args([
        "metadata",
        "--no-deps",
        "--format-version",
        "1",
        "--manifest-path",
        manifest,
    ]))?;
    let metadata: serde_json::Value = serde_json::from_str(&metadata)?;
    std::fs::create_dir_all(&ws.out_dir).with_context(|| format!("cannot create {}", ws.out_dir.display()))?;
    let release = wasm_target_dir.join(WASM_TARGET).join("release");
    let mut built = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        let Some(name) = package["name"].as_str() else { continue };
        let artifact = release.join(format!("{}.wasm", name.replace('-', "_")));
        let dest = ws.out_dir.join(format!("{name}.wasm"));
        std::fs::copy(&artifact, &dest)
            .with_context(|| format!("cannot copy {} to {}", artifact.display(), dest.display()))?;
        built.push(dest);
    }
    eprintln!("  {} plugins in {}", built.len(), ws.out_dir.display());
    Ok(built)
}
