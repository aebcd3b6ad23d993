//! `rein convert gguf FILE OUT_DIR`: a llama.cpp GGUF model as a model directory in Hugging Face format.

use std::path::PathBuf;
use std::time::Instant;

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub(crate) enum ConvertCommand {
    /// Dequantise a GGUF model (Q8_0, Q4_0/1, Q5_0/1, Q4_K/Q5_K/Q6_K, F16/BF16/F32) into a
    /// Hugging Face directory: config.json, model.safetensors (f32), tokenizer.json and
    /// tokenizer_config.json (with the chat template).
    Gguf {
        /// The `.gguf` file.
        file: PathBuf,
        /// The directory to write (created if missing).
        out_dir: PathBuf,
    },
}

impl ConvertCommand {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        match self {
            ConvertCommand::Gguf { file, out_dir } => {
                let started = Instant::now();
                let config = rein_gguf::convert_file(file, out_dir)?;
                println!(
                    "wrote {} ({} layers, hidden {}, vocab {}) in {:.1} s",
                    out_dir.display(),
                    config.num_hidden_layers,
                    config.hidden_size,
                    config.vocab_size,
                    started.elapsed().as_secs_f64()
                );
                Ok(())
            }
        }
    }
}
