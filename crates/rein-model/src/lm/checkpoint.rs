//! Loading and saving any model rein runs by its checkpoint directory: a causal LM
//! (`model_dir.rs`'s layout, or a `.gguf` file), or a vision-language model (Idefics3's layout,
//! `vision/idefics3.rs`), told apart by `config.json`.

use std::path::Path;

use super::LoadError;
use super::model::CausalLm;
use super::model_dir::{load_causal_lm, save_causal_lm};
use crate::backend::ReinBackend;
use crate::vision::{is_idefics3, is_qwen2_vl, load_idefics3, save_idefics3};

/// Loads the model in `dir` (a checkpoint directory or a `.gguf` file) onto `device`: a causal
/// LM, or a vision-language model (a causal LM with its image side, [`CausalLm::vision`]).
pub fn load<B: ReinBackend>(dir: &Path, device: &B::Device) -> Result<CausalLm<B>, LoadError> {
    let dir = &super::locate(dir)?;
    if is_qwen2_vl(dir) {
        return Err(LoadError::Unsupported {
            field: "architectures".into(),
            reason: "Qwen2VLForConditionalGeneration loads as rein_model::vision::Qwen2Vl; the sampler, \
                training and serving run Idefics3 vision-language models"
                .into(),
        });
    }
    match is_idefics3(dir) {
        true => load_idefics3(dir, device),
        false => load_causal_lm(dir, device),
    }
}

/// Writes `model` to `dir` as a model directory in Hugging Face format (`config.json`,
/// `model.safetensors`, f32), loadable by transformers: Idefics3's layout for a model with an
/// image side. Tokenizer and processor files are the caller's to copy.
///
/// LoRA adapters are merged into the weights they adapt ([`CausalLm::merged`]); save them on
/// their own with [`super::peft::save_adapter`].
pub fn save<B: ReinBackend>(model: &CausalLm<B>, dir: &Path) -> Result<(), LoadError> {
    let model = &model.merged();
    match &model.vision {
        Some(vision) => save_idefics3(model, vision, dir),
        None => save_causal_lm(model, dir),
    }
}
