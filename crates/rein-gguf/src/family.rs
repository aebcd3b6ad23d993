//! The families rein runs and the switches that tell them apart: a family by its `model_type`
//! with the defaults transformers' config class fills in, the gate of its MLP, which keys a
//! layer's attention sees, and its mixture-of-experts settings. [`crate::LmConfig`] reads them
//! off a `config.json`.

use serde_json::{Value, json};

/// A model family, by its `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `llama` (SmolLM, Llama 2 and 3).
    Llama,
    /// `mistral`.
    Mistral,
    /// `qwen2` (Qwen2, Qwen2.5).
    Qwen2,
    /// `qwen3` (dense).
    Qwen3,
    /// `qwen3_moe` (mixture of experts).
    Qwen3Moe,
    /// `gemma2`.
    Gemma2,
    /// `gemma3_text` (the text model of Gemma 3, and the 270M and 1B checkpoints).
    Gemma3,
}

impl Family {
    /// Every family with its `model_type`.
    pub const ALL: [(&'static str, Family); 7] = [
        ("llama", Family::Llama),
        ("mistral", Family::Mistral),
        ("qwen2", Family::Qwen2),
        ("qwen3", Family::Qwen3),
        ("qwen3_moe", Family::Qwen3Moe),
        ("gemma2", Family::Gemma2),
        ("gemma3_text", Family::Gemma3),
    ];

    /// The family of `model_type`, if rein knows it.
    pub fn of(model_type: &str) -> Option<Family> {
        Self::ALL.iter().find(|(name, _)| *name == model_type).map(|&(_, f)| f)
    }

    /// Its `model_type`.
    pub fn model_type(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, f)| *f == self)
            .map_or("llama", |&(name, _)| name)
    }

    /// The `model_type`s rein knows, for error messages.
    pub fn known() -> String {
        Self::ALL.map(|(name, _)| name).join(", ")
    }

    /// The transformers class of its causal LM.
    pub fn causal_lm_class(self) -> &'static str {
        match self {
            Family::Llama => "LlamaForCausalLM",
            Family::Mistral => "MistralForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
            Family::Qwen3Moe => "Qwen3MoeForCausalLM",
            Family::Gemma2 => "Gemma2ForCausalLM",
            Family::Gemma3 => "Gemma3ForCausalLM",
        }
    }

    /// Whether its norms multiply by `1 + w` (Gemma) rather than `w`.
    pub fn norm_adds_one(self) -> bool {
        matches!(self, Family::Gemma2 | Family::Gemma3)
    }

    /// The defaults transformers' config class fills in for fields a `config.json` leaves out,
    /// where they differ from the Llama defaults [`LmConfig`] has.
    pub(crate) fn defaults(self) -> Value {
        match self {
            Family::Gemma2 => json!({
                "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256.0,
                "sliding_window": 4096, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                "tie_word_embeddings": true, "max_position_embeddings": 8192,
            }),
            Family::Gemma3 => json!({
                "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256.0,
                "sliding_window": 4096, "sliding_window_pattern": 6, "rope_theta": 1_000_000.0,
                "rope_local_base_freq": 10_000.0, "tie_word_embeddings": true, "head_dim": 256,
                "max_position_embeddings": 131_072,
            }),
            Family::Qwen2 | Family::Qwen3 => json!({ "max_window_layers": 28, "sliding_window": 4096 }),
            Family::Qwen3Moe => json!({
                "max_window_layers": 28, "sliding_window": 4096, "num_experts": 128, "num_experts_per_tok": 8,
                "moe_intermediate_size": 768, "router_aux_loss_coef": 0.001,
            }),
            Family::Mistral => json!({ "sliding_window": 4096 }),
            Family::Llama => json!({}),
        }
    }
}

/// The gate of a gated MLP: `down(act(gate(x)) ⊙ up(x))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateActivation {
    /// SiLU (SwiGLU): `hidden_act = "silu"`.
    Silu,
    /// GELU with the tanh approximation (GeGLU): `gelu_pytorch_tanh`.
    GeluTanh,
}

/// Which keys one layer's attention sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerAttention {
    /// Every earlier key (`full_attention`).
    Full,
    /// The last `n` keys, its own included (`sliding_attention` with `sliding_window = n`).
    Sliding(usize),
}

impl LayerAttention {
    /// The window, for a sliding layer.
    pub fn window(self) -> Option<usize> {
        match self {
            LayerAttention::Full => None,
            LayerAttention::Sliding(n) => Some(n),
        }
    }
}

/// The mixture-of-experts settings of a `qwen3_moe` config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeConfig {
    /// Experts per MoE layer.
    pub experts: usize,
    /// Experts each token is routed to.
    pub top_k: usize,
    /// Width of each expert's gated MLP.
    pub intermediate_size: usize,
    /// The chosen experts' weights renormalised to sum to one.
    pub norm_topk_prob: bool,
    /// The load-balancing loss's coefficient.
    pub router_aux_loss_coef: f64,
}
