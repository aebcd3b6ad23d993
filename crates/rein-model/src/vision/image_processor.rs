//! A vision-language model's image processor ([`ImageProcessor`]), whichever family the model
//! is, as its model directory describes it: images to [`ProcessedImage`]s, and prompts' image
//! markers expanded to their images' tokens.

use std::path::Path;

use super::idefics3_processor::{IMAGE_TOKEN, Idefics3Processor};
use super::image_side::ImageSide;
use super::processed_image::{ProcessedImage, idefics3_images, qwen2_vl_images};
use super::qwen2_vl_processor::{QWEN2_VL_IMAGE_TOKEN, Qwen2VlProcessor};
use super::resample::Pixels;
use crate::backend::ReinBackend;
use crate::lm::LoadError;

/// A vision-language model's image processor.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageProcessor {
    /// Idefics3's / SmolVLM's.
    Idefics3(Idefics3Processor),
    /// Qwen2-VL's and Qwen2.5-VL's.
    Qwen2Vl(Qwen2VlProcessor),
}

impl ImageProcessor {
    /// The processor whose settings are in the model directory `dir`, for the image side `side`.
    pub fn load<B: ReinBackend>(dir: &Path, side: &ImageSide<B>) -> Result<Self, LoadError> {
        Ok(match side {
            ImageSide::Idefics3(vision) => Self::Idefics3(Idefics3Processor::load(dir, vision.image_seq_len())?),
            ImageSide::Qwen2Vl(_) => Self::Qwen2Vl(Qwen2VlProcessor::load(dir)?),
        })
    }

    /// `image` processed; an error when the processor cannot take it (Qwen2-VL: an aspect ratio
    /// over 200).
    pub fn process(&self, image: &Pixels) -> Result<ProcessedImage, String> {
        Ok(match self {
            Self::Idefics3(p) => ProcessedImage::Idefics3(p.process(image)),
            Self::Qwen2Vl(p) => ProcessedImage::Qwen2Vl(p.process(image)?),
        })
    }

    /// `text`, whose `<image>` markers stand one for each of `images` (for Qwen2-VL, or its
    /// chat template's `<|image_pad|>` when the text holds no `<image>`), with each marker
    /// expanded to its image's tokens.
    ///
    /// # Panics
    /// When an image was processed by the other family's processor.
    pub fn expand_prompt(&self, text: &str, images: &[ProcessedImage]) -> Result<String, String> {
        match self {
            Self::Idefics3(p) => p.expand_prompt(text, &idefics3_images(images)),
            Self::Qwen2Vl(p) => {
                let images = qwen2_vl_images(images);
                match !text.contains(IMAGE_TOKEN) && text.contains(QWEN2_VL_IMAGE_TOKEN) {
                    true => p.expand_prompt(text, &images),
                    false => p.expand_image_markers(text, &images),
                }
            }
        }
    }

    /// The image token `text` holds as text when it may not: a text's image tokens are only
    /// those its `<image>` markers expand to (Qwen2-VL's `<|image_pad|>` written into a tool's
    /// result would otherwise read an image that is not there). Idefics3's image token is the
    /// marker itself, which the marker count checks.
    pub fn stray_image_token(&self, text: &str) -> Option<&'static str> {
        match self {
            Self::Idefics3(_) => None,
            Self::Qwen2Vl(_) => text.contains(QWEN2_VL_IMAGE_TOKEN).then_some(QWEN2_VL_IMAGE_TOKEN),
        }
    }

    /// Whether images are converted to RGB (an alpha channel composited over white) first.
    pub fn converts_to_rgb(&self) -> bool {
        match self {
            Self::Idefics3(p) => p.converts_to_rgb(),
            Self::Qwen2Vl(p) => p.converts_to_rgb(),
        }
    }
}
