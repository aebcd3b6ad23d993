//! `cargo xtask gpu-bundle`: everything a GPU machine without Rust or network needs to prove
//! rein's CUDA path in one command — `rein-gpu-check` and `rein` built with `--features cuda`
//! stripped and compressed, the fixtures with the reference results, the PyTorch peer, the recipes and
//! plugins PPO on CartPole needs, and `run.sh`.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;

use crate::build_plugins::BuildPlugins;
use crate::workspace::{cargo, output, plugin_dir, root, run, target_dir};

/// The most the bundle may weigh: what is carried to a GPU machine is capped at 64 MiB.
const MAX_BYTES: u64 = 60 * 1024 * 1024;

/// The fixtures the parity rows read, relative to `tests/fixtures/`.
const FIXTURES: &[&str] = &[
    "lm/qwen2-gqa",
    "lm/qwen2-gqa.expected.safetensors",
    "lm/qwen2-gqa.bf16.safetensors",
    "lm/qwen2-tied",
    "lm/qwen2-tied.expected.safetensors",
    "lm/qwen2-tied.bf16.safetensors",
    "lm/llama",
    "lm/llama.expected.safetensors",
    "lm/llama.bf16.safetensors",
    "lm/llama-bf16-sharded",
    "lm/llama-bf16-sharded.expected.safetensors",
    "lm/llama-bf16-sharded.bf16.safetensors",
    "torch_grpo_step.json",
    "torch_grpo_step.safetensors",
    "lora/base",
    "lora/adapter-all",
];

/// The plugins the bundle's `rein` runs.
const PLUGINS: &[&str] = &["cartpole"];

#[derive(Args)]
pub(crate) struct GpuBundle {
    /// Where to write the bundle (default: `<target>/gpu-bundle`, or `<target>/gpu-bundle-dev`
    /// with `--dev`).
    pub(crate) dir: Option<PathBuf>,
    /// Leave `rein` out (only `rein-gpu-check` and what it reads).
    #[arg(long)]
    pub(crate) no_rein: bool,
    /// Build the binaries in the dev profile, to check the bundle's files, libraries and refusal
    /// without a release build (minutes instead of about 40 from a cold cache); a GPU machine
    /// should run the release build, the default.
    #[arg(long)]
    pub(crate) dev: bool,
    /// Then check the bundle as CI does: every file `run.sh` reads is there, the binaries link
    /// nothing beyond the C runtime, and without a GPU `run.sh` refuses (see [`check`]).
    #[arg(long)]
    pub(crate) check: bool,
}

