//! What a recipe says about learning from preferences: the `[algorithm]` sections of DPO, online
//! DPO and reward-model training (TRL's names and defaults where they apply).

use serde::{Deserialize, Serialize};

/// Direct preference optimisation and its variants on (prompt, chosen, rejected) pairs, with
/// TRL's `DPOTrainer` names and defaults where they apply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DpoSection {
    /// Optimiser steps.
    pub steps: usize,
    /// Pairs per step.
    pub batch_size: usize,
    /// Peak learning rate (AdamW).
    pub lr: f64,
    /// Linear warm-up steps, then linear decay to 10%.
    pub warmup_steps: usize,
    /// AdamW weight decay.
    pub weight_decay: f32,
    /// Global gradient clipping.
    pub max_grad_norm: f32,
    /// `β`: how strongly the policy is held to the reference (IPO's `τ`).
    pub beta: f32,
    /// `sigmoid` (DPO), `ipo`, `hinge` or `robust`.
    pub loss_type: rein_core::DpoLossKind,
    /// The robust loss's assumed share of flipped preferences, in `[0, 0.5)`.
    pub label_smoothing: f32,
    /// The weight of the chosen completions' negative log-likelihood added to the loss (RPO;
    /// TRL's `loss_type = ["sigmoid", "sft"]`, `loss_weights = [1, sft_weight]`); 0 for none.
    pub sft_weight: f32,
    /// Keep each pair's reference log-probabilities once computed, instead of running the
    /// reference model on every batch (the reference is frozen, so the values are the same).
    pub precompute_ref: bool,
    /// Most tokens of prompt and completion together: longer completions are cut (their
    /// start kept), pairs whose prompt alone reaches it are skipped.
    pub max_length: usize,
}

impl Default for DpoSection {
    fn default() -> Self {
        Self {
            steps: 1000,
            batch_size: 8,
            lr: 1e-6,
            warmup_steps: 0,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            beta: 0.1,
            loss_type: rein_core::DpoLossKind::Sigmoid,
            label_smoothing: 0.0,
            sft_weight: 0.0,
            precompute_ref: true,
            max_length: 1024,
        }
    }
}

/// Online DPO: each step samples `sampler.n` completions for each of `prompts_per_step`
/// prompts with the current policy, scores them with the recipe's rewards, and takes one DPO
/// step on each group's best completion against its worst (ties skipped). The optimiser is
/// `[optimizer]`'s, as for GRPO.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OnlineDpoSection {
    /// Steps (each one sampled batch and one update).
    pub steps: usize,
    /// Prompts per step.
    pub prompts_per_step: usize,
    /// `β`.
    pub beta: f32,
    /// `sigmoid` (DPO), `ipo`, `hinge` or `robust`.
    pub loss_type: rein_core::DpoLossKind,
    /// The robust loss's assumed share of flipped preferences, in `[0, 0.5)`.
    pub label_smoothing: f32,
    /// The weight of the chosen completions' negative log-likelihood (RPO); 0 for none.
    pub sft_weight: f32,
    /// What to do when a reward plugin fails on a group: `fail`, `zero` or `skip`.
    pub on_error: rein_core::OnError,
}

impl Default for OnlineDpoSection {
    fn default() -> Self {
        Self {
            steps: 100,
            prompts_per_step: 8,
            beta: 0.1,
            loss_type: rein_core::DpoLossKind::Sigmoid,
            label_smoothing: 0.0,
            sft_weight: 0.0,
            on_error: rein_core::OnError::Fail,
        }
    }
}

/// Training a reward model on (prompt, chosen, rejected) pairs, with TRL's `RewardTrainer`
/// names and defaults where they apply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RewardModelSection {
    /// Optimiser steps.
    pub steps: usize,
    /// Pairs per step.
    pub batch_size: usize,
    /// Peak learning rate (AdamW).
    pub lr: f64,
    /// Linear warm-up steps, then linear decay to 10%.
    pub warmup_steps: usize,
    /// AdamW weight decay.
    pub weight_decay: f32,
    /// Global gradient clipping.
    pub max_grad_norm: f32,
    /// The weight of `(r_chosen + r_rejected)²`, which keeps rewards centred on zero
    /// (Eisenstein et al. 2023); 0 for none.
    pub center_rewards_coefficient: f32,
    /// Most tokens of prompt and completion together (as for DPO).
    pub max_length: usize,
    /// Standard deviation of the new score head's weights.
    pub init_std: f64,
    /// Held-out pairwise accuracy every this many steps (and after the last); 0 = only before
    /// and after training.
    pub eval_every: usize,
}

impl Default for RewardModelSection {
    fn default() -> Self {
        Self {
            steps: 1000,
            batch_size: 8,
            lr: 1e-4,
            warmup_steps: 0,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            center_rewards_coefficient: 0.0,
            max_length: 1024,
            init_std: 0.02,
            eval_every: 0,
        }
    }
}
