//! A vision-language model's image side ([`ImageSide`]): what turns its processed images into
//! features in the decoder's embedding space, and — for Qwen2-VL — the multimodal positions its
//! decoder reads them at. A [`crate::lm::CausalLm`] holding one is a vision-language model
//! (`with_images.rs`); the methods here are what every caller (sampler, trainer, server) asks of
//! its image side.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::Tensor;
use rein_core::SeededRng;

use super::idefics3_vision::Idefics3Vision;
use super::multimodal_positions::MultimodalPositions;
use super::processed_image::{ProcessedImage, idefics3_images, qwen2_vl_images};
use super::qwen2_vl_side::Qwen2VlSide;
use super::siglip::LAYER_LINEARS;
use super::vision_lora::{BlockLora, merge_block, set_dropout_key};
use crate::backend::ReinBackend;
use crate::lm::lora::{Lora, LoraSpec};

/// A vision-language model's image side.
#[derive(Module, Debug)]
pub enum ImageSide<B: ReinBackend> {
    /// Idefics3 / SmolVLM: the SigLIP encoder and the pixel-shuffle connector.
    Idefics3(Idefics3Vision<B>),
    /// Qwen2-VL / Qwen2.5-VL: the vision transformer and patch merger, at multimodal positions.
    Qwen2Vl(Qwen2VlSide<B>),
}

impl<B: ReinBackend> ImageSide<B> {
    /// The token the image features replace.
    pub fn image_token_id(&self) -> u32 {
        match self {
            Self::Idefics3(v) => v.image_token_id(),
            Self::Qwen2Vl(v) => v.image_token_id(),
        }
    }

