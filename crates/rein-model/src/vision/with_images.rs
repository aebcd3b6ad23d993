//! A causal LM that reads images: its image side set, frozen, and its prompts' image tokens
//! replaced by their features ([`CausalLm::embed_with_images`]), in a prompt's forward pass at
//! its positions ([`CausalLm::prefill_with_images`]: multimodal ones for Qwen2-VL).

use burn::module::Module;
use burn::tensor::{Int, Tensor, TensorData};

use super::image_side::ImageSide;
use super::image_tokens::{image_slots, with_image_features};
use super::processed_image::ProcessedImage;
use crate::backend::ReinBackend;
use crate::lm::{CausalLm, Context, KvCache, Rope};

/// A prompt's forward pass: its last hidden states and where decoding continues.
#[derive(Debug)]
pub struct Prefill<B: ReinBackend> {
    /// `[1, seq, hidden]`.
    pub hidden: Tensor<B, 3>,
    /// The position of the first token after the prompt: its length, or for multimodal
    /// positions one past the largest ([`super::MultimodalPositions::next`]); the `i`-th decoded token
    /// sits at `next + i`, read with the decoder's plain tables ([`CausalLm::rope`]).
    pub next: usize,
}

impl<B: ReinBackend> CausalLm<B> {
    /// This model reading images through `vision` (a vision-language model).
    pub fn with_vision(mut self, vision: ImageSide<B>) -> Self {
        self.vision = Some(vision);
        self
    }

    /// The same model with its vision encoder frozen: no gradient reaches it (the connector —
    /// Idefics3's projection, Qwen2-VL's patch merger — and the decoder still learn), as TRL's,
    /// verl's and LLaMA-Factory's `freeze_vision_tower`. A text-only model is returned as it is.
    pub fn with_frozen_vision(mut self) -> Self {
        self.vision = self.vision.map(|vision| match vision {
            ImageSide::Idefics3(mut v) => {
                v.encoder = v.encoder.no_grad();
                ImageSide::Idefics3(v)
            }
            ImageSide::Qwen2Vl(v) => ImageSide::Qwen2Vl(v.with_frozen_transformer()),
        });
        self
    }

    /// The input embeddings of `tokens` with `features` (from [`ImageSide::image_features`]) in
    /// place of the image tokens, row by row, in order.
    ///
    /// # Panics
    /// When the model has no image side, or the tokens hold a different number of image tokens
    /// than `features` has rows.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]`, `features`: `[image tokens, hidden]` → `[batch, seq, hidden]`
    pub fn embed_with_images(&self, tokens: &[Vec<u32>], features: Tensor<B, 2>) -> Tensor<B, 3> {
        let vision = self.vision.as_ref().expect("a vision-language model");
        let (batch, seq) = (tokens.len(), tokens.first().map_or(0, Vec::len));
        let ids: Vec<i64> = tokens.iter().flatten().map(|&t| i64::from(t)).collect();
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [batch, seq]), &features.device());
        let slots = image_slots(tokens.iter().flatten().copied(), vision.image_token_id());
        let images = slots.iter().flatten().count();
        let [rows, _] = features.dims();
        assert_eq!(images, rows, "{images} image tokens for {rows} image features");
        with_image_features(self.embed(ids), &slots, features)
    }

    /// The final hidden states over `tokens` with the images' `features` in place:
    /// [`CausalLm::hidden_of_embeddings`] of [`CausalLm::embed_with_images`]. With a cache, the
    /// images' keys and values are cached with the prompt's, so decoding reads them without the
    /// encoder.
    pub fn hidden_with_images(
        &self,
        tokens: &[Vec<u32>],
        features: Tensor<B, 2>,
        ctx: &Context<'_, B>,
        cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        self.hidden_of_embeddings(self.embed_with_images(tokens, features), ctx, cache)
    }

    /// The final hidden states of one sequence, `tokens` with `images` in place of its image
    /// tokens, at its positions (multimodal ones for Qwen2-VL). With a cache, its keys and
    /// values (the images' among them) are cached, so decoding reads them without the vision
    /// encoder: decode from [`Prefill::next`] on. An error when the tokens and the images
    /// disagree.
    ///
    /// # Panics
    /// When the model has no image side and `images` is not empty.
    pub fn prefill_with_images(
        &self,
        tokens: &[u32],
        images: &[ProcessedImage],
        cache: Option<&mut KvCache<B>>,
        device: &B::Device,
    ) -> Result<Prefill<B>, String> {
        let seq = tokens.len();
        let multimodal = (self.vision.as_ref())
            .and_then(|v| v.positions(tokens, images))
            .transpose()?;
        let section = self.vision.as_ref().and_then(ImageSide::mrope_section);
        let rope = match (&multimodal, section) {
            (Some(m), Some(section)) => Rope::multimodal(self.config(), &m.positions, section, device),
            _ => self.rope(seq.max(1), device),
        };
        // Multimodal tables hold one row per token: token `r` reads row `r`.
        let ctx = Context::single(&rope, 0, seq, device);
        let hidden = match &self.vision {
            Some(vision) => {
                let slots = image_slots(tokens.iter().copied(), vision.image_token_id());
                let wanted = slots.iter().flatten().count();
                let features = (!images.is_empty()).then(|| vision.image_features(images, device));
                let given = features.as_ref().map_or(0, |f| f.dims()[0]);
                if wanted != given {
                    return Err(format!(
                        "the prompt holds {wanted} image tokens for {given} image features"
                    ));
                }
                match features {
                    Some(features) => self.hidden_with_images(&[tokens.to_vec()], features, &ctx, cache),
                    None => self.hidden(token_ids(tokens, device), &ctx, cache),
                }
            }
            None => {
                assert!(images.is_empty(), "images for a model without an image side");
                self.hidden(token_ids(tokens, device), &ctx, cache)
            }
        };
        Ok(Prefill {
            hidden,
            next: multimodal.map_or(seq, |m| m.next as usize),
        })
    }
}

/// One sequence's tokens as a `[1, seq]` tensor.
fn token_ids<B: ReinBackend>(tokens: &[u32], device: &B::Device) -> Tensor<B, 2, Int> {
    let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
    Tensor::from_data(TensorData::new(ids, [1, tokens.len()]), device)
}
