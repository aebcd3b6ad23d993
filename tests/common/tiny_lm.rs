//! A tiny random Qwen2 (vocabulary 40, 2 layers, grouped-query attention) for tests of the
//! generator and the sampler, whose logits are spread enough (init std 0.3) to sample varied
//! tokens.

use burn::backend::Flex;
use rein_model::lm::{CausalLm, LmConfig, LmInit};

/// Its vocabulary.
pub const VOCAB: usize = 40;

/// The model, initialised from `seed`.
pub fn tiny_model(seed: u64) -> CausalLm<Flex> {
    tiny_model_on::<Flex>(seed)
}

/// The model on the backend `B`, initialised from `seed`.
pub fn tiny_model_on<B: rein_model::ReinBackend>(seed: u64) -> CausalLm<B> {
    let config = LmConfig::from_json(serde_json::json!({
        "model_type": "qwen2", "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64
    }))
    .unwrap();
    <B as burn::tensor::backend::Backend>::seed(&Default::default(), seed);
    LmInit { config, std: 0.3 }.init::<B>(&mut rein_core::SeededRng::new(1), &Default::default())
}
