//! What the vision-language checkpoints share around their image sides: the image token
//! `config.json` names, the decoder and its head read under the family's path, the check that
//! every tensor was read, and the decoder's tensors written back under that path.

use burn::nn::Linear;
use serde_json::Value;

use super::image_side::ImageSide;
use crate::backend::ReinBackend;
use crate::lm::model_dir::{Decoder, Weights, decoder_tensors, linear_weight};
use crate::lm::{CausalLm, LmConfig, LoadError};
use crate::safetensors_file::Tensors;

/// `image_token_id` of a vision-language `config.json`, a token of the decoder's vocabulary.
pub(crate) fn image_token_id(raw: &Value, text: &LmConfig) -> Result<u32, String> {
    match raw["image_token_id"].as_u64() {
        Some(id) if (id as usize) < text.vocab_size => Ok(id as u32),
        other => Err(format!(
            "image_token_id: {other:?} is not a token of the {} in the vocabulary",
            text.vocab_size
        )),
    }
}

/// A vision-language checkpoint's decoder (under `root`) and its head, `None` when tied (by the
/// decoder's config or the outer `config.json`).
pub(crate) struct DecoderAndHead<B: ReinBackend> {
    decoder: Decoder<B>,
    lm_head: Option<Linear<B>>,
    tied: bool,
}

impl<B: ReinBackend> DecoderAndHead<B> {
    /// Reads them from `weights`, shaped by `text` (the decoder's config) and `raw` (the whole
    /// `config.json`).
    pub(crate) fn read(
        weights: &Weights,
        text: &LmConfig,
        raw: &Value,
        root: &str,
        device: &B::Device,
    ) -> Result<Self, LoadError> {
        let decoder = Decoder::read(weights, text, root, device)?;
        let tied = text.tie_word_embeddings || raw["tie_word_embeddings"].as_bool() == Some(true);
        let lm_head = (!tied)
            .then(|| weights.linear("lm_head", text.hidden_size, text.vocab_size, false, device))
            .transpose()?;
        Ok(Self { decoder, lm_head, tied })
    }

    /// The model of this decoder and `vision`, once every tensor of `weights` has been read (an
    /// error naming those that were not).
    pub(crate) fn with_vision(
        self,
        weights: &Weights,
        text: LmConfig,
        vision: ImageSide<B>,
    ) -> Result<CausalLm<B>, LoadError> {
        let unused = weights.unused(self.tied);
        if !unused.is_empty() {
            return Err(LoadError::UnexpectedTensors { names: unused });
        }
        let config = LmConfig {
            tie_word_embeddings: self.tied,
            ..text
        };
        let Decoder {
            embed_tokens,
            layers,
            norm,
        } = self.decoder;
        Ok(CausalLm::from_parts(config, embed_tokens, layers, norm, self.lm_head).with_vision(vision))
    }
}

/// `model`'s decoder tensors under `root` (`model.text_model` for Idefics3, `model` on the hub
/// for Qwen2-VL) and its head's.
pub(crate) fn decoder_and_head_tensors<B: ReinBackend>(model: &CausalLm<B>, root: &str) -> Tensors {
    let mut tensors: Tensors = (decoder_tensors(model).into_iter())
        .map(|(name, t)| (name.replacen("model.", &format!("{root}."), 1), t))
        .collect();
    if let Some(head) = &model.lm_head {
        tensors.insert("lm_head.weight".into(), linear_weight(head));
    }
    tensors
}
