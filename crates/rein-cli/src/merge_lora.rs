//! `rein merge-lora --base MODEL --adapter DIR --out DIR`: a LoRA adapter (PEFT's format, as
//! rein's runs write it to `<run>/adapter/`) folded into its base model, `W + (α/r)·A·B`, as
//! one model directory in Hugging Face format, which any tool loads.

use std::path::PathBuf;

use clap::Args;
use rein_model::lm::{LmTokenizer, load, locate, peft};

#[derive(Args, Debug)]
pub(crate) struct MergeLoraArgs {
    /// The base model: a Hugging Face directory, a `.gguf` file or a fetched model's name.
    #[arg(long)]
    base: PathBuf,
    /// The adapter directory (`adapter_config.json`, `adapter_model.safetensors`).
    #[arg(long)]
    adapter: PathBuf,
    /// The directory to write the merged model and the base's tokenizer to.
    #[arg(long)]
    out: PathBuf,
}

impl MergeLoraArgs {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        let device = Default::default();
        let base_dir = locate(&self.base)?;
        let base = load::<rein_model::Cpu>(&base_dir, &device)?;
        let adapted = peft::load_adapter(base, &self.adapter, &device)?;
        let spec = adapted.lora.as_ref().map(|l| l.spec().clone());
        // `save` merges the adapters into the weights they adapt.
        rein_model::lm::save(&adapted, &self.out)?;
        // The base's tokenizer, when it has one (a bare checkpoint may not).
        if base_dir.join("tokenizer.json").is_file() {
            LmTokenizer::load(&base_dir, &adapted.config().eos_ids())?.save(&self.out)?;
        }
        if let Some(spec) = spec {
            println!(
                "merged rank-{} adapters on {} into {} (written to {})",
                spec.rank,
                spec.target_modules().join(", "),
                self.base.display(),
                self.out.display()
            );
        }
        Ok(())
    }
}
