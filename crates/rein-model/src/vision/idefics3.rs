//! Idefics3 / SmolVLM (`Idefics3ForConditionalGeneration`): a causal LM whose prompts' `<image>`
//! tokens read its image side's features ([`Idefics3Vision`]) one for one, in order, and its
//! checkpoint layout (the decoder under `model.text_model`, the encoder under
//! `model.vision_model`, the connector). The decoder is any causal LM rein runs (Llama in the
//! released models).

use std::path::Path;

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::{Tensor, TensorData};

use super::idefics3_vision::Idefics3Vision;
use super::image_side::ImageSide;
use super::siglip::{VisionConfig, VisionEncoder, VisionLayer};
use super::vlm_checkpoint::{DecoderAndHead, decoder_and_head_tensors, image_token_id};
use crate::backend::ReinBackend;
use crate::lm::model_dir::{Weights, floats, linear_weight, read_json, vector_tensor, write_model_dir};
use crate::lm::{CausalLm, LmConfig, LoadError};

/// Whether the checkpoint directory `dir` holds an Idefics3 model (its `config.json` names
/// `Idefics3ForConditionalGeneration`); `false` when it cannot be read.
pub fn is_idefics3(dir: &Path) -> bool {
    read_json(&dir.join("config.json"))
        .is_ok_and(|config| config["architectures"][0] == "Idefics3ForConditionalGeneration")
}

/// Loads the Idefics3 model in the checkpoint directory `dir` onto `device`: its decoder (under
/// `model.text_model`) with its image side ([`CausalLm::vision`]).
pub(crate) fn load_idefics3<B: ReinBackend>(dir: &Path, device: &B::Device) -> Result<CausalLm<B>, LoadError> {
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
    let image_token_id = image_token_id(&raw, &text_config).map_err(json_error)?;
    let weights = Weights::open(dir)?;
    let decoder = DecoderAndHead::read(&weights, &text_config, &raw, "model.text_model", device)?;
    let hidden = text_config.hidden_size;
    let connector_input = vision_config.hidden_size * scale_factor * scale_factor;
    let connector = weights.linear(
        "model.connector.modality_projection.proj",
        connector_input,
        hidden,
        false,
        device,
    )?;
    let encoder = read_encoder(&weights, vision_config, "model.vision_model", device)?;
    let vision = Idefics3Vision::new(encoder, connector, image_token_id, scale_factor, raw);
    decoder.with_vision(&weights, text_config, ImageSide::Idefics3(vision))
}

/// Writes `model` (merged: no LoRA adapters), whose image side is `vision`, to `dir` in Hugging
/// Face's Idefics3 layout (`config.json`, `model.safetensors` in f32), loadable by transformers.
/// Processor and tokenizer files are the caller's to copy.
pub(crate) fn save_idefics3<B: ReinBackend>(
    model: &CausalLm<B>,
    vision: &Idefics3Vision<B>,
    dir: &Path,
) -> Result<(), LoadError> {
    let mut tensors = decoder_and_head_tensors(model, "model.text_model");
    tensors.insert(
        "model.connector.modality_projection.proj.weight".into(),
        linear_weight(&vision.connector),
    );
    tensors.extend(encoder_tensors(&vision.encoder, "model.vision_model"));
    let config = serde_json::to_string_pretty(&vision.config_json).unwrap_or_default();
    write_model_dir(dir, &tensors, &config)
}

