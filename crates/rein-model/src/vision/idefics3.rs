//! Idefics3 / SmolVLM (`Idefics3ForConditionalGeneration`): the SigLIP encoder's patch features,
//! pixel-shuffled (each `scale × scale` block of patches concatenated into one vector) and
//! projected by one bias-free linear layer into the decoder's embedding space, where they replace
//! the prompt's `<image>` tokens one for one, in order. The decoder is any causal LM rein runs
//! (Llama in the released models).

use std::path::Path;

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{Int, Tensor, TensorData};
use serde_json::Value;

use super::image_tokens::{image_slots, with_image_features};
use super::siglip::{VisionConfig, VisionEncoder};
use crate::backend::{ReinBackend, affine};
use crate::lm::model_dir::{Decoder, Weights, decoder_tensors, linear_weight, read_json, write_model_dir};
use crate::lm::{CausalLm, Context, KvCache, LmConfig, LoadError};

/// An Idefics3 model: its image side and its decoder.
#[derive(Module, Debug)]
pub struct Idefics3<B: ReinBackend> {
    /// The vision encoder and the connector.
    pub vision: Idefics3Vision<B>,
    /// The decoder and its head.
    pub text: CausalLm<B>,
    /// `config.json` as read, written back by [`Idefics3::save`].
    #[module(skip)]
    config_json: Value,
}

/// Idefics3's image side: pixel values to features in the decoder's embedding space.
#[derive(Module, Debug)]
pub struct Idefics3Vision<B: ReinBackend> {
    /// The vision transformer.
    pub encoder: VisionEncoder<B>,
    /// The connector's projection, `[hidden_vision · scale², hidden_text]`.
    pub connector: Linear<B>,
    #[module(skip)]
    image_token_id: u32,
    #[module(skip)]
    scale_factor: usize,
}

impl<B: ReinBackend> Idefics3Vision<B> {
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
        let patches = self.encoder.forward(pixel_values);
        let shuffled = pixel_shuffle(patches, self.scale_factor);
        let [tiles, seq, width] = shuffled.dims();
        affine(
            shuffled.reshape([tiles * seq, width]),
            self.connector.weight.val(),
            None,
        )
    }
}

/// Whether the checkpoint directory `dir` holds an Idefics3 model (its `config.json` names
/// `Idefics3ForConditionalGeneration`); `false` when it cannot be read.
pub fn is_idefics3(dir: &Path) -> bool {
    read_json(&dir.join("config.json"))
        .is_ok_and(|config| config["architectures"][0] == "Idefics3ForConditionalGeneration")
}

impl<B: ReinBackend> Idefics3<B> {
    /// Loads the model in the checkpoint directory `dir` onto `device`.
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self, LoadError> {
        let path = dir.join("config.json");
        let raw = read_json(&path)?;
        let json_error = |reason: String| LoadError::Json {
            path: path.clone(),
            reason,
        };
        let architecture = raw["architectures"][0].as_str().unwrap_or_default();
        if architecture != "Idefics3ForConditionalGeneration" {
            return Err(LoadError::Unsupported {
                field: "architectures".into(),
                reason: format!("`{architecture}` is not Idefics3ForConditionalGeneration"),
            });
        }
        let text_config =
            LmConfig::from_json(raw["text_config"].clone()).map_err(|e| json_error(format!("text_config: {e}")))?;
        text_config.validate()?;
        let vision_config = VisionConfig::from_json(&raw["vision_config"]).map_err(json_error)?;
        let scale_factor = match raw["scale_factor"].as_u64().unwrap_or(2) {
            0 => return Err(json_error("scale_factor: 0".into())),
            s => s as usize,
        };
        let per_side = vision_config.patches_per_side();
        if !per_side.is_multiple_of(scale_factor) {
            return Err(json_error(format!(
                "scale_factor {scale_factor} does not divide the {per_side} patches along a tile's side"
            )));
        }
        let image_token_id = match raw["image_token_id"].as_u64() {
            Some(id) if (id as usize) < text_config.vocab_size => id as u32,
            other => {
                return Err(json_error(format!(
                    "image_token_id: {other:?} is not a token of the {} in the vocabulary",
                    text_config.vocab_size
                )));
            }
        };
        let weights = Weights::open(dir)?;
        let decoder = Decoder::read(&weights, &text_config, "model.text_model", device)?;
        let tied = text_config.tie_word_embeddings || raw["tie_word_embeddings"].as_bool() == Some(true);
        let (hidden, vocab) = (text_config.hidden_size, text_config.vocab_size);
        let lm_head = (!tied)
            .then(|| weights.linear("lm_head", hidden, vocab, false, device))
            .transpose()?;
        let connector_input = vision_config.hidden_size * scale_factor * scale_factor;
        let connector = weights.linear(
            "model.connector.modality_projection.proj",
            connector_input,
            hidden,
            false,
            device,
        )?;
        let encoder = VisionEncoder::read(&weights, vision_config, "model.vision_model", device)?;
        let unused = weights.unused(tied);
        if !unused.is_empty() {
            return Err(LoadError::UnexpectedTensors { names: unused });
        }
        let mut text_config = text_config;
        text_config.tie_word_embeddings = tied;
        let text = CausalLm::from_parts(text_config, decoder.embed_tokens, decoder.layers, decoder.norm, lm_head);
        Ok(Self {
            vision: Idefics3Vision {
                encoder,
                connector,
                image_token_id,
                scale_factor,
            },
            text,
            config_json: raw,
        })
    }