impl GpuBundle {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        let default = if self.dev { "gpu-bundle-dev" } else { "gpu-bundle" };
        let dir = self.dir.clone().unwrap_or_else(|| target_dir().join(default));
        let mut binaries = vec!["rein-gpu-check"];
        if !self.no_rein {
            binaries.push("rein");
            BuildPlugins::for_running().run()?;
        }
        let profile = if self.dev { "debug" } else { "release" };
        eprintln!("building {} with --features cuda ({profile})", binaries.join(" and "));
        let mut build = cargo();
        build.arg("build");
        if !self.dev {
            build.arg("--release");
        }
        build.args(["-p", "rein-gpu-check", "--features", "rein-gpu-check/cuda"]);
        if !self.no_rein {
            build.args(["-p", "rein-cli", "--features", "rein-cli/cuda"]);
        }
        run(&mut build)?;

        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for binary in &binaries {
            let built = target_dir().join(profile).join(binary);
            let copy = dir.join(binary);
            std::fs::copy(&built, &copy).with_context(|| format!("copying {}", built.display()))?;
            run(std::process::Command::new("strip").arg(&copy))?;
            // Compressed, the two binaries weigh a quarter: `run.sh` unpacks them.
            run(std::process::Command::new("xz").args(["-6", "-T2", "-f"]).arg(&copy))?;
        }
        let fixtures = root().join("tests/fixtures");
        for item in FIXTURES {
            copy_tree(&fixtures.join(item), &dir.join("fixtures").join(item))?;
        }
        copy_tree(&root().join("benches/peers/gpu_torch.py"), &dir.join("gpu_torch.py"))?;
        write(&dir.join("run.sh"), include_str!("gpu_bundle/run.sh"))?;
        write(&dir.join("summary.py"), include_str!("gpu_bundle/summary.py"))?;
        write(&dir.join("profile.py"), include_str!("gpu_bundle/profile.py"))?;
        if !self.no_rein {
            copy_tree(&root().join("recipes"), &dir.join("recipes"))?;
            for plugin in PLUGINS {
                let wasm = format!("{plugin}.wasm");
                copy_tree(&plugin_dir().join(&wasm), &dir.join("plugins").join(&wasm))?;
            }
        }
        executable(&dir.join("run.sh"))?;
        let bytes = size(&dir)?;
        let mib = bytes as f64 / 1024.0 / 1024.0;
        if bytes > MAX_BYTES {
            bail!(
                "{} weighs {mib:.1} MiB, over the {} MiB a GPU machine is carried",
                dir.display(),
                MAX_BYTES / 1024 / 1024
            );
        }
        println!("{}: {mib:.1} MiB; on the GPU machine: bash run.sh", dir.display());
        if self.check {
            check(&dir)?;
        }
        Ok(())
    }
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Makes `path` executable by everyone (a no-op off Unix).
fn executable(path: &Path) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("making {} executable", path.display()))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// Copies a file, or a folder with everything under it.
fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    if from.is_dir() {
        std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
        for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
            let entry = entry?;
            copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
        return Ok(());
    }
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::copy(from, to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// The bytes of every file under `dir`.
fn size(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// The shared libraries the bundle's binaries may link: the C runtime every Linux has. CUDA's
/// own (the driver, NVRTC) are opened at run time, so a machine without them still starts.
const ALLOWED_LIBRARIES: &[&str] = &[
    "linux-vdso.so.1",
    "libgcc_s.so.1",
    "libm.so.6",
    "libc.so.6",
    "ld-linux-x86-64.so.2",
];

/// What `cargo xtask gpu-bundle --check` checks of a bundle written to `dir`: every file `run.sh` reads is
/// there, the binaries link nothing beyond the C runtime, `rein-gpu-check --cublas` says what it
/// finds, and without a GPU `run.sh` says that nothing was checked and fails.
fn check(dir: &Path) -> anyhow::Result<()> {
    let mut expected: Vec<String> = [
        "run.sh",
        "summary.py",
        "profile.py",
        "gpu_torch.py",
        "rein-gpu-check.xz",
        "rein.xz",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    expected.extend(FIXTURES.iter().map(|f| format!("fixtures/{f}")));
    expected.extend(PLUGINS.iter().map(|p| format!("plugins/{p}.wasm")));
    expected.push("recipes/ppo-cartpole.toml".into());
    for file in &expected {
        anyhow::ensure!(dir.join(file).exists(), "the GPU bundle {} lacks {file}", dir.display());
    }
    let unpacked = target_dir().join("tmp/gpu-bundle-binaries");
    std::fs::create_dir_all(&unpacked)?;
    for binary in ["rein-gpu-check", "rein"] {
        let out = unpacked.join(binary);
        let file = std::fs::File::create(&out).with_context(|| format!("creating {}", out.display()))?;
        run(std::process::Command::new("xz")
            .args(["-d", "-c"])
            .arg(dir.join(format!("{binary}.xz")))
            .stdout(file))?;
        executable(&out)?;
        let ldd = output(std::process::Command::new("ldd").arg(&out))?;
        for line in ldd.lines() {
            let library = line.split_whitespace().next().unwrap_or("");
            let name = library.rsplit('/').next().unwrap_or(library);
            anyhow::ensure!(
                ALLOWED_LIBRARIES.contains(&name),
                "{binary} in the GPU bundle links {library}, which a GPU machine may lack:\n{ldd}"
            );
        }
    }
    cublas_refusal(&unpacked.join("rein-gpu-check"))?;
    let gpu = std::process::Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("GPU"));
    if !gpu {
        let out = std::process::Command::new("bash")
            .arg(dir.join("run.sh"))
            .output()
            .context("running the bundle's run.sh")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        anyhow::ensure!(
            out.status.code() == Some(2) && stdout.contains("no CUDA device found: nothing was checked"),
            "without a GPU, run.sh must say that nothing was checked and exit 2; it exited {:?}:\n{stdout}",
            out.status.code()
        );
    }
    Ok(())
}

/// `rein-gpu-check --cublas` (at `binary`) names cuBLAS's version where the library opens, and
/// otherwise the library it looked for and what to do: the line `run.sh` prints.
fn cublas_refusal(binary: &Path) -> anyhow::Result<()> {
    let out = std::process::Command::new(binary)
        .arg("--cublas")
        .output()
        .with_context(|| format!("running {} --cublas", binary.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let said = match out.status.code() {
        Some(0) => stdout.starts_with("cuBLAS "),
        Some(1) => ["libcublas.so", "LD_LIBRARY_PATH", "nvidia-cublas"]
            .iter()
            .all(|needed| stdout.contains(needed)),
        _ => false,
    };
    anyhow::ensure!(
        said,
        "rein-gpu-check --cublas must print cuBLAS's version (exit 0), or the library it looked for and \
         how to install it (exit 1); it exited {:?}:\n{stdout}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("rein-gpu-check --cublas: {}", stdout.trim());
    Ok(())
}
