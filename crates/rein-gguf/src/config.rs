//! `config.json` of the decoder-only families rein runs — Llama (SmolLM), Mistral, Qwen2, Qwen3,
//! Qwen3-MoE, Gemma 2 and Gemma 3 — what a GGUF file converts to and what rein-model builds a
//! model from.
//!
//! The families share one layout (embeddings, pre-norm decoder layers of attention and a gated
//! MLP, a final norm, a head) and differ in a handful of switches, each a method here read off
//! the config the way transformers' config class reads it:
//!
//! | switch | Llama / Mistral | Qwen2 | Qwen3 | Qwen3-MoE | Gemma 2 | Gemma 3 |
//! |---|---|---|---|---|---|---|
//! | q/k/v bias | `attention_bias` | always | `attention_bias` | `attention_bias` | `attention_bias` | `attention_bias` |
//! | per-head q/k RMSNorm | – | – | yes | yes | – | yes |
//! | RMSNorm weight | `w` | `w` | `w` | `w` | `1 + w` | `1 + w` |
//! | norms per layer | 2 | 2 | 2 | 2 | 4 | 4 |
//! | embeddings scaled by √hidden | – | – | – | – | yes | yes |
//! | attention scale | `1/√head_dim` | same | same | same | `query_pre_attn_scalar^-½` | same |
//! | sliding window | Mistral: every layer | `use_sliding_window`, layers ≥ `max_window_layers` | as Qwen2 | as Qwen2 | every other layer | `layer_types` (5 local : 1 global) |
//! | soft-capping | – | – | – | – | attention 50, logits 30 | where set |
//! | MLP | SwiGLU | SwiGLU | SwiGLU | routed experts | GeGLU (tanh) | GeGLU (tanh) |

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::family::{Family, GateActivation, LayerAttention, MoeConfig};

/// An architecture setting rein does not implement, naming the `config.json` field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("config.json: `{field}`: {reason}")]
pub struct UnsupportedConfig {
    /// The config field.
    pub field: String,
    /// What is unsupported.
    pub reason: String,
}

