//! Qwen2-VL and Qwen2.5-VL (`Qwen2VLForConditionalGeneration`,
//! `Qwen2_5_VLForConditionalGeneration`): a Qwen2 decoder whose prompts' `<|image_pad|>`
//! tokens read the merged features of its vision transformer ([`Qwen2VlVision`]) one for one, in
//! order, at multimodal positions ([`multimodal_positions`]: M-RoPE, each rotary frequency turned
//! by the temporal, height or width position as `mrope_section` assigns it), and its checkpoint
//! layout: the hub's (`model.*` for the decoder, `visual.*` for the vision tower) or transformers
//! 5's in-memory one (`model.language_model.*`, `model.visual.*`), config with or without a
//! nested `text_config`.

use std::path::Path;

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::{Tensor, TensorData};
use serde_json::Value;

use super::image_side::ImageSide;
use super::qwen2_vl_side::Qwen2VlSide;
use super::qwen2_vl_vision::{
    GatedMlp, PatchMerger, Qwen2VlGeneration, Qwen2VlVision, Qwen2VlVisionBlock, Qwen2VlVisionConfig, TwoLayerMlp,
    VisionMlp, VisionNorm,
};
use super::vlm_checkpoint::{DecoderAndHead, decoder_and_head_tensors, image_token_id};
use crate::backend::ReinBackend;
use crate::lm::model_dir::{Weights, floats, linear_weight, read_json, vector_tensor, write_model_dir};
use crate::lm::{CausalLm, LmConfig, LoadError, RmsNorm};
use crate::safetensors_file::Tensors;

/// The architectures and their vision towers.
const ARCHITECTURES: [(&str, Qwen2VlGeneration); 2] = [
    ("Qwen2VLForConditionalGeneration", Qwen2VlGeneration::Qwen2Vl),
    ("Qwen2_5_VLForConditionalGeneration", Qwen2VlGeneration::Qwen2_5Vl),
];

/// The tower of the architecture `config` names, if it is Qwen2-VL or Qwen2.5-VL.
fn generation(config: &Value) -> Option<Qwen2VlGeneration> {
    let architecture = config["architectures"][0].as_str()?;
    ARCHITECTURES
        .iter()
        .find(|(name, _)| *name == architecture)
        .map(|&(_, g)| g)
}

/// Whether the checkpoint directory `dir` holds a Qwen2-VL or Qwen2.5-VL model (its
/// `config.json` names `Qwen2VLForConditionalGeneration` or
/// `Qwen2_5_VLForConditionalGeneration`); `false` when it cannot be read.
pub fn is_qwen2_vl(dir: &Path) -> bool {
    read_json(&dir.join("config.json")).is_ok_and(|config| generation(&config).is_some())
}

/// Loads the Qwen2-VL or Qwen2.5-VL model in the checkpoint directory `dir` onto `device`: its
/// decoder with its image side ([`CausalLm::vision`]).
pub(crate) fn load_qwen2_vl<B: ReinBackend>(dir: &Path, device: &B::Device) -> Result<CausalLm<B>, LoadError> {
    let path = dir.join("config.json");
    let raw = read_json(&path)?;
    let json_error = |reason: String| LoadError::Json {
        path: path.clone(),
        reason,
    };
    let Some(generation) = generation(&raw) else {
        let architecture = raw["architectures"][0].as_str().unwrap_or_default();
        return Err(LoadError::Unsupported {
            field: "architectures".into(),
            reason: format!(
                "`{architecture}` is not {}",
                ARCHITECTURES.map(|(name, _)| name).join(" or ")
            ),
        });
    };
    let (text_config, mrope_section) = text_config(&raw).map_err(json_error)?;
    text_config.validate()?;
    let vision_config = Qwen2VlVisionConfig::from_json(&raw["vision_config"], generation).map_err(json_error)?;
    if vision_config.hidden_size != text_config.hidden_size {
        return Err(json_error(format!(
            "vision_config's output width {} is not the decoder's hidden_size {}",
            vision_config.hidden_size, text_config.hidden_size
        )));
    }
    let image_token_id = image_token_id(&raw, &text_config).map_err(json_error)?;
    let weights = Weights::open(dir)?;
    let (lm_root, visual_root) = match weights.has("model.language_model.embed_tokens.weight") {
        true => ("model.language_model", "model.visual"),
        false => ("model", "visual"),
    };
    let decoder = DecoderAndHead::read(&weights, &text_config, &raw, lm_root, device)?;
    let visual = read_visual(&weights, vision_config, visual_root, device)?;
    let side = Qwen2VlSide::new(visual, image_token_id, mrope_section, raw);
    decoder.with_vision(&weights, text_config, ImageSide::Qwen2Vl(side))
}

