//! The part of `cargo xtask test` that runs rein's CubeCL kernels (rein-model's `backend/cube/`,
//! the ones CUDA runs) on burn-wgpu: each kernel against burn's ops (values and gradients), then
//! every parity row of `rein-gpu-check` (logits and greedy tokens against transformers, the GRPO
//! step against PyTorch, ...) with the whole model on wgpu. Without a GPU, wgpu runs on Mesa's
//! lavapipe, a Vulkan driver on the CPU; a machine with no Vulkan driver at all skips this and
//! says how to install one, unless `REIN_REQUIRE_VULKAN` is set (CI sets it).

use std::path::Path;
use std::process::Command;

use anyhow::bail;

use crate::workspace::{cargo, root, run, target_dir};

/// Set (to anything): a machine without a Vulkan driver fails the test command instead of
/// skipping the kernels' tests.
const REQUIRE: &str = "REIN_REQUIRE_VULKAN";

/// Where the Vulkan loader looks for drivers' manifests (the Khronos loader's defaults on Linux).
const ICD_DIRS: [&str; 4] = [
    "/usr/share/vulkan/icd.d",
    "/etc/vulkan/icd.d",
    "/usr/local/share/vulkan/icd.d",
    "/usr/local/etc/vulkan/icd.d",
];

pub(crate) fn check() -> anyhow::Result<()> {
    if let Some(missing) = vulkan_missing() {
        let install = "on Debian or Ubuntu: apt-get install mesa-vulkan-drivers (lavapipe, Vulkan on the CPU)";
        if std::env::var_os(REQUIRE).is_some() {
            bail!("{REQUIRE} is set but {missing}; {install}");
        }
        eprintln!("SKIPPED: rein's CubeCL kernels were not tested: {missing}; {install}");
        return Ok(());
    }
    let runtime_dir = target_dir().join("tmp/xdg-runtime");
    std::fs::create_dir_all(&runtime_dir)?;
    let on_wgpu = |command: &mut Command| {
        command.current_dir(root());
        // wgpu's Vulkan instance asks for a window system it never uses; without a runtime
        // directory it warns on every start.
        if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
            command.env("XDG_RUNTIME_DIR", &runtime_dir);
        }
    };
    let mut kernels = cargo();
    kernels.args([
        "test",
        "--quiet",
        "-p",
        "rein-model",
        "--features",
        "wgpu",
        "--lib",
        "backend::cube::",
    ]);
    on_wgpu(&mut kernels);
    run(&mut kernels)?;
    // Exits with failure if any row fails (the bf16 rows are not run: WGSL has no bf16).
    let mut parity = cargo();
    parity
        .args(["run", "--quiet", "-p", "rein-gpu-check", "--features", "wgpu", "--"])
        .args(["--device", "wgpu", "--fixtures"])
        .arg(root().join("tests/fixtures"))
        .arg("--out")
        .arg(target_dir().join("tmp/gpu-check-wgpu.json"));
    on_wgpu(&mut parity);
    run(&mut parity)
}

/// Why Vulkan cannot run here, if it cannot: no loader library, or no driver manifest.
fn vulkan_missing() -> Option<String> {
    let loader = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
    ]
    .iter()
    .any(|dir| Path::new(dir).join("libvulkan.so.1").exists());
    if !loader {
        return Some("the Vulkan loader (libvulkan.so.1) is not installed".into());
    }
    let listed = std::env::var_os("VK_ICD_FILENAMES").is_some() || std::env::var_os("VK_DRIVER_FILES").is_some();
    let installed = ICD_DIRS.iter().any(|dir| {
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .any(|e| e.path().extension().is_some_and(|x| x == "json"))
            })
            .unwrap_or(false)
    });
    if !listed && !installed {
        return Some(format!(
            "no Vulkan driver is installed (no manifest in {})",
            ICD_DIRS.join(", ")
        ));
    }
    None
}