/// The architecture settings rein reads from a Hugging Face `config.json`. Unknown fields are
/// ignored (HF configs carry many); unsupported settings are refused by [`LmConfig::validate`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LmConfig {
    /// The family: one of [`Family::ALL`].
    pub model_type: String,
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the gated MLP (of a dense layer).
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention); defaults to `num_attention_heads`.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Per-head width; defaults to `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "defaults::rms_norm_eps")]
    pub rms_norm_eps: f64,
    /// RoPE base (of the global layers, where local ones have their own).
    #[serde(default = "defaults::rope_theta")]
    pub rope_theta: f64,
    /// RoPE scaling, as Llama 3 and long-context configs set it.
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    /// Gemma 3: the RoPE base of the sliding-window layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_local_base_freq: Option<f64>,
    /// Longest sequence the positions were trained for.
    #[serde(default = "defaults::max_position_embeddings")]
    pub max_position_embeddings: usize,
    /// The LM head shares the token embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// The switch for q/k/v/o biases (Qwen2 always has q/k/v biases and no o bias).
    #[serde(default)]
    pub attention_bias: bool,
    /// Biases in the MLP projections.
    #[serde(default)]
    pub mlp_bias: bool,
    /// The MLP's gate activation (`silu` or `gelu_pytorch_tanh`).
    #[serde(default = "defaults::hidden_act")]
    pub hidden_act: String,
    /// Gemma's name for the gate activation; wins over `hidden_act` when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_activation: Option<String>,
    /// The window of the sliding-window layers, in keys (the query's own included).
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Qwen2/Qwen3's switch for the sliding window.
    #[serde(default)]
    pub use_sliding_window: bool,
    /// Qwen2/Qwen3: with `use_sliding_window`, layers from this one on slide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_window_layers: Option<usize>,
    /// Each layer's attention, `full_attention` or `sliding_attention` (transformers 5 writes
    /// it for every family that has windows; older configs leave it to the rules above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    /// Gemma 3 before `layer_types`: every `n`-th layer is global, the others slide.
    #[serde(default, skip_serializing)]
    pub sliding_window_pattern: Option<usize>,
    /// Gemma: attention scores are scaled by `query_pre_attn_scalar^-½` instead of `head_dim^-½`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_pre_attn_scalar: Option<f64>,
    /// Gemma 2: attention scores capped as `c·tanh(s/c)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_logit_softcapping: Option<f64>,
    /// Gemma 2: logits capped as `c·tanh(z/c)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_logit_softcapping: Option<f64>,
    /// Gemma 3: attention within a window in both directions (its embedding models); unsupported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_bidirectional_attention: Option<bool>,
    /// Mixture of experts: experts per MoE layer (`num_local_experts` in transformers 5).
    #[serde(default, alias = "num_local_experts", skip_serializing_if = "Option::is_none")]
    pub num_experts: Option<usize>,
    /// Mixture of experts: experts per token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_experts_per_tok: Option<usize>,
    /// Mixture of experts: width of each expert's MLP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_intermediate_size: Option<usize>,
    /// Mixture of experts: renormalise the chosen experts' weights.
    #[serde(default)]
    pub norm_topk_prob: bool,
    /// Mixture of experts: coefficient of the load-balancing loss.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router_aux_loss_coef: Option<f64>,
    /// Mixture of experts: every `n`-th layer is sparse (1: all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoder_sparse_step: Option<usize>,
    /// Mixture of experts: layers that keep a dense MLP.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mlp_only_layers: Vec<usize>,
    /// Beginning-of-sequence token id.
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token id(s).
    #[serde(default)]
    pub eos_token_id: Option<TokenIds>,
    /// The dtype the weights were saved in (`dtype` in transformers 5).
    #[serde(default, alias = "dtype")]
    pub torch_dtype: Option<String>,
    /// transformers 5 puts `rope_theta` and the scaling together here (Gemma 3: one entry per
    /// layer type); folded into the fields above by [`LmConfig::from_json`].
    #[serde(default, skip_serializing)]
    pub rope_parameters: Option<Value>,
}

/// One token id or several (HF allows both for `eos_token_id`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    /// One id.
    One(u32),
    /// Several ids.
    Many(Vec<u32>),
}

impl TokenIds {
    /// As a list.
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }
}

/// `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5) from a config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RopeScaling {
    /// transformers 5 keeps the RoPE base here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// `default`, `linear` or `llama3` (older configs call it `type`).
    #[serde(alias = "type", default = "defaults::rope_type")]
    pub rope_type: String,
    /// The scaling factor.
    #[serde(default = "defaults::one")]
    pub factor: f64,
    /// Llama 3: wavelengths above `original / low_freq_factor` are scaled fully.
    #[serde(default)]
    pub low_freq_factor: Option<f64>,
    /// Llama 3: wavelengths below `original / high_freq_factor` are kept.
    #[serde(default)]
    pub high_freq_factor: Option<f64>,
    /// Llama 3: the context length before scaling.
    #[serde(default)]
    pub original_max_position_embeddings: Option<usize>,
}

/// The layer types of transformers' `layer_types`.
const FULL: &str = "full_attention";
const SLIDING: &str = "sliding_attention";

