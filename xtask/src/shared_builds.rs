//! The builds `cargo xtask test` makes share their compiled dependencies. Cargo compiles a
//! crate once per feature set, and resolves features per invocation: the main job's build
//! (`cargo build -p rein-cli`), the tests' (`cargo test --workspace`) and the wheel's (maturin
//! builds `rein-py` alone) each settle them for their own packages. One crate that settles
//! differently recompiles itself and everything above it — wasmtime, cranelift, tokio: the
//! wheel's build alone took 7½ of the 29 minutes a fresh 2-core machine's test command took
//! before these checks. The fix,
//! where one fails, is a "workspace hack" (cargo-hakari's term): the crate that builds alone
//! names the features the workspace turns on (see rein-plugin's and rein-py's manifests).

#![cfg(test)]

use std::collections::BTreeSet;

use crate::workspace::{cargo, root};

/// Each crate as `cargo tree` resolves it for `args`: its name, version and features.
fn resolved(args: &[&str]) -> BTreeSet<String> {
    let out = cargo()
        .args(["tree", "--offline", "--prefix", "none", "--format", "{p} [{f}]"])
        .args(args)
        .current_dir(root())
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| line.replace(" (*)", "").replace(" (proc-macro)", ""))
        .collect()
}

#[test]
fn the_main_job_and_the_wheel_resolve_features_as_the_tests_do() {
    let tests = resolved(&["--workspace", "--edges", "normal,build,dev"]);
    for (build, package) in [("the main job's build", "rein-cli"), ("the wheel's build", "rein-py")] {
        let own = resolved(&["--package", package, "--edges", "normal,build"]);
        let differ: Vec<&String> = own.difference(&tests).collect();
        assert!(
            differ.is_empty(),
            "{build} (-p {package}) resolves these crates' features unlike `cargo test --workspace`, so \
             they and every crate above them compile twice: {differ:#?}\nname the workspace's \
             features for them in {package}'s manifest (its workspace-hack section)"
        );
    }
}
