//! A GRPO step whose groups share their prompts (and two completions their first tokens):
//! packed as a prefix tree, each prompt and shared run once and every completion continuing it
//! ([`TokenBatch::share_prompts`]), the loss and every gradient equal those of the rows packed
//! one by one (each a copy of its prompt), for the families whose attention differs (grouped
//! queries, sliding windows, soft-capping, Qwen3's norms).

use super::*;

#[path = "../common/gradients.rs"]
mod gradients;
#[path = "../common/gradients_equal.rs"]
mod gradients_equal;
#[path = "../common/grpo_loss.rs"]
mod grpo_loss;

use gradients_equal::assert_gradients_equal;
use grpo_loss::grpo_loss;

/// Two groups (a 7-token prompt with five completions, one of them a single token and one
/// branching from another after 3 tokens, as a tree rollout's do; a 3-token prompt with two), a
/// lone prompt and an empty one.
fn grouped_pairs(vocab: u32) -> Vec<(Vec<u32>, Vec<u32>)> {
    let tokens =
        |seed: u32, len: u32| -> Vec<u32> { (0..len).map(|j| 3 + (seed * 37 + j * 11) % (vocab - 3)).collect() };
    let (a, b) = (tokens(1, 7), tokens(2, 3));
    vec![
        (a.clone(), tokens(10, 5)),
        (a.clone(), tokens(11, 1)),
        (b.clone(), tokens(12, 2)),
        (a.clone(), tokens(13, 3)),
        (tokens(3, 4), tokens(14, 3)),
        (b, tokens(15, 4)),
        (a.clone(), tokens(16, 6)),
        (a, [tokens(10, 3), tokens(18, 4)].concat()),
        (Vec::new(), tokens(17, 2)),
    ]
}

/// The GRPO loss (clipped, with KL and entropy terms) and every parameter's gradient.
fn loss_and_gradients(checkpoint: &str, share_prompts: bool) -> (f64, rein_model::safetensors_file::Tensors) {
    let _graph = rein_model::one_graph();
    let device = Default::default();
    let model = load::<B>(&fixtures().join("lm").join(checkpoint), &device).unwrap();
    let pairs = grouped_pairs(model.config().vocab_size as u32);
    let pairs: Vec<(&[u32], &[u32])> = pairs.iter().map(|(p, c)| (p.as_slice(), c.as_slice())).collect();
    let mut batch = TokenBatch::new(&pairs, 0);
    batch.share_prompts = share_prompts;
    let advantages: Vec<f32> = (0..batch.rows).map(|i| (i as f32 * 0.7).sin()).collect();
    let config = PolicyLossConfig {
        kl_coef: 0.1,
        kl_estimator: KlEstimator::K3,
        entropy_coef: 0.01,
        ..token_level_loss(0.2, batch.completion_width)
    };
    let loss = grpo_loss(&model, &batch, &advantages, &config);
    (
        f64::from(loss.clone().into_scalar()),
        gradients::gradients::<B, _>(&model, &loss.backward()),
    )
}

#[test]
fn a_grpo_step_with_shared_prompts_equals_the_rows_packed_one_by_one() {
    for checkpoint in ["qwen2-gqa", "gemma2", "gemma3", "mistral-window", "qwen3-window"] {
        let (shared_loss, shared) = loss_and_gradients(checkpoint, true);
        let (alone_loss, alone) = loss_and_gradients(checkpoint, false);
        assert!(
            (shared_loss - alone_loss).abs() <= 1e-6 * alone_loss.abs().max(1.0),
            "{checkpoint}: loss {shared_loss} shared vs {alone_loss} alone"
        );
        for (name, (_, gradient)) in &alone {
            assert!(
                gradient.iter().any(|&g| g != 0.0),
                "{checkpoint}: {name} has a gradient"
            );
        }
        assert_gradients_equal(checkpoint, &shared, &alone, 1e-6);
    }
}