impl LmConfig {
    /// Parses a `config.json`: the family's defaults for the fields it leaves out (as its
    /// transformers config class has them), then transformers 5's `rope_parameters` folded into
    /// `rope_theta`, `rope_scaling` and (Gemma 3's per-layer-type entries) `rope_local_base_freq`.
    pub fn from_json(mut value: Value) -> Result<Self, String> {
        let family = value.get("model_type").and_then(Value::as_str).and_then(Family::of);
        if let (Some(family), Some(map)) = (family, value.as_object_mut()) {
            // transformers 5's name, so that the default below does not add a second one.
            if let Some(experts) = map.remove("num_local_experts") {
                map.entry("num_experts").or_insert(experts);
            }
            if let Value::Object(defaults) = family.defaults() {
                for (key, default) in defaults {
                    map.entry(key).or_insert(default);
                }
            }
        }
        let mut config: LmConfig = serde_json::from_value(value).map_err(|e| e.to_string())?;
        if let Some(params) = config.rope_parameters.take() {
            let per_type = params.get(FULL).is_some() || params.get(SLIDING).is_some();
            let parse = |v: &Value| {
                serde_json::from_value::<RopeScaling>(v.clone()).map_err(|e| format!("rope_parameters: {e}"))
            };
            let (global, local) = match per_type {
                true => (
                    params.get(FULL).map(parse).transpose()?,
                    params.get(SLIDING).map(parse).transpose()?,
                ),
                false => (Some(parse(&params)?), None),
            };
            if let Some(mut global) = global {
                if let Some(theta) = global.rope_theta.take() {
                    config.rope_theta = theta;
                }
                if global.rope_type != "default" {
                    config.rope_scaling = Some(global);
                }
            }
            if let Some(local) = local {
                if local.rope_type != "default" {
                    return Err(format!(
                        "rope_parameters.{SLIDING}.rope_type: `{}` is not supported (the sliding layers' RoPE is unscaled)",
                        local.rope_type
                    ));
                }
                config.rope_local_base_freq = local.rope_theta.or(config.rope_local_base_freq);
            }
        }
        Ok(config)
    }

    /// The family ([`LmConfig::validate`] refuses an unknown `model_type`; this reads it as Llama).
    pub fn family(&self) -> Family {
        Family::of(&self.model_type).unwrap_or(Family::Llama)
    }

    /// A `config.json` transformers (4 and 5) loads: the architecture class, every field, and
    /// RoPE settings in both layouts.
    pub fn to_hf_json(&self) -> String {
        let family = self.family();
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Some(map) = value.as_object_mut() {
            map.insert("architectures".into(), json!([family.causal_lm_class()]));
            map.insert("torch_dtype".into(), "float32".into());
            map.insert("head_dim".into(), self.head_dim().into());
            map.insert("num_key_value_heads".into(), self.kv_heads().into());
            let mut params = json!({ "rope_theta": self.rope_theta, "rope_type": "default" });
            if let Some(scaling) = &self.rope_scaling {
                params = serde_json::to_value(scaling).unwrap_or_default();
                params["rope_theta"] = self.rope_theta.into();
            }
            if let Some(local) = self.rope_local_base_freq {
                params = json!({ FULL: params, SLIDING: { "rope_theta": local, "rope_type": "default" } });
            }
            map.insert("rope_parameters".into(), params);
            let windowed = !matches!(family, Family::Llama | Family::Mistral);
            if windowed {
                let types: Vec<&str> = self
                    .layer_attention()
                    .iter()
                    .map(|a| match a {
                        LayerAttention::Full => FULL,
                        LayerAttention::Sliding(_) => SLIDING,
                    })
                    .collect();
                map.insert("layer_types".into(), json!(types));
            }
            if family == Family::Qwen3Moe {
                map.insert("norm_topk_prob".into(), self.norm_topk_prob.into());
                map.insert("mlp_only_layers".into(), json!(self.mlp_only_layers));
            } else {
                map.remove("norm_topk_prob");
            }
            if family.norm_adds_one() {
                map.insert(
                    "hidden_activation".into(),
                    self.hidden_activation
                        .clone()
                        .unwrap_or_else(|| self.hidden_act.clone())
                        .into(),
                );
                for key in ["attn_logit_softcapping", "final_logit_softcapping"] {
                    map.entry(key).or_insert(Value::Null);
                }
            }
        }
        serde_json::to_string_pretty(&value).unwrap_or_default() + "\n"
    }

    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Per-head width.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Whether q, k and v projections have biases.
    pub fn qkv_bias(&self) -> bool {
        self.family() == Family::Qwen2 || self.attention_bias
    }

    /// Whether the output projection has a bias.
    pub fn o_bias(&self) -> bool {
        self.family() != Family::Qwen2 && self.attention_bias
    }

    /// Whether queries and keys get an RMSNorm per head before RoPE (`q_norm`, `k_norm`).
    pub fn qk_norm(&self) -> bool {
        matches!(self.family(), Family::Qwen3 | Family::Qwen3Moe | Family::Gemma3)
    }

