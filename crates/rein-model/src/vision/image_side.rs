//! A vision-language model's image side ([`ImageSide`]): what turns its processed images into
//! features in the decoder's embedding space, and — for Qwen2-VL — the multimodal positions its
//! decoder reads them at. A [`crate::lm::CausalLm`] holding one is a vision-language model
//! (`with_images.rs`); the methods here are what every caller (sampler, trainer, server) asks of
//! its image side.

use burn::module::Module;
use burn::tensor::Tensor;

use super::idefics3_vision::Idefics3Vision;
use super::multimodal_positions::MultimodalPositions;
use super::processed_image::{ProcessedImage, idefics3_images, qwen2_vl_images};
use super::qwen2_vl_side::Qwen2VlSide;
use crate::backend::ReinBackend;

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
}
