//! Tiny random models (vocabulary 40) for tests of the generator and the sampler, whose logits
//! are spread enough (init std 0.3) to sample varied tokens: a Qwen2 (2 layers, grouped-query
//! attention), and the newer families' shapes — a Gemma 3 (a window of 2 keys on two of its
//! three layers, four norms, GeGLU, q/k norms, two RoPE bases) and a Qwen3-MoE (4 experts, 2
//! per token).

use burn::backend::Flex;
use rein_model::lm::{CausalLm, LmConfig, LmInit};

/// Its vocabulary.
pub const VOCAB: usize = 40;

/// The families [`tiny_family`] makes.
#[allow(dead_code)]
pub const FAMILIES: [&str; 3] = ["qwen2", "gemma3", "qwen3-moe"];

/// The Qwen2, initialised from `seed`.
pub fn tiny_model(seed: u64) -> CausalLm<Flex> {
    tiny_model_on::<Flex>(seed)
}

/// The Qwen2 on the backend `B`, initialised from `seed`.
pub fn tiny_model_on<B: rein_model::ReinBackend>(seed: u64) -> CausalLm<B> {
    tiny_family_on::<B>("qwen2", seed)
}

/// The model of `family` (one of [`FAMILIES`]), initialised from `seed`.
#[allow(dead_code)]
pub fn tiny_family(family: &str, seed: u64) -> CausalLm<Flex> {
    tiny_family_on::<Flex>(family, seed)
}

/// The model of `family` on the backend `B`, initialised from `seed`.
pub fn tiny_family_on<B: rein_model::ReinBackend>(family: &str, seed: u64) -> CausalLm<B> {
    let common = serde_json::json!({
        "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64,
    });
    let specific = match family {
        "qwen2" => serde_json::json!({"model_type": "qwen2", "num_hidden_layers": 2}),
        "gemma3" => serde_json::json!({
            "model_type": "gemma3_text", "num_hidden_layers": 3, "head_dim": 8, "sliding_window": 2,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "query_pre_attn_scalar": 6,
        }),
        "qwen3-moe" => serde_json::json!({
            "model_type": "qwen3_moe", "num_hidden_layers": 2, "head_dim": 8, "num_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 16, "norm_topk_prob": true,
        }),
        other => panic!("no tiny {other}"),
    };
    let mut value = common;
    for (k, v) in specific.as_object().unwrap() {
        value[k] = v.clone();
    }
    let config = LmConfig::from_json(value).unwrap();
    config.validate().unwrap();
    <B as burn::tensor::backend::Backend>::seed(&Default::default(), seed);
    LmInit { config, std: 0.3 }.init::<B>(&mut rein_core::SeededRng::new(1), &Default::default())
}