    /// Whether each layer has four norms (Gemma: before and after attention and the MLP, the
    /// after-norms applied to the block's output before the residual sum).
    pub fn sandwich_norms(&self) -> bool {
        self.family().norm_adds_one()
    }

    /// What the token embeddings are multiplied by (Gemma: `√hidden`).
    pub fn embedding_scale(&self) -> Option<f32> {
        self.family()
            .norm_adds_one()
            .then(|| (self.hidden_size as f64).sqrt() as f32)
    }

    /// The gated MLP's activation (unknown names read as SiLU; [`LmConfig::validate`] refuses them).
    pub fn gate_activation(&self) -> GateActivation {
        match self.hidden_activation.as_deref().unwrap_or(&self.hidden_act) {
            "gelu_pytorch_tanh" => GateActivation::GeluTanh,
            _ => GateActivation::Silu,
        }
    }

    /// What query–key products are multiplied by before the softmax.
    pub fn attention_scale(&self) -> f32 {
        match self.query_pre_attn_scalar {
            Some(scalar) => scalar.powf(-0.5) as f32,
            None => 1.0 / (self.head_dim() as f32).sqrt(),
        }
    }

    /// Each layer's attention, as transformers' config class derives `layer_types`.
    pub fn layer_attention(&self) -> Vec<LayerAttention> {
        let layers = self.num_hidden_layers;
        let sliding = |slides: bool| match (slides, self.sliding_window) {
            (true, Some(window)) => LayerAttention::Sliding(window),
            _ => LayerAttention::Full,
        };
        if let Some(types) = &self.layer_types {
            return types.iter().map(|t| sliding(t == SLIDING)).collect();
        }
        (0..layers)
            .map(|i| match self.family() {
                Family::Llama => LayerAttention::Full,
                Family::Mistral => sliding(true),
                Family::Qwen2 | Family::Qwen3 | Family::Qwen3Moe => {
                    sliding(self.use_sliding_window && i >= self.max_window_layers.unwrap_or(0))
                }
                Family::Gemma2 => sliding(i % 2 == 0),
                Family::Gemma3 => sliding(!(i + 1).is_multiple_of(self.sliding_window_pattern.unwrap_or(6).max(1))),
            })
            .collect()
    }

    /// The RoPE base of layer `i`: the local base on Gemma 3's sliding layers, else `rope_theta`.
    pub fn layer_uses_local_rope(&self, i: usize) -> bool {
        self.rope_local_base_freq.is_some() && matches!(self.layer_attention().get(i), Some(LayerAttention::Sliding(_)))
    }

    /// The mixture-of-experts settings, for a MoE family.
    pub fn moe(&self) -> Option<MoeConfig> {
        if self.family() != Family::Qwen3Moe {
            return None;
        }
        Some(MoeConfig {
            experts: self.num_experts.unwrap_or(0),
            top_k: self.num_experts_per_tok.unwrap_or(0),
            intermediate_size: self.moe_intermediate_size.unwrap_or(0),
            norm_topk_prob: self.norm_topk_prob,
            router_aux_loss_coef: self.router_aux_loss_coef.unwrap_or(0.0),
        })
    }

    /// Whether layer `i` routes its tokens to experts (Qwen3-MoE's `decoder_sparse_step` and
    /// `mlp_only_layers`).
    pub fn is_moe_layer(&self, i: usize) -> bool {
        self.moe().is_some_and(|m| m.experts > 0)
            && !self.mlp_only_layers.contains(&i)
            && (i + 1).is_multiple_of(self.decoder_sparse_step.unwrap_or(1).max(1))
    }

    /// End-of-sequence ids (empty when the config names none).
    pub fn eos_ids(&self) -> Vec<u32> {
        self.eos_token_id.as_ref().map(TokenIds::to_vec).unwrap_or_default()
    }

