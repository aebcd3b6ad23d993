//! An image as a vision-language model reads it ([`ProcessedImage`]), whichever family the
//! model is: Idefics3's tiles or Qwen2-VL's patches. Callers that only move images between
//! reading and the model (data, sampler, server) hold these and never ask which.

use super::idefics3_processor::Idefics3Image;
use super::qwen2_vl_processor::Qwen2VlImage;

/// One image processed for a model.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcessedImage {
    /// Idefics3's tiles.
    Idefics3(Idefics3Image),
    /// Qwen2-VL's patches.
    Qwen2Vl(Qwen2VlImage),
}

/// `images` as Idefics3's.
///
/// # Panics
/// When one is not.
pub(crate) fn idefics3_images<'a>(images: impl IntoIterator<Item = &'a ProcessedImage>) -> Vec<&'a Idefics3Image> {
    (images.into_iter())
        .map(|image| match image {
            ProcessedImage::Idefics3(image) => image,
            ProcessedImage::Qwen2Vl(_) => panic!("a Qwen2-VL image for an Idefics3 model"),
        })
        .collect()
}

/// `images` as Qwen2-VL's.
///
/// # Panics
/// When one is not.
pub(crate) fn qwen2_vl_images<'a>(images: impl IntoIterator<Item = &'a ProcessedImage>) -> Vec<&'a Qwen2VlImage> {
    (images.into_iter())
        .map(|image| match image {
            ProcessedImage::Qwen2Vl(image) => image,
            ProcessedImage::Idefics3(_) => panic!("an Idefics3 image for a Qwen2-VL model"),
        })
        .collect()
}
