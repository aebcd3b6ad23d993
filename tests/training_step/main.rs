//! One GRPO training step of the tiny Qwen2 — the model's forward and backward passes, the
//! policy loss, gradient clipping and AdamW — against the same step in PyTorch (fixture written
//! by `tests/fixtures/gen_torch_step.py`): every parameter after the step within 1e-5 (1e-4
//! where its gradient is within a few ε of zero; see below). And on-policy distillation's full
//! reverse KL against TRL's `DistillationTrainer` loss (`gen_trl_distill.py`), every DPO loss
//! type against TRL's `DPOTrainer` (`gen_trl_dpo.py`), both KTO loss types against TRL's
//! `KTOTrainer` (`gen_trl_kto.py`), and the reward-model loss against TRL's
//! `RewardTrainer` (`gen_trl_reward.py`), process-reward-model training's data format and loss
//! against TRL's `PRMTrainer` (`gen_trl_prm.py`), and PPO's token advantages, losses and value model
//! against TRL's `PPOTrainer` formulas (`gen_trl_ppo.py`). The newer families (Qwen3, Gemma 3,
//! Gemma 2, Qwen3-MoE with its load-balancing loss) take the same GRPO loss's backward pass
//! against PyTorch's (`lm/gen_family_steps.py`), fully and with LoRA adapters (on every expert
//! of the MoE). The vision-language models (Idefics3, Qwen2-VL, Qwen2.5-VL) take the same step
//! against PyTorch's (`vlm/gen_idefics3_step.py`, `vlm/gen_qwen2_vl_step.py`), their vision
//! encoders trained and frozen. A step whose groups share their prompts, each prompt packed once,
//! gives the loss and gradients of the rows packed one by one ([`shared_prompts`]).
//!
//! One module per family: [`grpo`], [`distill`], [`preferences`], [`process_reward`], [`ppo`],
//! [`vision`], [`shared_prompts`];
//! this file holds what they share (fixtures, token batches, gradient comparisons).
//!
//! Every test that builds and differentiates a graph holds [`rein_model::one_graph`] while it
//! does: burn-autodiff 0.21's `backward()` on one thread can free another thread's steps
//! (tracel-ai/burn#5573), and these tests run in parallel. Without it a gradient came back wrong
//! about once in twenty runs of this binary with eight test threads.

mod distill;
mod grpo;
mod ppo;
mod preferences;
mod process_reward;
mod shared_prompts;
mod vision;

use std::path::Path;

use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module, ModuleMapper, Param};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::{Tensor, TensorData};
use rein_core::{Aggregation, KlEstimator, RatioLevel};
use rein_model::lm::{CausalLm, SequenceClassifier, load, peft, save};
use rein_optim::{
    DpoConfig, DpoLossKind, KtoConfig, KtoLossKind, PolicyLossConfig, PolicyObjective, bradley_terry_loss,
    clip_grad_norm, full_reverse_kl, kl_estimate_scalar, masked_value_loss, masked_whiten, policy_loss, token_gae,
    token_rewards,
};
use rein_posttrain::{
    Critic, LabelledCompletion, PreferencePair, TokenBatch, completion_log_probs, completion_logits,
    completion_outputs, dpo_batch_loss, kto_batch_loss, labelled_batch, mismatched_batch, pair_batch, pair_scores,
    reference_log_probs, reference_point,
};
use safetensors::SafeTensors;
use serde::Deserialize;

type B = Autodiff<Flex>;