    /// Refuses what rein cannot run faithfully, naming the field.
    pub fn validate(&self) -> Result<(), UnsupportedConfig> {
        let Some(family) = Family::of(&self.model_type) else {
            return unsupported(
                "model_type",
                format!(
                    "`{}` is not supported (supported: {} — llama covers SmolLM)",
                    self.model_type,
                    Family::known()
                ),
            );
        };
        self.validate_shape()?;
        self.validate_attention()?;
        self.validate_experts(family)?;
        self.validate_rope_scaling()
    }

    /// The activation, the head counts and the head dimension.
    fn validate_shape(&self) -> Result<(), UnsupportedConfig> {
        let activation_key = match self.hidden_activation {
            Some(_) => "hidden_activation",
            None => "hidden_act",
        };
        let activation = self.hidden_activation.as_deref().unwrap_or(&self.hidden_act);
        if !["silu", "gelu_pytorch_tanh"].contains(&activation) {
            return unsupported(
                activation_key,
                format!("`{activation}` is not supported (supported: silu, gelu_pytorch_tanh)"),
            );
        }
        let heads = self.num_attention_heads;
        if heads == 0 || self.kv_heads() == 0 || !heads.is_multiple_of(self.kv_heads()) {
            return unsupported(
                "num_key_value_heads",
                format!(
                    "{} key/value heads do not divide {heads} attention heads",
                    self.kv_heads()
                ),
            );
        }
        if !self.head_dim().is_multiple_of(2) || self.head_dim() == 0 {
            return unsupported(
                "head_dim",
                format!("RoPE needs an even, positive head dimension, got {}", self.head_dim()),
            );
        }
        Ok(())
    }

    /// Layer types, sliding windows, the attention's scale and soft-caps.
    fn validate_attention(&self) -> Result<(), UnsupportedConfig> {
        if let Some(types) = &self.layer_types {
            if types.len() != self.num_hidden_layers {
                return unsupported(
                    "layer_types",
                    format!("{} entries for {} layers", types.len(), self.num_hidden_layers),
                );
            }
            if let Some(other) = types.iter().find(|t| *t != FULL && *t != SLIDING) {
                return unsupported(
                    "layer_types",
                    format!("`{other}` is not supported (supported: {FULL}, {SLIDING})"),
                );
            }
            if types.iter().any(|t| t == SLIDING) && self.sliding_window.is_none() {
                return unsupported(
                    "sliding_window",
                    format!("`layer_types` has {SLIDING} layers but no window"),
                );
            }
        }
        if self.sliding_window == Some(0) {
            return unsupported("sliding_window", "must be at least 1".into());
        }
        if self.use_bidirectional_attention == Some(true) {
            return unsupported(
                "use_bidirectional_attention",
                "bidirectional attention (embedding models) is not supported".into(),
            );
        }
        if let Some(scalar) = self.query_pre_attn_scalar
            && !(scalar.is_finite() && scalar > 0.0)
        {
            return unsupported("query_pre_attn_scalar", format!("must be positive, not {scalar}"));
        }
        for (key, cap) in [
            ("attn_logit_softcapping", self.attn_logit_softcapping),
            ("final_logit_softcapping", self.final_logit_softcapping),
        ] {
            if let Some(cap) = cap
                && !(cap.is_finite() && cap > 0.0)
            {
                return unsupported(key, format!("must be positive, not {cap}"));
            }
        }
        Ok(())
    }

    /// A mixture-of-experts model's expert counts; experts in a family without them.
    fn validate_experts(&self, family: Family) -> Result<(), UnsupportedConfig> {
        if let Some(moe) = self.moe() {
            if moe.experts == 0 {
                return unsupported("num_experts", "a MoE model needs at least one expert".into());
            }
            if moe.top_k == 0 || moe.top_k > moe.experts {
                return unsupported(
                    "num_experts_per_tok",
                    format!("{} experts per token of {} experts", moe.top_k, moe.experts),
                );
            }
            if moe.intermediate_size == 0 {
                return unsupported("moe_intermediate_size", "must be at least 1".into());
            }
            if self.decoder_sparse_step == Some(0) {
                return unsupported("decoder_sparse_step", "must be at least 1".into());
            }
        } else if self.num_experts.is_some_and(|e| e > 0) {
            return unsupported(
                "num_experts",
                format!("experts are not supported in a `{}` model", family.model_type()),
            );
        }
        Ok(())
    }

