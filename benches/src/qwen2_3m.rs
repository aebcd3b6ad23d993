//! The model of the `generate` and `grpo` benchmarks, as the issues describe it: a random
//! ~3M-parameter Qwen2 (hidden 256, 4 layers, 4 heads, 2 KV heads, vocab 512), seed 0.

use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, LmConfig, LmInit};

/// The model on backend `B`, initialised from seed 0.
pub fn qwen2_3m<B: ReinBackend>(device: &B::Device) -> anyhow::Result<CausalLm<B>> {
    qwen2_3m_from::<B>(1, device)
}

/// The same shape initialised from `seed` (another model for the same tokenizer: the
/// distillation benchmark's teacher).
pub fn qwen2_3m_from<B: ReinBackend>(seed: u64, device: &B::Device) -> anyhow::Result<CausalLm<B>> {
    qwen2_3m_with_positions::<B>(seed, 512, device)
}

/// The same shape from `seed`, with room for `max_positions` positions (a long prompt's case).
pub fn qwen2_3m_with_positions<B: ReinBackend>(
    seed: u64,
    max_positions: usize,
    device: &B::Device,
) -> anyhow::Result<CausalLm<B>> {
    let config = LmConfig::from_json(serde_json::json!({
        "model_type": "qwen2", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 704,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": max_positions, "tie_word_embeddings": false, "rope_theta": 10000.0
    }))
    .map_err(anyhow::Error::msg)?;
    B::seed(device, 0);
    Ok(LmInit { config, std: 0.02 }.init::<B>(&mut rein_core::SeededRng::new(seed), device))
}