/// The SigLIP encoder in the `{root}.*` tensors of `weights` (`model.vision_model` in Idefics3).
fn read_encoder<B: ReinBackend>(
    weights: &Weights,
    config: VisionConfig,
    root: &str,
    device: &B::Device,
) -> Result<VisionEncoder<B>, LoadError> {
    let (d, c, p) = (config.hidden_size, config.num_channels, config.patch_size);
    let norm = |name: &str| weights.layer_norm::<B>(name, d, config.layer_norm_eps, device);
    let linear = |name: &str, input: usize, output: usize| weights.linear::<B>(name, input, output, true, device);
    // The convolution's `[hidden, channels, patch, patch]` kernel is a `[hidden, c·p·p]` matrix
    // over patches flattened channel-first, as `patches` lays them out.
    let kernel = weights.get(&format!("{root}.embeddings.patch_embedding.weight"), &[d, c, p, p])?;
    let kernel = rein_kernels::transposed(&kernel, d, c * p * p);
    let patch_embedding = Linear {
        weight: Param::from_tensor(Tensor::from_data(TensorData::new(kernel, [c * p * p, d]), device)),
        bias: Some(Param::from_tensor(weights.vector(
            &format!("{root}.embeddings.patch_embedding.bias"),
            d,
            device,
        )?)),
    };
    let positions = config.patches_per_side().pow(2);
    let position_embedding = weights.get(&format!("{root}.embeddings.position_embedding.weight"), &[positions, d])?;
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for i in 0..config.num_hidden_layers {
        let l = format!("{root}.encoder.layers.{i}");
        layers.push(VisionLayer {
            layer_norm1: norm(&format!("{l}.layer_norm1"))?,
            q_proj: linear(&format!("{l}.self_attn.q_proj"), d, d)?,
            k_proj: linear(&format!("{l}.self_attn.k_proj"), d, d)?,
            v_proj: linear(&format!("{l}.self_attn.v_proj"), d, d)?,
            out_proj: linear(&format!("{l}.self_attn.out_proj"), d, d)?,
            layer_norm2: norm(&format!("{l}.layer_norm2"))?,
            fc1: linear(&format!("{l}.mlp.fc1"), d, config.intermediate_size)?,
            fc2: linear(&format!("{l}.mlp.fc2"), config.intermediate_size, d)?,
        });
    }
    let position_embedding = Param::from_tensor(Tensor::from_data(
        TensorData::new(position_embedding, [positions, d]),
        device,
    ));
    let post_layernorm = norm(&format!("{root}.post_layernorm"))?;
    Ok(VisionEncoder::from_parts(
        patch_embedding,
        position_embedding,
        layers,
        post_layernorm,
        config,
    ))
}

/// The encoder's tensors by their Hugging Face names under `root`, as [`VisionEncoder::read`]
/// reads them (the patch projection as the convolution's kernel).
fn encoder_tensors<B: ReinBackend>(encoder: &VisionEncoder<B>, root: &str) -> crate::safetensors_file::Tensors {
    let mut tensors = crate::safetensors_file::Tensors::new();
    let (d, c, p) = (
        encoder.config().hidden_size,
        encoder.config().num_channels,
        encoder.config().patch_size,
    );
    let (_, kernel) = linear_weight(&encoder.patch_embedding);
    tensors.insert(
        format!("{root}.embeddings.patch_embedding.weight"),
        (vec![d, c, p, p], kernel),
    );
    if let Some(bias) = &encoder.patch_embedding.bias {
        tensors.insert(
            format!("{root}.embeddings.patch_embedding.bias"),
            vector_tensor(bias.val()),
        );
    }
    let mut linear = |name: String, layer: &Linear<B>| {
        if let Some(bias) = &layer.bias {
            tensors.insert(format!("{name}.bias"), vector_tensor(bias.val()));
        }
        tensors.insert(format!("{name}.weight"), linear_weight(layer));
    };
    for (i, layer) in encoder.layers.iter().enumerate() {
        let l = format!("{root}.encoder.layers.{i}");
        linear(format!("{l}.self_attn.q_proj"), &layer.q_proj);
        linear(format!("{l}.self_attn.k_proj"), &layer.k_proj);
        linear(format!("{l}.self_attn.v_proj"), &layer.v_proj);
        linear(format!("{l}.self_attn.out_proj"), &layer.out_proj);
        linear(format!("{l}.mlp.fc1"), &layer.fc1);
        linear(format!("{l}.mlp.fc2"), &layer.fc2);
    }
    let norms = (encoder.layers.iter().enumerate())
        .flat_map(|(i, layer)| {
            let l = format!("{root}.encoder.layers.{i}");
            [
                (format!("{l}.layer_norm1"), &layer.layer_norm1),
                (format!("{l}.layer_norm2"), &layer.layer_norm2),
            ]
        })
        .chain([(format!("{root}.post_layernorm"), &encoder.post_layernorm)]);
    for (name, norm) in norms {
        tensors.insert(format!("{name}.weight"), vector_tensor(norm.gamma.val()));
        if let Some(beta) = &norm.beta {
            tensors.insert(format!("{name}.bias"), vector_tensor(beta.val()));
        }
    }
    let positions = encoder.position_embedding.val();
    tensors.insert(
        format!("{root}.embeddings.position_embedding.weight"),
        (positions.dims().to_vec(), floats(positions)),
    );
    tensors
}
