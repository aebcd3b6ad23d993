//! GGUF, the file format of llama.cpp, Ollama and LM Studio: reading a model file and turning it
//! into a model directory in Hugging Face format that rein-model loads.
//!
//! Owns the container format ([`GgufFile`]), ggml's quantised storage types ([`GgmlType`]), the
//! mapping to Hugging Face names, config and tokenizer files ([`Converted`]), and the plain files
//! of such a directory: `config.json` ([`LmConfig`]), f32 safetensors ([`tensors_file`]) and
//! rein's quantised codes beside them ([`packed_file`]).
//!
//! **Architecture invariant:** plain data only. No tensor library (burn), no model code: a
//! converted directory goes through `rein_model::lm::load` like any other. Quantised weights
//! are dequantised to f32 once, at conversion.

mod config;
mod convert;
mod family;
mod file;
pub mod packed_file;
mod quant;
pub mod tensors_file;
mod tokenizer;

use std::path::PathBuf;

pub use config::{LmConfig, RopeScaling, TokenIds, UnsupportedConfig};
pub use convert::{Converted, convert_file};
pub use family::{Family, GateActivation, LayerAttention, MoeConfig};
pub use file::{GgufFile, TensorInfo, Value};
pub use quant::GgmlType;

/// Why a GGUF file cannot be read or converted. Each names the file and the key or tensor.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file cannot be read or an output cannot be written.
    #[error("{}: {reason}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        reason: String,
    },
    /// The bytes are not a well-formed GGUF file.
    #[error("{}: not a valid GGUF file: {reason}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        reason: String,
    },
    /// A metadata entry is missing, malformed or unsupported.
    #[error("{}: metadata `{key}`: {reason}", path.display())]
    Metadata {
        /// The file.
        path: PathBuf,
        /// The metadata key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A tensor is malformed, unsupported or has no Hugging Face counterpart.
    #[error("{}: tensor `{name}`: {reason}", path.display())]
    Tensor {
        /// The file.
        path: PathBuf,
        /// The tensor's GGUF name.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

/// The checkpoint directory for `path`: `path` itself, unless it is a `.gguf` file, which is
/// converted once into a cache directory (under the system's temporary directory, keyed by the
/// file's name, size and modification time) whose path is returned.
pub fn checkpoint_dir(path: &std::path::Path) -> Result<PathBuf, GgufError> {
    let is_gguf = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if !is_gguf || path.is_dir() {
        return Ok(path.to_path_buf());
    }
    let io = |path: &std::path::Path, e: std::io::Error| GgufError::Io {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let meta = std::fs::metadata(path).map_err(|e| io(path, e))?;
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let cache = std::env::temp_dir().join("rein-gguf");
    let dir = cache.join(format!("{stem}-{}-{modified}", meta.len()));
    let complete =
        |dir: &std::path::Path| dir.join("config.json").is_file() && dir.join(crate::packed_file::FILE).is_file();
    if complete(&dir) {
        return Ok(dir);
    }
    // Convert beside the final place and rename, so a crash never leaves a half directory that
    // looks complete.
    let partial = cache.join(format!(".{stem}-{}.partial", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    convert_file(path, &partial)?;
    if dir.is_dir() && !complete(&dir) {
        // Converted by an older rein, without the packed weights.
        let _ = std::fs::remove_dir_all(&dir);
    }
    match std::fs::rename(&partial, &dir) {
        Ok(()) => Ok(dir),
        // Another process finished first: use its copy.
        Err(_) if complete(&dir) => {
            let _ = std::fs::remove_dir_all(&partial);
            Ok(dir)
        }
        Err(e) => Err(io(&dir, e)),
    }
}