fn f32s(view: &safetensors::tensor::TensorView<'_>) -> Vec<f32> {
    assert_eq!(view.dtype(), safetensors::Dtype::F32);
    view.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> T {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The fixture's prompt/completion pairs as one batch (padding id 0).
fn token_batch(prompts: &[Vec<u32>], completions: &[Vec<u32>]) -> TokenBatch {
    let pairs: Vec<(&[u32], &[u32])> = (prompts.iter().zip(completions))
        .map(|(p, c)| (p.as_slice(), c.as_slice()))
        .collect();
    TokenBatch::new(&pairs, 0)
}

/// Each parameter's gradient in place of its value.
struct GradientsAsValues<'a> {
    grads: &'a GradientsParams,
}

impl ModuleMapper<Flex> for GradientsAsValues<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<Flex, D>>) -> Param<Tensor<Flex, D>> {
        let (id, value, mapper) = param.consume();
        let grad = (self.grads.get::<Flex, D>(id)).unwrap_or_else(|| value.zeros_like());
        Param::from_mapped_value(id, grad, mapper)
    }
}

/// Each of `model`'s gradients in `grads` equals the fixture's tensor `<prefix><Hugging Face
/// name>` within 1e-6 of the larger of its norm and the whole gradient's (`grad_norm`), every
/// parameter has one, and together they have the fixture's norm.
fn assert_gradients_match(
    model: &CausalLm<B>,
    grads: &GradientsParams,
    theirs: &SafeTensors,
    prefix: &str,
    grad_norm: f64,
) {
    // One directory per call: tests run in parallel, several with the same prefix.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("grads-{call}-{}", prefix.trim_end_matches('/')));
    let _ = std::fs::remove_dir_all(&dir);
    save(&model.valid().map(&mut GradientsAsValues { grads }), &dir).unwrap();
    assert_saved_gradients_match(&dir, theirs, prefix, grad_norm);
}

/// As [`assert_gradients_match`], for gradients saved as a model in `dir`.
fn assert_saved_gradients_match(dir: &Path, theirs: &SafeTensors, prefix: &str, grad_norm: f64) {
    assert_gradients_file_matches(&dir.join("model.safetensors"), theirs, prefix, grad_norm);
}

/// As [`assert_gradients_match`], for gradients saved in the safetensors file `file`.
fn assert_gradients_file_matches(file: &Path, theirs: &SafeTensors, prefix: &str, grad_norm: f64) {
    let ours = std::fs::read(file).unwrap();
    let ours = SafeTensors::deserialize(&ours).unwrap();
    let (mut norm, mut compared) = (0.0f64, 0);
    for (name, view) in theirs.tensors() {
        let Some(name) = name.strip_prefix(prefix) else {
            continue;
        };
        let expected = f32s(&view);
        let got = f32s(
            &ours
                .tensor(name)
                .unwrap_or_else(|_| panic!("rein has no gradient `{name}`")),
        );
        let size = expected.iter().map(|&e| f64::from(e).powi(2)).sum::<f64>().sqrt();
        let error = (got.iter().zip(&expected))
            .map(|(&g, &e)| f64::from(g - e).powi(2))
            .sum::<f64>()
            .sqrt();
        assert!(
            error <= 1e-6 * grad_norm.max(size),
            "gradient of {prefix}{name}: ‖rein − reference‖ = {error:e} (‖reference‖ = {size:e})"
        );
        norm += size * size;
        compared += 1;
    }
    assert_eq!(
        compared,
        ours.tensors().len(),
        "every parameter has a gradient in the fixture ({prefix})"
    );
    assert!(
        (norm.sqrt() - grad_norm).abs() < 1e-5 * grad_norm,
        "gradient norm ({prefix})"
    );
}

/// The fixtures' policy loss: token-level ratios clipped at `clip` on both sides, sequence-mean
/// of token means, no KL or entropy term (TRL's GRPO loss as the step scripts compute it).
fn token_level_loss(clip: f32, max_completion_len: usize) -> PolicyLossConfig {
    PolicyLossConfig {
        level: RatioLevel::Token,
        objective: PolicyObjective::Clip,
        clip_low: clip,
        clip_high: clip,
        dual_clip: None,
        aggregation: Aggregation::SeqMeanTokenMean,
        max_completion_len,
        kl_coef: 0.0,
        kl_estimator: KlEstimator::K3,
        kl_importance_weighted: false,
        entropy_coef: 0.0,
        top_entropy_quantile: 1.0,
    }
}