    /// Writes the model to `dir` in Hugging Face format (`config.json` as it was read,
    /// `model.safetensors` in f32), loadable by transformers; LoRA adapters on the decoder are
    /// merged. Processor and tokenizer files are the caller's to copy.
    pub fn save(&self, dir: &Path) -> Result<(), LoadError> {
        let text = self.text.merged();
        let mut tensors: crate::safetensors_file::Tensors = (decoder_tensors(&text).into_iter())
            .map(|(name, t)| (name.replacen("model.", "model.text_model.", 1), t))
            .collect();
        if let Some(head) = &text.lm_head {
            tensors.insert("lm_head.weight".into(), linear_weight(head));
        }
        tensors.insert(
            "model.connector.modality_projection.proj.weight".into(),
            linear_weight(&self.vision.connector),
        );
        tensors.extend(self.vision.encoder.tensors("model.vision_model"));
        let config = serde_json::to_string_pretty(&self.config_json).unwrap_or_default();
        write_model_dir(dir, &tensors, &config)
    }

    /// The same model with its vision encoder frozen: no gradient reaches it (the connector and
    /// the decoder still learn), as TRL's and verl's `freeze_vision_tower`.
    pub fn with_frozen_vision(mut self) -> Self {
        self.vision.encoder = self.vision.encoder.no_grad();
        self
    }

    /// Its image side and its decoder, apart (a server keeps them on different paths).
    pub fn into_parts(self) -> (Idefics3Vision<B>, CausalLm<B>) {
        (self.vision, self.text)
    }

    /// The token the image features replace.
    pub fn image_token_id(&self) -> u32 {
        self.vision.image_token_id()
    }

    /// Image tokens per tile.
    pub fn image_seq_len(&self) -> usize {
        self.vision.image_seq_len()
    }

    /// [`Idefics3Vision::image_features`].
    pub fn image_features(&self, pixel_values: Tensor<B, 4>) -> Tensor<B, 2> {
        self.vision.image_features(pixel_values)
    }

    /// The decoder's input embeddings of `tokens` with `features` (from
    /// [`Idefics3::image_features`]) in place of the image tokens, row by row, in order.
    ///
    /// # Panics
    /// When the tokens hold a different number of image tokens than `features` has rows.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]`, `features`: `[image tokens, hidden]` → `[batch, seq, hidden]`
    pub fn embed(&self, tokens: &[Vec<u32>], features: Tensor<B, 2>) -> Tensor<B, 3> {
        let (batch, seq) = (tokens.len(), tokens.first().map_or(0, Vec::len));
        let ids: Vec<i64> = tokens.iter().flatten().map(|&t| i64::from(t)).collect();
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [batch, seq]), &features.device());
        let slots = image_slots(tokens.iter().flatten().copied(), self.image_token_id());
        let images = slots.iter().flatten().count();
        let [rows, _] = features.dims();
        assert_eq!(images, rows, "{images} image tokens for {rows} image features");
        with_image_features(self.text.embed(ids), &slots, features)
    }

    /// The decoder's final hidden states over `tokens` with the images' `features` in place:
    /// [`CausalLm::hidden_of_embeddings`] of [`Idefics3::embed`]. With a cache, the images' keys
    /// and values are cached with the prompt's, so decoding reads them without the encoder.
    pub fn hidden(
        &self,
        tokens: &[Vec<u32>],
        features: Tensor<B, 2>,
        ctx: &Context<'_, B>,
        cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        self.text.hidden_of_embeddings(self.embed(tokens, features), ctx, cache)
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