    /// Where transformers keeps the decoder's layers in the model (`model.text_model`,
    /// `model.language_model`): the path PEFT names the decoder's adapters by.
    pub fn decoder_path(&self) -> &'static str {
        match self {
            Self::Idefics3(_) => "model.text_model",
            Self::Qwen2Vl(_) => "model.language_model",
        }
    }

    /// The decoder-space features of `images`, image after image, one row per image token.
    ///
    /// # Panics
    /// When an image was processed for the other family.
    ///
    /// # Shapes
    /// → `[image tokens, hidden]`
    pub fn image_features<'a>(
        &self,
        images: impl IntoIterator<Item = &'a ProcessedImage>,
        device: &B::Device,
    ) -> Tensor<B, 2> {
        match self {
            Self::Idefics3(v) => v.image_features(super::Idefics3Image::stack(idefics3_images(images), device)),
            Self::Qwen2Vl(v) => v.image_features(&qwen2_vl_images(images), device),
        }
    }

    /// The multimodal positions of one sequence's `tokens` holding `images`, for a model whose
    /// decoder reads them (Qwen2-VL); `None` for one whose positions are the tokens' indices. An
    /// error when the tokens and the images disagree.
    pub fn positions(&self, tokens: &[u32], images: &[ProcessedImage]) -> Option<Result<MultimodalPositions, String>> {
        match self {
            Self::Idefics3(_) => None,
            Self::Qwen2Vl(v) => Some(v.positions(tokens, &qwen2_vl_images(images))),
        }
    }

    /// How the decoder's rotary frequencies split over the temporal, height and width axes, for
    /// a side with multimodal positions.
    pub fn mrope_section(&self) -> Option<[usize; 3]> {
        match self {
            Self::Idefics3(_) => None,
            Self::Qwen2Vl(v) => Some(v.mrope_section()),
        }
    }

    /// Where transformers keeps the vision encoder's blocks (`model.vision_model.encoder.layers`,
    /// `model.visual.blocks`): the path PEFT names their adapters by.
    pub fn block_path(&self) -> &'static str {
        match self {
            Self::Idefics3(_) => "model.vision_model.encoder.layers",
            Self::Qwen2Vl(_) => "model.visual.blocks",
        }
    }

    /// The linear layers LoRA can adapt (`vision_lora.rs`), block by block: each one's
    /// transformers path (`model.vision_model.encoder.layers.0.self_attn.q_proj`,
    /// `model.visual.blocks.0.attn.qkv`) and `[in, out]`.
    pub fn adaptable_linears(&self) -> Vec<Vec<(String, [usize; 2])>> {
        let block = |prefix: String, linears: Vec<(&str, &Linear<B>)>| -> Vec<(String, [usize; 2])> {
            (linears.into_iter())
                .map(|(path, linear)| (format!("{prefix}.{path}"), linear.weight.dims()))
                .collect()
        };
        match self {
            Self::Idefics3(v) => (v.encoder.layers.iter().enumerate())
                .map(|(i, layer)| {
                    let linears = LAYER_LINEARS.into_iter().zip(layer.linears()).collect();
                    block(format!("{}.{i}", self.block_path()), linears)
                })
                .collect(),
            Self::Qwen2Vl(v) => (v.visual.blocks.iter().enumerate())
                .map(|(i, b)| block(format!("{}.{i}", self.block_path()), b.linears()))
                .collect(),
        }
    }

    /// This side with fresh LoRA adapters on every linear layer of its encoder's blocks
    /// ([`Lora::new`]'s: the features are unchanged), replacing any it had; the `A` factors
    /// drawn from `rng`.
    pub fn with_lora(mut self, spec: &LoraSpec, rng: &mut SeededRng, device: &B::Device) -> Self {
        let shapes: Vec<Vec<[usize; 2]>> = (self.adaptable_linears().into_iter())
            .map(|block| block.into_iter().map(|(_, shape)| shape).collect())
            .collect();
        *self.lora_mut() = BlockLora::fresh(&shapes, spec, rng, device);
        self
    }

    fn lora(&self) -> &[BlockLora<B>] {
        match self {
            Self::Idefics3(v) => &v.lora,
            Self::Qwen2Vl(v) => &v.lora,
        }
    }

    fn lora_mut(&mut self) -> &mut Vec<BlockLora<B>> {
        match self {
            Self::Idefics3(v) => &mut v.lora,
            Self::Qwen2Vl(v) => &mut v.lora,
        }
    }

    /// Its adapters' slots with their layers' transformers paths, block by block (empty
    /// without adapters).
    pub fn adapters(&self) -> Vec<(String, &Option<Lora<B>>)> {
        (self.adaptable_linears().into_iter().flatten().map(|(path, _)| path))
            .zip(self.lora().iter().flat_map(|b| b.adapters.iter()))
            .collect()
    }

    /// [`ImageSide::adapters`], to replace.
    pub fn adapters_mut(&mut self) -> Vec<(String, &mut Option<Lora<B>>)> {
        let paths: Vec<String> = self
            .adaptable_linears()
            .into_iter()
            .flatten()
            .map(|(path, _)| path)
            .collect();
        paths
            .into_iter()
            .zip(self.lora_mut().iter_mut().flat_map(|b| b.adapters.iter_mut()))
            .collect()
    }

    /// This side with its adapters merged into the encoder's weights (`W + (α/r)·A·B`) and
    /// removed: the same features, from plain weights.
    pub fn merged(mut self) -> Self {
        let lora = std::mem::take(self.lora_mut());
        match &mut self {
            Self::Idefics3(v) => {
                for (layer, adapters) in v.encoder.layers.iter_mut().zip(&lora) {
                    merge_block(layer.linears_mut().into(), adapters);
                }
            }
            Self::Qwen2Vl(v) => {
                for (block, adapters) in v.visual.blocks.iter_mut().zip(&lora) {
                    merge_block(block.linears_mut(), adapters);
                }
            }
        }
        self
    }

    /// Starts a training step's dropout masks of its adapters.
    pub(crate) fn set_dropout_key(&self, key: u64) {
        set_dropout_key(self.lora(), key);
    }
}
