//! `cargo xtask test`: plugins (their native tests, and the `cases.jsonl` of each plugin through
//! `rein plugin test`), the whole suite (after fetching the pretrained models its parity tests
//! read, `cargo xtask model smollm2-135m` and `gemma3-270m`), the Python package's pytest suite
//! against its wheel, a check that freshly scaffolded plugins in Rust, Python and JavaScript
//! build, pass their own tests and run in the host, and rein's CubeCL kernels on burn-wgpu.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use clap::Args;

use crate::build_plugins::BuildPlugins;
use crate::guest::{self, Lang, Missing};
use crate::model;
use crate::new_plugin::{Kind, NewPlugin};
use crate::workspace::{cargo, model_dir, output, plugin_dir, root, run, target_dir};

#[derive(Args)]
pub(crate) struct Test {
    /// Extra arguments for `cargo test` on the host workspace (e.g. a test name filter).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

impl Test {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        let mut phases = Phases::default();
        phases.begin("building the plugins");
        BuildPlugins {
            no_test_plugins: false,
            guests_optional: false,
        }
        .run()?;
        phases.begin("testing plugin logic natively (plugins/)");
        run(cargo()
            .args(["test", "--quiet", "--manifest-path"])
            .arg(root().join("plugins/Cargo.toml"))
            .arg("--target-dir")
            .arg(plugins_native_target()))?;
        // The `rein` binary runs each plugin's cases; from a cold cache its build (burn and
        // wasmtime) is the longest step, so cargo's progress is shown.
        phases.begin("building the rein binary");
        run(cargo().args(["build", "-p", "rein-cli"]).current_dir(root()))?;
        phases.begin("running each plugin's cases.jsonl");
        plugin_cases()?;
        phases.begin("fetching the models the tests read");
        // tests/gguf.rs checks the conversion of two real models against transformers' and
        // llama.cpp's figures. Converting runs `rein` through cargo, so it comes before the
        // tests' build (which replaces target/debug/rein with the tests' build of it).
        model::ensure("smollm2-135m")?;
        model::ensure("gemma3-270m")?;
        // Installing Python packages is network and disk, building is the cores: the one runs
        // beside the other (on a fresh machine the installs took over a minute and a half).
        phases.begin("building the workspace's tests, installing the Python tools they drive");
        let installing = std::thread::spawn(python_tools);
        // Cargo's progress is shown: from a cold cache this is most of the command's time.
        let built = run(cargo().args(["test", "--workspace", "--no-run"]).current_dir(root()));
        let installed = installing
            .join()
            .map_err(|_| anyhow::anyhow!("installing the tests' Python tools panicked"))?;
        built?;
        let PythonTools {
            openai,
            lm_eval,
            tensorboard,
        } = installed?;
        clear_test_scratch()?;
        phases.begin("testing the workspace");
        run(cargo()
            .args(["test", "--workspace", "--quiet"])
            .env("REIN_MODEL_DIR", model_dir())
            .env("REIN_OPENAI_PYTHONPATH", openai)
            .env("REIN_LM_EVAL_PYTHONPATH", lm_eval)
            .env("REIN_TENSORBOARD_PYTHONPATH", tensorboard)
            .args(&self.args)
            .current_dir(root()))?;
        if self.args.is_empty() {
            phases.begin("the Python package: its wheel in a fresh venv");
            crate::wheel::check()?;
            phases.begin("scaffolded plugins");
            scaffold_check()?;
            // A second build of rein-model and burn with burn-wgpu (a few minutes from cold).
            phases.begin("rein's CubeCL kernels against burn's ops, on wgpu");
            crate::cube_kernels::check()?;
        }
        phases.end();
        Ok(())
    }
}

/// The Python packages some tests drive, each a `PYTHONPATH`.
struct PythonTools {
    openai: PathBuf,
    lm_eval: PathBuf,
    tensorboard: PathBuf,
}

fn python_tools() -> anyhow::Result<PythonTools> {
    Ok(PythonTools {
        // crates/rein-cli/tests/serve.rs talks to `rein serve` with the openai Python client…
        openai: guest::openai_client()?,
        // … and lm-evaluation-harness's `local-completions` model to it (loglikelihood tasks).
        lm_eval: guest::lm_eval()?,
        // crates/rein-cli/tests/tensorboard.rs reads runs' event files with TensorBoard's reader.
        tensorboard: guest::tensorboard_reader()?,
    })
}