    /// The RoPE scaling types rein implements, with the keys each needs.
    fn validate_rope_scaling(&self) -> Result<(), UnsupportedConfig> {
        if let Some(scaling) = &self.rope_scaling {
            match scaling.rope_type.as_str() {
                "default" | "linear" => {}
                "llama3" => {
                    if scaling.low_freq_factor.is_none()
                        || scaling.high_freq_factor.is_none()
                        || scaling.original_max_position_embeddings.is_none()
                    {
                        return unsupported(
                            "rope_scaling",
                            "llama3 scaling needs low_freq_factor, high_freq_factor and original_max_position_embeddings".into(),
                        );
                    }
                }
                other => {
                    return unsupported(
                        "rope_scaling.rope_type",
                        format!("`{other}` is not supported (supported: default, linear, llama3)"),
                    );
                }
            }
        }
        Ok(())
    }
}

impl Default for LmConfig {
    /// A one-layer Llama with the defaults of transformers' `LlamaConfig` where it has them;
    /// a starting point for code that fills in the sizes.
    fn default() -> Self {
        Self {
            model_type: "llama".into(),
            vocab_size: 0,
            hidden_size: 0,
            intermediate_size: 0,
            num_hidden_layers: 1,
            num_attention_heads: 1,
            num_key_value_heads: None,
            head_dim: None,
            rms_norm_eps: defaults::rms_norm_eps(),
            rope_theta: defaults::rope_theta(),
            rope_scaling: None,
            rope_local_base_freq: None,
            max_position_embeddings: defaults::max_position_embeddings(),
            tie_word_embeddings: false,
            attention_bias: false,
            mlp_bias: false,
            hidden_act: defaults::hidden_act(),
            hidden_activation: None,
            sliding_window: None,
            use_sliding_window: false,
            max_window_layers: None,
            layer_types: None,
            sliding_window_pattern: None,
            query_pre_attn_scalar: None,
            attn_logit_softcapping: None,
            final_logit_softcapping: None,
            use_bidirectional_attention: None,
            num_experts: None,
            num_experts_per_tok: None,
            moe_intermediate_size: None,
            norm_topk_prob: false,
            router_aux_loss_coef: None,
            decoder_sparse_step: None,
            mlp_only_layers: Vec::new(),
            bos_token_id: None,
            eos_token_id: None,
            torch_dtype: None,
            rope_parameters: None,
        }
    }
}

mod defaults {
    pub fn rms_norm_eps() -> f64 {
        1e-6
    }
    pub fn rope_theta() -> f64 {
        10_000.0
    }
    pub fn max_position_embeddings() -> usize {
        2048
    }
    pub fn hidden_act() -> String {
        "silu".into()
    }
    pub fn one() -> f64 {
        1.0
    }
    pub fn rope_type() -> String {
        "default".into()
    }
}