/// Writes `model` (merged: no LoRA adapters), whose image side is `side`, to `dir` in the hub's
/// layout (`config.json` as read, `model.safetensors` in f32), loadable by transformers.
pub(crate) fn save_qwen2_vl<B: ReinBackend>(
    model: &CausalLm<B>,
    side: &Qwen2VlSide<B>,
    dir: &Path,
) -> Result<(), LoadError> {
    let mut tensors = decoder_and_head_tensors(model, "model");
    tensors.extend(visual_tensors(&side.visual, "visual"));
    let config = serde_json::to_string_pretty(&side.config_json).unwrap_or_default();
    write_model_dir(dir, &tensors, &config)
}

/// The decoder's config from a Qwen2-VL `config.json` (nested `text_config`, or the hub's flat
/// layout) as a Qwen2 config, and its `mrope_section`, which must cover the rotary frequencies.
fn text_config(raw: &Value) -> Result<(LmConfig, [usize; 3]), String> {
    let mut text = match &raw["text_config"] {
        Value::Object(_) => raw["text_config"].clone(),
        _ => raw.clone(),
    };
    let map = text.as_object_mut().ok_or("config.json is not an object")?;
    let rope = map
        .remove("rope_parameters")
        .or_else(|| map.remove("rope_scaling"))
        .or_else(|| raw.get("rope_scaling").cloned())
        .unwrap_or(Value::Null);
    let kind = rope["rope_type"]
        .as_str()
        .or(rope["type"].as_str())
        .unwrap_or("default");
    if !matches!(kind, "default" | "mrope") {
        return Err(format!(
            "text_config.rope_parameters.rope_type: `{kind}` is not supported (default, mrope)"
        ));
    }
    let section: Vec<usize> = (rope["mrope_section"].as_array())
        .map(|s| s.iter().filter_map(Value::as_u64).map(|n| n as usize).collect())
        .unwrap_or_else(|| vec![16, 24, 24]);
    if let Some(theta) = rope["rope_theta"].as_f64() {
        map.insert("rope_theta".into(), theta.into());
    }
    map.entry("rope_theta").or_insert(1_000_000.0.into());
    map.insert("model_type".into(), "qwen2".into());
    map.remove("architectures");
    let config = LmConfig::from_json(text).map_err(|e| format!("text_config: {e}"))?;
    let half = config.head_dim() / 2;
    match section[..] {
        [t, h, w] if t + h + w == half => Ok((config, [t, h, w])),
        _ => Err(format!(
            "text_config.rope_parameters.mrope_section: {section:?} does not split the {half} rotary frequencies in three"
        )),
    }
}

/// The vision tower's tensors by their names under `root`, as [`read_visual`] reads them (the
/// patch projection as the convolution's kernel).
fn visual_tensors<B: ReinBackend>(visual: &Qwen2VlVision<B>, root: &str) -> Tensors {
    let config = visual.config();
    let (e, c, t, p) = (
        config.embed_dim,
        config.in_channels,
        config.temporal_patch_size,
        config.patch_size,
    );
    let mut tensors = Tensors::new();
    let kernel = visual.patch_embed.val().transpose();
    tensors.insert(
        format!("{root}.patch_embed.proj.weight"),
        (vec![e, c, t, p, p], floats(kernel)),
    );
    let mut linear = |name: String, layer: &Linear<B>| {
        if let Some(bias) = &layer.bias {
            tensors.insert(format!("{name}.bias"), vector_tensor(bias.val()));
        }
        tensors.insert(format!("{name}.weight"), linear_weight(layer));
    };
    let mut norms = Vec::new();
    for (i, block) in visual.blocks.iter().enumerate() {
        let b = format!("{root}.blocks.{i}");
        linear(format!("{b}.attn.qkv"), &block.qkv);
        linear(format!("{b}.attn.proj"), &block.proj);
        match &block.mlp {
            VisionMlp::TwoLayer(mlp) => {
                linear(format!("{b}.mlp.fc1"), &mlp.fc1);
                linear(format!("{b}.mlp.fc2"), &mlp.fc2);
            }
            VisionMlp::Gated(mlp) => {
                linear(format!("{b}.mlp.gate_proj"), &mlp.gate_proj);
                linear(format!("{b}.mlp.up_proj"), &mlp.up_proj);
                linear(format!("{b}.mlp.down_proj"), &mlp.down_proj);
            }
        }
        norms.push((format!("{b}.norm1"), &block.norm1));
        norms.push((format!("{b}.norm2"), &block.norm2));
    }
    linear(format!("{root}.merger.mlp.0"), &visual.merger.fc1);
    linear(format!("{root}.merger.mlp.2"), &visual.merger.fc2);
    norms.push((format!("{root}.merger.ln_q"), &visual.merger.ln_q));
    for (name, norm) in norms {
        match norm {
            VisionNorm::Layer(norm) => {
                tensors.insert(format!("{name}.weight"), vector_tensor(norm.gamma.val()));
                if let Some(beta) = &norm.beta {
                    tensors.insert(format!("{name}.bias"), vector_tensor(beta.val()));
                }
            }
            VisionNorm::Rms(norm) => {
                tensors.insert(format!("{name}.weight"), vector_tensor(norm.weight.val()));
            }
        }
    }
    tensors
}

