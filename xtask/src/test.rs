//! `cargo xtask test`: plugins, the whole suite, and a check that freshly scaffolded plugins
//! build, pass their own tests and run in the host.

use std::path::Path;

use anyhow::{Context, ensure};
use clap::Args;

use crate::build_plugins::BuildPlugins;
use crate::new_plugin::{Kind, NewPlugin};
use crate::workspace::{cargo, output, root, run, target_dir};

#[derive(Args)]
pub(crate) struct Test {
    /// Extra arguments for `cargo test` on the host workspace (e.g. a test name filter).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

impl Test {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        BuildPlugins { no_test_plugins: false }.run()?;
        eprintln!("testing plugin logic natively (plugins/)");
        run(cargo()
            .args(["test", "--quiet", "--manifest-path"])
            .arg(root().join("plugins/Cargo.toml")))?;
        eprintln!("testing the workspace");
        run(cargo()
            .args(["test", "--workspace", "--quiet"])
            .args(&self.args)
            .current_dir(root()))?;
        if self.args.is_empty() {
            scaffold_check()?;
        }
        Ok(())
    }
}

/// Scaffolds one plugin of each kind in a scratch plugin workspace, runs their own tests,
/// builds them for wasm32-wasip2 and runs them through the `rein` CLI.
fn scaffold_check() -> anyhow::Result<()> {
    eprintln!("checking that `cargo xtask new-plugin` scaffolds work at once");
    let scratch = target_dir().join("tmp/scaffold-check");
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch)?;
    }
    std::fs::create_dir_all(&scratch)?;
    let plugins_manifest = std::fs::read_to_string(root().join("plugins/Cargo.toml"))?;
    let members_at = plugins_manifest
        .find("members = [")
        .context("plugins/Cargo.toml has no members list")?;
    let members_end = members_at
        + plugins_manifest[members_at..]
            .find(']')
            .context("unterminated members")?
        + 1;
    let pdk = root().join("crates/rein-pdk");
    let manifest = format!(
        "{}members = []{}",
        &plugins_manifest[..members_at],
        &plugins_manifest[members_end..]
    )
    .replace(
        "path = \"../crates/rein-pdk\"",
        &format!("path = {:?}", pdk.display().to_string()),
    );
    std::fs::write(scratch.join("Cargo.toml"), manifest)?;
    for (kind, name) in [(Kind::Reward, "scaffold-reward"), (Kind::Env, "scaffold-env")] {
        NewPlugin {
            kind,
            name: name.into(),
            dir: Some(scratch.clone()),
        }
        .run()?;
    }
    let manifest = scratch.join("Cargo.toml");
    let wasm_target = target_dir().join("wasm");
    run(cargo()
        .args(["test", "--quiet", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&wasm_target))?;
    run(cargo()
        .args([
            "build",
            "--quiet",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--manifest-path",
        ])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&wasm_target))?;
    let built = |name: &str| {
        wasm_target
            .join("wasm32-wasip2/release")
            .join(format!("{}.wasm", name.replace('-', "_")))
    };
    let groups = scratch.join("groups.jsonl");
    std::fs::write(
        &groups,
        r#"{"prompt": "Capital of France?", "completions": ["Paris!", "Rome"], "reference": "Paris"}"#,
    )?;
    let scores = rein(&[
        "plugin",
        "score",
        path(&built("scaffold-reward"))?,
        "--input",
        path(&groups)?,
    ])?;
    ensure!(
        scores.contains("\"scores\":[1.0,0.0]"),
        "scaffolded reward scored {scores}"
    );
    let rollout = rein(&[
        "env",
        "rollout",
        path(&built("scaffold-env"))?,
        "--actions",
        "1,1,1,1,1,1,1,1",
    ])?;
    ensure!(
        rollout.contains("\"terminated\":true"),
        "scaffolded env never reached its goal: {rollout}"
    );
    eprintln!("  scaffolded reward and env plugins build, pass their tests and run");
    Ok(())
}

fn path(p: &Path) -> anyhow::Result<&str> {
    p.to_str().context("non-UTF-8 path")
}

fn rein(args: &[&str]) -> anyhow::Result<String> {
    output(
        cargo()
            .args(["run", "--quiet", "-p", "rein-cli", "--"])
            .args(args)
            .current_dir(root()),
    )
}
