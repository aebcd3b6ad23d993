//! Causal language models — Llama (SmolLM), Mistral, Qwen2, Qwen3, Qwen3-MoE, Gemma 2 and
//! Gemma 3 — loaded from and saved to model directories in Hugging Face format.
//!
//! A checkpoint directory holds `config.json`, `model.safetensors` (or shards listed in
//! `model.safetensors.index.json`), `tokenizer.json` and optionally `tokenizer_config.json`
//! (special tokens, chat template). f16 and bf16 weights are upcast to f32 on load. A `.gguf`
//! file is accepted wherever a directory is: it is converted once ([`rein_gguf`]); so is the
//! name of a model fetched with `cargo xtask model NAME` ([`locate`]). [`lora`] adds low-rank
//! adapters to a model, [`peft`] reads and writes them as PEFT does.

mod cache;
mod checkpoint;
mod classifier;
mod classifier_config;
mod context;
mod feed_forward;
mod fused;
mod init;
pub(crate) mod json_file;
mod locate;
pub mod lora;
mod model;
pub(crate) mod model_dir;
mod moe;
pub mod peft;
mod rms_norm;
mod rope;
mod tojson;
mod token_classifier;
mod tokenizer;

use std::path::PathBuf;

pub use cache::{KvCache, LayerCache, kv_cache_bytes};
pub use checkpoint::{load, save};
pub use classifier::SequenceClassifier;
pub use context::Context;
pub use feed_forward::FeedForward;
pub use fused::{FusedProjections, PackedWeights};
pub use init::LmInit;
pub use locate::{locate, model_dir};
pub use model::{Attention, CausalLm, DecoderLayer, HEAD_CHUNK_BYTES, MlpBlock};
pub use moe::{MixtureOfExperts, Routing, UNROUTED, top_k};
pub use rein_gguf::{Family, GateActivation, LayerAttention, LmConfig, MoeConfig, RopeScaling, TokenIds};
pub use rms_norm::RmsNorm;
pub(crate) use rope::base_frequencies;
pub use rope::{Rope, inverse_frequencies};
pub use token_classifier::TokenClassifier;
pub use tokenizer::{ChatMessage, EncodedSteps, LmTokenizer};

/// Why a checkpoint cannot be loaded or saved. Each names the file, tensor or field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// A file cannot be read or written.
    #[error("{}: {reason}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        reason: String,
    },
    /// A JSON file is malformed.
    #[error("{}: {reason}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's reason.
        reason: String,
    },
    /// The architecture uses something rein does not implement.
    #[error("config.json: `{field}`: {reason}")]
    Unsupported {
        /// The config field.
        field: String,
        /// What is unsupported.
        reason: String,
    },
    /// A weight the architecture needs is not in the checkpoint.
    #[error("missing tensor `{name}` (looked in {})", files.join(", "))]
    MissingTensor {
        /// The tensor's name.
        name: String,
        /// The files searched.
        files: Vec<String>,
    },
    /// Weights in the checkpoint that the architecture does not use.
    #[error("unexpected tensors (is this the right architecture?): {}", names.join(", "))]
    UnexpectedTensors {
        /// Their names (up to ten).
        names: Vec<String>,
    },
    /// A weight has the wrong shape for the config.
    #[error("tensor `{name}` has shape {found:?}, but config.json implies {expected:?}")]
    Shape {
        /// The tensor's name.
        name: String,
        /// The shape the config implies.
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },
    /// A weight is stored in a dtype rein cannot read.
    #[error("tensor `{name}` is {dtype}; supported: F32, F16, BF16, F64")]
    Dtype {
        /// The tensor's name.
        name: String,
        /// Its dtype.
        dtype: String,
    },
    /// The safetensors data is malformed.
    #[error("{}: not a valid safetensors file: {reason}", path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The parser's reason.
        reason: String,
    },
    /// A GGUF model file cannot be converted.
    #[error(transparent)]
    Gguf(#[from] rein_gguf::GgufError),
    /// A LoRA adapter cannot be read, written or applied to this model.
    #[error("{}: {reason}", path.display())]
    Adapter {
        /// The adapter's file or directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The tokenizer cannot be loaded or does not fit the model.
    #[error("{}: {reason}", path.display())]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl From<rein_gguf::UnsupportedConfig> for LoadError {
    fn from(e: rein_gguf::UnsupportedConfig) -> Self {
        Self::Unsupported {
            field: e.field,
            reason: e.reason,
        }
    }
}
