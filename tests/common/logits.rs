//! Full-sequence logits of a causal language model, for tests that compare them.

use burn::tensor::{Int, Tensor};
use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, Context};

/// Full-sequence logits without a cache, for unpadded rows, flattened; with the model's
/// projections concatenated as generation uses them when `fused`.
pub fn logits<B: ReinBackend>(model: &CausalLm<B>, tokens: Tensor<B, 2, Int>, fused: bool) -> Vec<f32> {
    let [batch, seq] = tokens.dims();
    let device = tokens.device();
    let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &device)
        .unsqueeze::<2>()
        .expand([batch, seq]);
    let rope = model.rope(seq, &device);
    let projections = model.fused_projections();
    let ctx = Context {
        rope: &rope,
        positions,
        padding: None,
        sequences: None,
        fused: fused.then_some(&projections),
        routing: None,
    };
    model.forward(tokens, &ctx, None).into_data().to_vec().unwrap()
}
