//! Idefics3's image side: the SigLIP encoder's patch features, pixel-shuffled (each
//! `scale × scale` block of patches concatenated into one vector) and projected by one
//! bias-free linear layer into the decoder's embedding space. A [`crate::lm::CausalLm`] holding
//! one is a vision-language model; its checkpoint layout is `idefics3.rs`'s.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::Tensor;
use rein_core::SeededRng;
use rein_gguf::LmConfig;
use serde_json::Value;

use super::siglip::{VisionConfig, VisionEncoder};
use super::vision_lora::BlockLora;
use crate::backend::{ReinBackend, affine};

/// Idefics3's image side: pixel values to features in the decoder's embedding space. A
/// [`crate::lm::CausalLm`] with one ([`crate::lm::CausalLm::vision`]) is an Idefics3 model.
#[derive(Module, Debug)]
pub struct Idefics3Vision<B: ReinBackend> {
    /// The vision transformer.
    pub encoder: VisionEncoder<B>,
    /// The connector's projection, `[hidden_vision · scale², hidden_text]`.
    pub connector: Linear<B>,
    /// LoRA adapters on the encoder's layers (`vision_lora.rs`), one per layer; empty without.
    pub lora: Vec<BlockLora<B>>,
    #[module(skip)]
    image_token_id: u32,
    #[module(skip)]
    scale_factor: usize,
    /// The model's `config.json` as read (or as built for a new model), written back by
    /// [`crate::lm::save`].
    #[module(skip)]
    pub(crate) config_json: Value,
}

impl<B: ReinBackend> Idefics3Vision<B> {
    /// An image side of `encoder` and `connector` whose features replace `image_token_id`;
    /// `config_json` is the model's `config.json`, written back as it is on saving.
    ///
    /// # Panics
    /// When `scale_factor` does not divide a tile's patches per side, or the connector's input
    /// is not the encoder's width times `scale_factor²`.
    pub fn new(
        encoder: VisionEncoder<B>,
        connector: Linear<B>,
        image_token_id: u32,
        scale_factor: usize,
        config_json: Value,
    ) -> Self {
        let config = encoder.config();
        assert!(
            scale_factor > 0 && config.patches_per_side().is_multiple_of(scale_factor),
            "scale_factor {scale_factor} does not divide {} patches",
            config.patches_per_side()
        );
        assert_eq!(
            connector.weight.dims()[0],
            config.hidden_size * scale_factor * scale_factor,
            "connector input"
        );
        Self {
            encoder,
            connector,
            lora: Vec::new(),
            image_token_id,
            scale_factor,
            config_json,
        }
    }

    /// A new image side for a decoder of config `text`, trained from scratch: a SigLIP encoder of
    /// `config` ([`VisionEncoder::init`]) and a connector whose weights are drawn `N(0, std²)`
    /// from `rng` after it, pixel-shuffling `scale_factor × scale_factor` patches into each of
    /// the features that replace `image_token_id`. Its `config.json` is Idefics3's, with the
    /// decoder's config as `text_config`. An error when `scale_factor` does not divide the
    /// patches along a side, or `image_token_id` is not in the vocabulary.
    pub fn init(
        text: &LmConfig,
        config: VisionConfig,
        (scale_factor, image_token_id): (usize, u32),
        std: f64,
        rng: &mut SeededRng,
        device: &B::Device,
    ) -> Result<Self, String> {
        let per_side = config.patches_per_side();
        if scale_factor == 0 || !per_side.is_multiple_of(scale_factor) {
            return Err(format!(
                "scale_factor {scale_factor} does not divide the {per_side} patches along a side"
            ));
        }
        let vocab = text.vocab_size;
        if image_token_id as usize >= vocab {
            return Err(format!(
                "the image token {image_token_id} is not in the decoder's vocabulary of {vocab}"
            ));
        }
        let text_config: Value = serde_json::from_str(&text.to_hf_json()).map_err(|e| e.to_string())?;
        let config_json = serde_json::json!({
            "architectures": ["Idefics3ForConditionalGeneration"],
            "model_type": "idefics3",
            "image_token_id": image_token_id,
            "scale_factor": scale_factor,
            "tie_word_embeddings": text.tie_word_embeddings,
            "text_config": text_config,
            "vision_config": config.to_json(),
        });
        let connector_input = config.hidden_size * scale_factor * scale_factor;
        let hidden = text.hidden_size;
        let encoder = VisionEncoder::init(config, std, rng, device);
        let connector = Linear {
            weight: burn::module::Param::from_tensor(crate::random::normal::<B>(
                rng,
                [connector_input, hidden],
                std,
                device,
            )),
            bias: None,
        };
        Ok(Self::new(encoder, connector, image_token_id, scale_factor, config_json))
    }

    /// The token the image features replace.
    pub fn image_token_id(&self) -> u32 {
        self.image_token_id
    }

    /// Image tokens per tile: `(patches per side / scale)²`.
    pub fn image_seq_len(&self) -> usize {
        (self.encoder.config().patches_per_side() / self.scale_factor).pow(2)
    }

    /// The decoder-space features of whole tiles, tile after tile, `image_seq_len` rows each.
    ///
    /// # Shapes
    /// - `pixel_values`: `[tiles, 3, side, side]` → `[tiles · image_seq_len, hidden_text]`
    pub fn image_features(&self, pixel_values: Tensor<B, 4>) -> Tensor<B, 2> {
        let patches = self.encoder.forward_adapted(pixel_values, &self.lora);
        let shuffled = pixel_shuffle(patches, self.scale_factor);
        let [tiles, seq, width] = shuffled.dims();
        affine(
            shuffled.reshape([tiles * seq, width]),
            self.connector.weight.val(),
            None,
        )
    }
}

/// Idefics3's `pixel_shuffle`: a tile's `n × n` patches regrouped so that each output vector is
/// the concatenation of a `scale × scale` block's patch vectors (row-major within the block).
///
/// # Shapes
/// - `x`: `[tiles, n², width]` → `[tiles, (n / scale)², width · scale²]`
pub fn pixel_shuffle<B: ReinBackend>(x: Tensor<B, 3>, scale: usize) -> Tensor<B, 3> {
    let [tiles, seq, width] = x.dims();
    let n = (seq as f64).sqrt() as usize;
    x.reshape([tiles, n, n / scale, width * scale])
        .swap_dims(1, 2)
        .reshape([tiles, n / scale, n / scale, width * scale * scale])
        .swap_dims(1, 2)
        .reshape([tiles, seq / (scale * scale), width * scale * scale])
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::Int;

    #[test]
    fn pixel_shuffle_concatenates_each_block_of_patches() {
        // One tile of 4 × 4 patches, each patch's vector [index]: block (0, 0) holds patches
        // 0, 1, 4, 5, laid out as torch's view/permute/reshape lays them out.
        let device = Default::default();
        let x = Tensor::<Flex, 1, Int>::arange(0..16, &device)
            .float()
            .reshape([1, 16, 1]);
        let out: Vec<f32> = pixel_shuffle(x, 2).into_data().to_vec().unwrap();
        assert_eq!(
            out,
            [0., 1., 4., 5., 2., 3., 6., 7., 8., 9., 12., 13., 10., 11., 14., 15.]
        );
    }
}