/// The vision tower in the `{root}.*` tensors of `weights` (`visual` on the hub).
fn read_visual<B: ReinBackend>(
    weights: &Weights,
    config: Qwen2VlVisionConfig,
    root: &str,
    device: &B::Device,
) -> Result<Qwen2VlVision<B>, LoadError> {
    let (e, values) = (config.embed_dim, config.patch_values());
    let (c, t, p) = (config.in_channels, config.temporal_patch_size, config.patch_size);
    let norm = |name: &str, width: usize| -> Result<VisionNorm<B>, LoadError> {
        Ok(match config.generation {
            Qwen2VlGeneration::Qwen2Vl => VisionNorm::Layer(weights.layer_norm(name, width, 1e-6, device)?),
            Qwen2VlGeneration::Qwen2_5Vl => VisionNorm::Rms(RmsNorm::new(
                weights.vector(&format!("{name}.weight"), width, device)?,
                1e-6,
                false,
            )),
        })
    };
    let linear = |name: &str, input: usize, output: usize| weights.linear::<B>(name, input, output, true, device);
    let mlp = |b: &str| -> Result<VisionMlp<B>, LoadError> {
        let h = config.mlp_hidden;
        Ok(match config.generation {
            Qwen2VlGeneration::Qwen2Vl => VisionMlp::TwoLayer(TwoLayerMlp {
                fc1: linear(&format!("{b}.mlp.fc1"), e, h)?,
                fc2: linear(&format!("{b}.mlp.fc2"), h, e)?,
            }),
            Qwen2VlGeneration::Qwen2_5Vl => VisionMlp::Gated(GatedMlp {
                gate_proj: linear(&format!("{b}.mlp.gate_proj"), e, h)?,
                up_proj: linear(&format!("{b}.mlp.up_proj"), e, h)?,
                down_proj: linear(&format!("{b}.mlp.down_proj"), h, e)?,
            }),
        })
    };
    // The convolution's `[embed, channels, frames, patch, patch]` kernel is an `[embed, values]`
    // matrix over patches flattened as the processor flattens them.
    let kernel = weights.get(&format!("{root}.patch_embed.proj.weight"), &[e, c, t, p, p])?;
    let kernel = rein_kernels::transposed(&kernel, e, values);
    let patch_embed = Param::from_tensor(Tensor::from_data(TensorData::new(kernel, [values, e]), device));
    let mut blocks = Vec::with_capacity(config.depth);
    for i in 0..config.depth {
        let b = format!("{root}.blocks.{i}");
        blocks.push(Qwen2VlVisionBlock {
            norm1: norm(&format!("{b}.norm1"), e)?,
            qkv: linear(&format!("{b}.attn.qkv"), e, 3 * e)?,
            proj: linear(&format!("{b}.attn.proj"), e, e)?,
            norm2: norm(&format!("{b}.norm2"), e)?,
            mlp: mlp(&b)?,
        });
    }
    let merged = e * config.spatial_merge_size.pow(2);
    let merger = PatchMerger {
        ln_q: norm(&format!("{root}.merger.ln_q"), e)?,
        fc1: linear(&format!("{root}.merger.mlp.0"), merged, merged)?,
        fc2: linear(&format!("{root}.merger.mlp.2"), merged, config.hidden_size)?,
    };
    Ok(Qwen2VlVision::from_parts(patch_embed, blocks, merger, config))
}