/// An [`UnsupportedConfig`] naming `field`.
fn unsupported(field: &str, reason: String) -> Result<(), UnsupportedConfig> {
    Err(UnsupportedConfig {
        field: field.into(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: Value) -> LmConfig {
        let mut value = json!({
            "model_type": "llama", "vocab_size": 8, "hidden_size": 16, "intermediate_size": 8,
            "num_hidden_layers": 6, "num_attention_heads": 2,
        });
        for (k, v) in extra.as_object().unwrap() {
            value[k] = v.clone();
        }
        LmConfig::from_json(value).unwrap()
    }

    #[test]
    fn gemma3_defaults_follow_transformers() {
        let c = config(json!({"model_type": "gemma3_text", "sliding_window": 4}));
        c.validate().unwrap();
        assert_eq!(c.gate_activation(), GateActivation::GeluTanh);
        assert_eq!(c.attention_scale(), 1.0 / 16.0, "query_pre_attn_scalar 256");
        assert_eq!(c.rope_theta, 1_000_000.0);
        assert_eq!(c.rope_local_base_freq, Some(10_000.0));
        // Every sixth layer is global.
        let sliding = LayerAttention::Sliding(4);
        assert_eq!(
            c.layer_attention(),
            [sliding, sliding, sliding, sliding, sliding, LayerAttention::Full]
        );
        assert!(c.layer_uses_local_rope(0) && !c.layer_uses_local_rope(5));
        assert_eq!(c.embedding_scale(), Some(4.0));
        assert!(c.qk_norm() && c.sandwich_norms() && !c.qkv_bias());
    }

    #[test]
    fn per_layer_type_rope_parameters_are_folded_in() {
        let c = config(json!({"model_type": "gemma3_text", "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        }}));
        assert_eq!(c.rope_scaling.as_ref().map(|s| s.factor), Some(8.0));
        assert_eq!((c.rope_theta, c.rope_local_base_freq), (1e6, Some(1e4)));
        // And written back in the same layout.
        let back = LmConfig::from_json(serde_json::from_str(&c.to_hf_json()).unwrap()).unwrap();
        assert_eq!((back.rope_theta, back.rope_local_base_freq), (1e6, Some(1e4)));
        assert_eq!(back.rope_scaling, c.rope_scaling);
        assert_eq!(back.layer_attention(), c.layer_attention());
    }

    #[test]
    fn qwen_windows_start_at_max_window_layers() {
        let c = config(
            json!({"model_type": "qwen2", "use_sliding_window": true, "sliding_window": 3, "max_window_layers": 4}),
        );
        let full = LayerAttention::Full;
        let sliding = LayerAttention::Sliding(3);
        assert_eq!(c.layer_attention(), [full, full, full, full, sliding, sliding]);
        let off = config(json!({"model_type": "qwen2", "sliding_window": 3}));
        assert!(
            off.layer_attention().iter().all(|a| *a == full),
            "use_sliding_window is off"
        );
        let mistral = config(json!({"model_type": "mistral", "sliding_window": 3}));
        assert!(mistral.layer_attention().iter().all(|a| *a == sliding));
    }

    #[test]
    fn qwen3_moe_reads_both_expert_count_names() {
        for key in ["num_experts", "num_local_experts"] {
            let c = config(json!({"model_type": "qwen3_moe", key: 4, "num_experts_per_tok": 2,
                "moe_intermediate_size": 8, "decoder_sparse_step": 2, "mlp_only_layers": [3]}));
            c.validate().unwrap();
            assert_eq!(c.moe().unwrap().experts, 4);
            let sparse: Vec<bool> = (0..6).map(|i| c.is_moe_layer(i)).collect();
            assert_eq!(sparse, [false, true, false, false, false, true]);
        }
    }

    #[test]
    fn unsupported_settings_name_their_key() {
        let field = |extra: Value| config(extra).validate().unwrap_err().field;
        assert_eq!(field(json!({"model_type": "gpt2"})), "model_type");
        assert!(
            config(json!({"model_type": "gpt2"}))
                .validate()
                .unwrap_err()
                .reason
                .contains("qwen3_moe"),
            "the error lists the families"
        );
        assert_eq!(field(json!({"hidden_act": "relu"})), "hidden_act");
        assert_eq!(
            field(json!({"model_type": "gemma3_text", "hidden_activation": "gelu_new"})),
            "hidden_activation"
        );
        assert_eq!(
            field(json!({"layer_types": vec!["chunked_attention"; 6], "sliding_window": 4})),
            "layer_types"
        );
        assert_eq!(
            field(json!({"layer_types": vec!["sliding_attention"; 6]})),
            "sliding_window"
        );
        assert_eq!(
            field(json!({"model_type": "gemma3_text", "use_bidirectional_attention": true})),
            "use_bidirectional_attention"
        );
        assert_eq!(
            field(json!({"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 5})),
            "num_experts_per_tok"
        );
        assert_eq!(field(json!({"num_experts": 4})), "num_experts");
        assert_eq!(
            field(json!({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})),
            "rope_scaling.rope_type"
        );
    }
}
