//! Loading and saving any model rein runs by its checkpoint directory: a causal LM
//! (`model_dir.rs`'s layout, or a `.gguf` file), or a vision-language model (Idefics3's layout,
//! `vision/idefics3.rs`; Qwen2-VL's and Qwen2.5-VL's, `vision/qwen2_vl.rs`), told apart by
//! `config.json`.

use std::path::Path;

use super::LoadError;
use super::model::CausalLm;
use super::model_dir::{load_causal_lm, save_causal_lm};
use crate::backend::ReinBackend;
use crate::vision::{ImageSide, is_idefics3, is_qwen2_vl, load_idefics3, load_qwen2_vl, save_idefics3, save_qwen2_vl};

/// Loads the model in `dir` (a checkpoint directory or a `.gguf` file) onto `device`: a causal
/// LM, or a vision-language model (a causal LM with its image side, [`CausalLm::vision`]).
pub fn load<B: ReinBackend>(dir: &Path, device: &B::Device) -> Result<CausalLm<B>, LoadError> {
    let dir = &super::locate(dir)?;
    match (is_idefics3(dir), is_qwen2_vl(dir)) {
        (true, _) => load_idefics3(dir, device),
        (_, true) => load_qwen2_vl(dir, device),
        _ => load_causal_lm(dir, device),
    }
}

/// Writes `model` to `dir` as a model directory in Hugging Face format (`config.json`,
/// `model.safetensors`, f32), loadable by transformers: its family's layout for a model with an
/// image side. Tokenizer and processor files are the caller's to copy.
///
/// LoRA adapters are merged into the weights they adapt ([`CausalLm::merged`]); save them on
/// their own with [`super::peft::save_adapter`].
pub fn save<B: ReinBackend>(model: &CausalLm<B>, dir: &Path) -> Result<(), LoadError> {
    let model = &model.merged();
    match &model.vision {
        Some(ImageSide::Idefics3(vision)) => save_idefics3(model, vision, dir),
        Some(ImageSide::Qwen2Vl(side)) => save_qwen2_vl(model, side, dir),
        None => save_causal_lm(model, dir),
    }
}
