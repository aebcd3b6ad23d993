//! Vision-language models: images read, resized and normalised as transformers' image
//! processors do, encoded by a vision transformer and placed in a causal LM's input embeddings.
//!
//! - [`decode_rgb`]: encoded images to 8-bit RGB, bounded by [`ImageLimits`] before allocating.
//! - [`Pixels::resize`]: Pillow's resampling filters, bit for bit.
//! - [`Idefics3Processor`]: Idefics3's / SmolVLM's tiling, pixel values and prompt expansion.
//! - [`Qwen2VlProcessor`]: Qwen2-VL's (and Qwen2.5-VL's) resizing, patches and prompt expansion.
//! - [`ImageProcessor`] and [`ProcessedImage`]: either family's processor and images.
//! - [`ImageSide`]: the image side of a [`crate::lm::CausalLm`] that reads images —
//!   [`Idefics3Vision`] (the SigLIP [`VisionEncoder`] and the pixel-shuffle connector) or
//!   [`Qwen2VlSide`] (Qwen2-VL's and Qwen2.5-VL's [`Qwen2VlVision`]: 2-D RoPE, window attention,
//!   the patch merger; its decoder at [`multimodal_positions`]); loaded and saved by
//!   [`crate::lm::load`] and [`crate::lm::save`] in each family's layout.
//! - [`BlockLora`]: LoRA adapters on the vision encoder's blocks.
//! - [`with_image_features`]: image features in place of a prompt's image tokens;
//!   [`crate::lm::CausalLm::prefill_with_images`]: a prompt's forward pass at its positions.

mod decode;
mod idefics3;
mod idefics3_processor;
mod idefics3_vision;
mod image_processor;
mod image_side;
mod image_tokens;
mod multimodal_positions;
mod processed_image;
mod processor_settings;
mod qwen2_vl;
mod qwen2_vl_processor;
mod qwen2_vl_side;
mod qwen2_vl_vision;
mod resample;
mod siglip;
mod vision_lora;
mod vlm_checkpoint;
mod with_images;

pub use decode::{ImageError, ImageLimits, decode_rgb};
pub use idefics3::is_idefics3;
pub(crate) use idefics3::{load_idefics3, save_idefics3};
pub use idefics3_processor::{IMAGE_TOKEN, Idefics3Image, Idefics3Processor};
pub use idefics3_vision::{Idefics3Vision, pixel_shuffle};
pub use image_processor::ImageProcessor;
pub use image_side::ImageSide;
pub use image_tokens::{image_slots, with_image_features};
pub use multimodal_positions::{MultimodalPositions, multimodal_positions};
pub use processed_image::ProcessedImage;
pub use qwen2_vl::is_qwen2_vl;
pub(crate) use qwen2_vl::{load_qwen2_vl, save_qwen2_vl};
pub use qwen2_vl_processor::{QWEN2_VL_IMAGE_TOKEN, Qwen2VlImage, Qwen2VlProcessor, smart_resize};
pub use qwen2_vl_side::Qwen2VlSide;
pub use qwen2_vl_vision::{
    GatedMlp, PatchMerger, Qwen2VlActivation, Qwen2VlGeneration, Qwen2VlVision, Qwen2VlVisionBlock,
    Qwen2VlVisionConfig, TwoLayerMlp, VisionMlp, VisionNorm, Windows,
};
pub use resample::{Filter, Pixels};
pub use siglip::{VisionActivation, VisionConfig, VisionEncoder, VisionLayer};
pub use vision_lora::BlockLora;
pub use with_images::Prefill;
