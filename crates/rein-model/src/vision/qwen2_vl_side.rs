//! Qwen2-VL's image side ([`Qwen2VlSide`]): the vision tower, the image token whose places its
//! features take, and how the decoder's rotary frequencies split over the three position axes
//! (its checkpoint layout is `qwen2_vl.rs`'s).

use burn::module::Module;
use burn::tensor::{Tensor, TensorData};
use serde_json::Value;

use super::multimodal_positions::{MultimodalPositions, multimodal_positions};
use super::qwen2_vl_processor::Qwen2VlImage;
use super::qwen2_vl_vision::Qwen2VlVision;
use super::vision_lora::BlockLora;
use crate::backend::ReinBackend;

/// Qwen2-VL's image side: the vision tower and what the decoder needs to read its features —
/// the image token and how its rotary frequencies split over the three position axes. A
/// [`crate::lm::CausalLm`] holding one ([`super::ImageSide::Qwen2Vl`]) is a Qwen2-VL or Qwen2.5-VL model.
#[derive(Module, Debug)]
pub struct Qwen2VlSide<B: ReinBackend> {
    /// The vision transformer and patch merger.
    pub visual: Qwen2VlVision<B>,
    /// LoRA adapters on the transformer's blocks (`vision_lora.rs`), one per block; empty
    /// without.
    pub lora: Vec<BlockLora<B>>,
    #[module(skip)]
    image_token_id: u32,
    #[module(skip)]
    mrope_section: [usize; 3],
    /// The model's `config.json` as read, written back on saving.
    #[module(skip)]
    pub(crate) config_json: Value,
}

impl<B: ReinBackend> Qwen2VlSide<B> {
    /// The side of `visual`, whose features replace `image_token_id`, for a decoder whose rotary
    /// frequencies split over the three axes as `mrope_section`; `config_json` is the model's
    /// `config.json`, written back as it is on saving.
    pub fn new(visual: Qwen2VlVision<B>, image_token_id: u32, mrope_section: [usize; 3], config_json: Value) -> Self {
        Self {
            visual,
            lora: Vec::new(),
            image_token_id,
            mrope_section,
            config_json,
        }
    }

    /// The token the image features replace (`<|image_pad|>`).
    pub fn image_token_id(&self) -> u32 {
        self.image_token_id
    }

    /// How the decoder's rotary frequencies split over the temporal, height and width axes.
    pub fn mrope_section(&self) -> [usize; 3] {
        self.mrope_section
    }

    /// The merged features of `images`, image after image, `rows · columns / merge²` each.
    ///
    /// # Shapes
    /// → `[Σ merged patches, hidden]`
    pub fn image_features(&self, images: &[&Qwen2VlImage], device: &B::Device) -> Tensor<B, 2> {
        let width = self.visual.config().patch_values();
        let values: Vec<f32> = images.iter().flat_map(|image| image.patches.iter().copied()).collect();
        let count = values.len() / width;
        let patches = Tensor::from_data(TensorData::new(values, [count, width]), device);
        let grids: Vec<_> = images.iter().map(|image| image.grid).collect();
        self.visual.forward_adapted(patches, &grids, &self.lora)
    }

    /// The multimodal positions of `tokens` holding `images` (an error when they disagree).
    pub fn positions(&self, tokens: &[u32], images: &[&Qwen2VlImage]) -> Result<MultimodalPositions, String> {
        let grids: Vec<_> = images.iter().map(|image| image.grid).collect();
        multimodal_positions(
            tokens,
            self.image_token_id,
            &grids,
            self.visual.config().spatial_merge_size,
        )
    }

    /// The same side with its vision transformer (patch embedding and blocks) frozen; the
    /// patch merger, which maps its features into the decoder, still learns.
    pub(crate) fn with_frozen_transformer(mut self) -> Self {
        self.visual.patch_embed = self.visual.patch_embed.clone().set_require_grad(false);
        self.visual.blocks = self.visual.blocks.clone().no_grad();
        self
    }
}
