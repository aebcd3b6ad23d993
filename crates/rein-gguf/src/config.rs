//! `config.json` of the Llama / Qwen2 / Mistral / SmolLM family: what a GGUF file converts to
//! and what rein-model builds a model from.

use serde::{Deserialize, Serialize};

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
    /// `llama`, `qwen2` or `mistral` (SmolLM checkpoints are `llama`).
    pub model_type: String,
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
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
    /// RoPE base.
    #[serde(default = "defaults::rope_theta")]
    pub rope_theta: f64,
    /// RoPE scaling, as Llama 3 and long-context configs set it.
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    /// Longest sequence the positions were trained for.
    #[serde(default = "defaults::max_position_embeddings")]
    pub max_position_embeddings: usize,
    /// The LM head shares the token embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Llama's switch for q/k/v/o biases (Qwen2 always has q/k/v biases and no o bias).
    #[serde(default)]
    pub attention_bias: bool,
    /// Biases in the MLP projections.
    #[serde(default)]
    pub mlp_bias: bool,
    /// The MLP activation; only `silu` is supported.
    #[serde(default = "defaults::hidden_act")]
    pub hidden_act: String,
    /// Mistral-style sliding-window attention, unsupported when set and smaller than the context.
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Qwen2's switch for the sliding window.
    #[serde(default)]
    pub use_sliding_window: bool,
    /// Beginning-of-sequence token id.
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token id(s).
    #[serde(default)]
    pub eos_token_id: Option<TokenIds>,
    /// The dtype the weights were saved in (`dtype` in transformers 5).
    #[serde(default, alias = "dtype")]
    pub torch_dtype: Option<String>,
    /// transformers 5 puts `rope_theta` and the scaling together here.
    #[serde(default, skip_serializing)]
    pub rope_parameters: Option<RopeScaling>,
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

impl LmConfig {
    /// Parses a `config.json`, folding transformers 5's `rope_parameters` into `rope_theta` and
    /// `rope_scaling`.
    pub fn from_json(value: serde_json::Value) -> Result<Self, String> {
        let mut config: LmConfig = serde_json::from_value(value).map_err(|e| e.to_string())?;
        if let Some(mut params) = config.rope_parameters.take() {
            if let Some(theta) = params.rope_theta.take() {
                config.rope_theta = theta;
            }
            if params.rope_type != "default" {
                config.rope_scaling = Some(params);
            }
        }
        Ok(config)
    }

    /// A `config.json` transformers (4 and 5) loads: the architecture class, every field, and
    /// RoPE settings in both layouts.
    pub fn to_hf_json(&self) -> String {
        let architecture = match self.model_type.as_str() {
            "qwen2" => "Qwen2ForCausalLM",
            "mistral" => "MistralForCausalLM",
            _ => "LlamaForCausalLM",
        };
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Some(map) = value.as_object_mut() {
            map.insert("architectures".into(), serde_json::json!([architecture]));
            map.insert("torch_dtype".into(), "float32".into());
            map.insert("head_dim".into(), self.head_dim().into());
            map.insert("num_key_value_heads".into(), self.kv_heads().into());
            let mut params = serde_json::json!({ "rope_theta": self.rope_theta, "rope_type": "default" });
            if let Some(scaling) = &self.rope_scaling {
                params = serde_json::to_value(scaling).unwrap_or_default();
                params["rope_theta"] = self.rope_theta.into();
            }
            map.insert("rope_parameters".into(), params);
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
        self.model_type == "qwen2" || self.attention_bias
    }

    /// Whether the output projection has a bias.
    pub fn o_bias(&self) -> bool {
        self.model_type != "qwen2" && self.attention_bias
    }

    /// End-of-sequence ids (empty when the config names none).
    pub fn eos_ids(&self) -> Vec<u32> {
        self.eos_token_id.as_ref().map(TokenIds::to_vec).unwrap_or_default()
    }

    /// Refuses what rein cannot run faithfully, naming the field.
    pub fn validate(&self) -> Result<(), UnsupportedConfig> {
        let unsupported = |field: &str, reason: String| {
            Err(UnsupportedConfig {
                field: field.into(),
                reason,
            })
        };
        if !["llama", "qwen2", "mistral"].contains(&self.model_type.as_str()) {
            return unsupported(
                "model_type",
                format!(
                    "`{}` is not supported (supported: llama, qwen2, mistral — which covers SmolLM)",
                    self.model_type
                ),
            );
        }
        if self.hidden_act != "silu" {
            return unsupported(
                "hidden_act",
                format!("`{}` is not supported (only silu)", self.hidden_act),
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
        if !self.head_dim().is_multiple_of(2) {
            return unsupported(
                "head_dim",
                format!("RoPE needs an even head dimension, got {}", self.head_dim()),
            );
        }
        let window_active = match self.model_type.as_str() {
            "qwen2" => self.use_sliding_window,
            _ => self.sliding_window.is_some_and(|w| w < self.max_position_embeddings),
        };
        if window_active {
            return unsupported("sliding_window", "sliding-window attention is not supported".into());
        }
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
