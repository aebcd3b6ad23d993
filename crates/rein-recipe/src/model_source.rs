//! Where a language-model recipe's weights and tokenizer come from: `[model]`'s `path`,
//! `architecture` and `tokenizer`, resolved into one answer or refused naming the key.

use crate::ModelSection;
use crate::error::{Broken, broken};

/// A language model's weights and tokenizer as a recipe names them (paths relative to the
/// recipe, or a fetched model's name).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelSource<'a> {
    /// Where the weights come from.
    pub weights: Weights<'a>,
    /// The tokenizer's directory: `model.tokenizer`, else `model.path`.
    pub tokenizer: &'a str,
}

/// Where a language model's weights come from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Weights<'a> {
    /// A Hugging Face model directory, a `.gguf` file or a fetched model's name (`model.path`).
    Path(&'a str),
    /// A `config.json`-style table to initialise from scratch (`model.architecture`).
    Architecture(&'a toml::Table),
}

/// `model`'s source: `path` (with `tokenizer` or its own), or `architecture` with `tokenizer`.
pub(crate) fn model_source(model: &ModelSection) -> Result<ModelSource<'_>, Broken> {
    let weights = match (&model.path, &model.architecture) {
        (Some(path), _) => Weights::Path(path),
        (None, Some(table)) => Weights::Architecture(table),
        (None, None) => {
            return Err(broken(
                "model",
                "set model.path (a Hugging Face model directory, a .gguf file or a fetched model's name) \
                 or model.architecture",
            ));
        }
    };
    let tokenizer = (model.tokenizer.as_deref()).or(model.path.as_deref()).ok_or_else(|| {
        broken(
            "model.tokenizer",
            "name a tokenizer directory (or a model directory that has one)",
        )
    })?;
    Ok(ModelSource { weights, tokenizer })
}
