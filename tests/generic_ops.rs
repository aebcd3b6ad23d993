//! The path a GPU run takes, checked on the CPU. On backends without rein's fused kernels
//! (CUDA), every kernel of `rein_model::ReinBackend` is its default: burn's generic ops. No GPU is
//! available here, so Flex is switched to those defaults (`use_generic_ops`) and a generation
//! and a GRPO step's gradients are compared with the fused CPU kernels' on the same model:
//! logits within 1e-4, greedy tokens exact, gradients within 1e-4; and the step's gradients with
//! each group's prompt packed once equal those with every row packed alone, within 1e-6.
//!
//! One test in its own binary: the switch is process-wide.

#[path = "common/gradients.rs"]
mod gradients;
#[path = "common/gradients_equal.rs"]
mod gradients_equal;
#[path = "common/grpo_loss.rs"]
mod grpo_loss;

use std::path::Path;

use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::tensor::{Int, Tensor, TensorData};
use rein_core::{Aggregation, KlEstimator, RatioLevel};
use rein_model::lm::{Context, load};
use rein_model::safetensors_file::Tensors;
use rein_optim::{PolicyLossConfig, PolicyObjective};
use rein_posttrain::TokenBatch;
use rein_sampler::{GenerationConfig, generate};

use gradients::gradients;
use gradients_equal::assert_gradients_equal;
use grpo_loss::grpo_loss;

type B = Autodiff<Flex>;

/// What the two paths must agree on, for one checkpoint.
struct Observed {
    /// Full-sequence logits, with the generation's concatenated projections and without.
    logits: [Vec<f32>; 2],
    /// Greedy continuations of 40 prompts (enough rows for the decoder to split the batch
    /// across threads).
    greedy: Vec<Vec<u32>>,
    /// The GRPO loss's gradient for every parameter, by path: with each group's prompt packed
    /// once, and with every row packed alone.
    gradients: [Tensors; 2],
}

fn prompts(vocab: u32) -> Vec<Vec<u32>> {
    (0..40u32)
        .map(|i| (0..1 + i % 7).map(|j| 3 + (i * 37 + j * 11) % (vocab - 3)).collect())
        .collect()
}

fn observe(checkpoint: &str) -> Observed {
    // One graph at a time in the process (rein_model::one_graph: tracel-ai/burn#5573).
    let _graph = rein_model::one_graph();
    let device = Default::default();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/lm")
        .join(checkpoint);
    let model = load::<B>(&dir, &device).unwrap();
    let inference = model.valid();
    let vocab = model.config().vocab_size as u32;
    let prompts = prompts(vocab);

    // Logits of a batch of equal-length rows.
    let rows: Vec<i64> = prompts[..8]
        .iter()
        .flat_map(|_| (0..12i64).map(|t| 3 + t * 5))
        .collect();
    let tokens = Tensor::<Flex, 2, Int>::from_data(TensorData::new(rows, [8, 12]), &device);
    let positions = Tensor::<Flex, 1, Int>::arange(0..12, &device)
        .unsqueeze::<2>()
        .expand([8, 12]);
    let rope = inference.rope(12, &device);
    let projections = inference.fused_projections();
    let logits = [None, Some(&projections)].map(|fused| {
        let ctx = Context {
            rope: &rope,
            positions: positions.clone(),
            padding: None,
            sequences: None,
            fused,
            routing: None,
        };
        inference
            .forward(tokens.clone(), &ctx, None)
            .into_data()
            .to_vec()
            .unwrap()
    });

    let config = GenerationConfig {
        max_new_tokens: 10,
        temperature: 0.0,
        ..GenerationConfig::default()
    };
    let greedy = generate(&inference, &prompts, &config, 0, &mut |_, _| false, &device)
        .into_iter()
        .map(|g| g.tokens)
        .collect();

    // A GRPO step's loss (KL and entropy terms included) on three of those prompts, each with
    // two completions of different lengths.
    let pairs: Vec<(&[u32], &[u32])> = (0..6)
        .map(|i| (prompts[i / 2].as_slice(), &prompts[20 + i][..]))
        .collect();
    let mut batch = TokenBatch::new(&pairs, 0);
    let gradients = [true, false].map(|share_prompts| {
        batch.share_prompts = share_prompts;
        grpo_gradients(&model, &batch)
    });
    Observed {
        logits,
        greedy,
        gradients,
    }
}

fn grpo_gradients(model: &rein_model::lm::CausalLm<B>, batch: &TokenBatch) -> Tensors {
    let config = PolicyLossConfig {
        level: RatioLevel::Token,
        objective: PolicyObjective::Clip,
        clip_low: 0.2,
        clip_high: 0.28,
        dual_clip: Some(3.0),
        aggregation: Aggregation::SeqMeanTokenMean,
        max_completion_len: batch.completion_width,
        kl_coef: 0.1,
        kl_estimator: KlEstimator::K3,
        kl_importance_weighted: true,
        entropy_coef: 0.01,
        top_entropy_quantile: 1.0,
    };
    let loss = grpo_loss(model, batch, &[1.0, -0.5, 0.3, -1.2, 0.8, -0.4], &config);
    gradients::<B, _>(model, &loss.backward())
}

fn assert_close(what: &str, generic: &[f32], fused: &[f32]) {
    assert_eq!(generic.len(), fused.len(), "{what}");
    for (i, (g, f)) in generic.iter().zip(fused).enumerate() {
        assert!(
            (g - f).abs() <= 1e-4 * f.abs().max(1.0),
            "{what}[{i}]: generic ops {g} vs fused kernels {f}"
        );
    }
}

#[test]
fn the_generic_ops_path_computes_what_the_fused_kernels_compute() {
    for checkpoint in ["qwen2-gqa", "llama"] {
        let fused = observe(checkpoint);
        rein_model::use_generic_ops(true);
        let generic = observe(checkpoint);
        rein_model::use_generic_ops(false);
        for (i, what) in ["logits", "logits with concatenated projections"].iter().enumerate() {
            assert_close(&format!("{checkpoint}: {what}"), &generic.logits[i], &fused.logits[i]);
        }
        assert_ne!(
            generic.logits[0], fused.logits[0],
            "{checkpoint}: the switch took effect (burn's matmul adds in another order than rein's)"
        );
        assert_eq!(generic.greedy, fused.greedy, "{checkpoint}: greedy tokens");
        let [shared, alone] = &generic.gradients;
        assert_eq!(shared.len(), fused.gradients[0].len());
        for ((name, (_, g)), (_, (_, f))) in shared.iter().zip(&fused.gradients[0]) {
            assert!(f.iter().any(|&x| x != 0.0), "{checkpoint}: {name} has a gradient");
            assert_close(&format!("{checkpoint}: ∂loss/∂{name}"), g, f);
        }
        // Shared prompts in the burn-op blocks (a tree's mask) as the rows one by one.
        let what = format!("{checkpoint}: shared prompts against one by one");
        assert_gradients_equal(&what, shared, alone, 1e-6);
    }
}