/// The test command's phases and how long each took, printed as each begins and as a table at
/// the end, so that a slow run says where its time went.
#[derive(Default)]
struct Phases {
    done: Vec<(&'static str, Duration)>,
    current: Option<(&'static str, Instant)>,
}

impl Phases {
    fn begin(&mut self, name: &'static str) {
        self.finish_current();
        let elapsed: Duration = self.done.iter().map(|(_, d)| *d).sum();
        eprintln!("=== {name} ({} s)", elapsed.as_secs());
        self.current = Some((name, Instant::now()));
    }

    fn finish_current(&mut self) {
        if let Some((name, started)) = self.current.take() {
            self.done.push((name, started.elapsed()));
        }
    }

    fn end(mut self) {
        self.finish_current();
        eprintln!("=== done; time by phase:");
        for (name, took) in &self.done {
            eprintln!("{:>7.1} s  {name}", took.as_secs_f64());
        }
        let total: Duration = self.done.iter().map(|(_, d)| *d).sum();
        eprintln!("{:>7.1} s  in all", total.as_secs_f64());
    }
}

/// What `<target>/tmp` keeps between runs: caches, each rebuilt only when its inputs change.
const SCRATCH_CACHES: [&str; 4] = [
    "component-cache",
    "rein-sandbox-venv",
    "gpu-bundle-binaries",
    "scaffold-check",
];

/// Removes what earlier test runs left in `<target>/tmp` (cargo's `CARGO_TARGET_TMPDIR`): the
/// integration tests name their run folders by process id so that runs never share one, and
/// keep them for inspection, so without this each run adds a gigabyte or more until the disk
/// is full. The folders of the last run stay until the next one starts.
fn clear_test_scratch() -> anyhow::Result<()> {
    let scratch = target_dir().join("tmp");
    let Ok(entries) = std::fs::read_dir(&scratch) else {
        return Ok(());
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", scratch.display()))?;
        if SCRATCH_CACHES.iter().any(|keep| entry.file_name() == *keep) {
            continue;
        }
        let path = entry.path();
        let result = if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        result.with_context(|| format!("removing an earlier test run's {}", path.display()))?;
        removed += 1;
    }
    if removed > 0 {
        eprintln!(
            "removed {removed} folders and files earlier test runs left in {}",
            scratch.display()
        );
    }
    Ok(())
}

/// Runs `rein plugin test` on every plugin in plugins/ that has a `cases.jsonl`.
fn plugin_cases() -> anyhow::Result<()> {
    let mut dirs: Vec<_> = std::fs::read_dir(root().join("plugins"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    dirs.sort();
    for dir in dirs.iter().filter(|d| d.join("cases.jsonl").is_file()) {
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .context("non-UTF-8 plugin name")?;
        eprintln!("testing {name} on {}", dir.join("cases.jsonl").display());
        let wasm = plugin_dir().join(format!("{name}.wasm"));
        let report = rein(&[
            "plugin",
            "test",
            path(&wasm)?,
            "--cases",
            path(&dir.join("cases.jsonl"))?,
        ])?;
        eprintln!("  {}", report.lines().last().unwrap_or_default());
    }
    Ok(())
}

/// Where the plugins' native tests build, and the scaffold check's after them (which so finds
/// their dependencies compiled): cargo's default for `plugins/` (`plugins/target`), or
/// `CARGO_TARGET_DIR` when that is set. Not rein's own target directory by default: the plugin
/// workspace names rein-pdk by an absolute path and the main workspace by a relative one, so the
/// two builds of it would share a file name and overwrite each other's.
fn plugins_native_target() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => target_dir(),
        _ => root().join("plugins/target"),
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
    // The plugins' lockfile pins the scaffolds' dependencies to the versions the plugins were
    // just built with, so their compiled artifacts are reused instead of a newer wit-bindgen,
    // syn and serde being resolved and compiled again.
    std::fs::copy(root().join("plugins/Cargo.lock"), scratch.join("Cargo.lock"))?;
    for (kind, lang, name) in [
        (Kind::Reward, Lang::Rust, "scaffold-reward"),
        (Kind::Env, Lang::Rust, "scaffold-env"),
        (Kind::Reward, Lang::Python, "scaffold-reward-py"),
        (Kind::Reward, Lang::Js, "scaffold-reward-js"),
        (Kind::Tool, Lang::Rust, "scaffold-tool"),
        (Kind::TextEnv, Lang::Rust, "scaffold-text-env"),
        (Kind::Tool, Lang::Python, "scaffold-tool-py"),
        (Kind::JudgeReward, Lang::Rust, "scaffold-judge"),
        (Kind::JudgeReward, Lang::Python, "scaffold-judge-py"),
    ] {
        NewPlugin {
            kind,
            name: name.into(),
            lang,
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
        .arg(plugins_native_target()))?;
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
    let guests = guest::build_all(&guest::find(&scratch)?, &scratch.join("out"), Missing::Fail)?;
    ensure!(guests.len() == 4, "the Python and JavaScript scaffolds were not found");
    let rust_with_cases =
        ["scaffold-tool", "scaffold-text-env", "scaffold-judge"].map(|name| (name.to_string(), built(name)));
    let guests = guests.iter().map(|wasm| {
        let name = wasm
            .file_stem()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        (name, wasm.clone())
    });
    for (name, wasm) in guests.chain(rust_with_cases) {
        let cases = scratch.join(&name).join("cases.jsonl");
        let report = rein(&["plugin", "test", path(&wasm)?, "--cases", path(&cases)?])?;
        ensure!(report.contains("3 passed, 0 failed"), "scaffolded {name}: {report}");
    }
    eprintln!(
        "  scaffolded reward, judged reward, env, tool and text-env plugins (Rust, Python, JavaScript) build, pass their tests and run"
    );
    Ok(())
}

fn path(p: &Path) -> anyhow::Result<&str> {
    p.to_str().context("non-UTF-8 path")
}

/// `rein args…`, its compiled components cached where the workspace's tests cache theirs
/// (`<target>/tmp/component-cache`), so that they load what the plugin cases compiled.
fn rein(args: &[&str]) -> anyhow::Result<String> {
    output(
        cargo()
            .args(["run", "--quiet", "-p", "rein-cli", "--"])
            .args(args)
            .env("REIN_CACHE_DIR", target_dir().join("tmp/component-cache"))
            .current_dir(root()),
    )
}
