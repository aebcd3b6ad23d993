//! DPO and its variants on preference pairs (TRL's `DPOTrainer` names and defaults): its
//! `[algorithm]` section, its view of a recipe, its rules (with the loss's and the pair
//! training's, which online DPO and reward models share) and the keys it reads.

use serde::{Deserialize, Serialize};

use crate::error::{Broken, broken};
use crate::keys::{Keys, LM_MODEL, LM_TRAIN};
use crate::schema::{DataSection, Recipe};

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

/// A DPO recipe: its hyperparameters and its preference pairs.
#[derive(Debug, Clone, Copy)]
pub struct DpoRecipe<'a> {
    /// The whole recipe.
    pub recipe: &'a Recipe,
    /// `[algorithm]`.
    pub dpo: &'a DpoSection,
    /// `[data]`.
    pub data: &'a DataSection,
}

impl DpoRecipe<'_> {
    /// Sizes, β and the smoothing in range.
    pub(crate) fn check(&self) -> Result<(), Broken> {
        let dpo = self.dpo;
        check_pair_training(dpo.steps, dpo.batch_size, dpo.lr, dpo.max_length, dpo.max_grad_norm)?;
        check_preference_loss(dpo.beta, dpo.loss_type, dpo.label_smoothing, dpo.sft_weight)
    }
}

/// β, the label smoothing and the likelihood weight of a DPO-family loss.
pub(crate) fn check_preference_loss(
    beta: f32,
    loss_type: rein_core::DpoLossKind,
    label_smoothing: f32,
    sft_weight: f32,
) -> Result<(), Broken> {
    if !(beta > 0.0 && beta.is_finite()) {
        return Err(broken("algorithm.beta", format!("must be > 0, got {beta}")));
    }
    if !(0.0..0.5).contains(&label_smoothing) {
        return Err(broken(
            "algorithm.label_smoothing",
            format!("must be in [0, 0.5), got {label_smoothing}"),
        ));
    }
    if label_smoothing > 0.0 && loss_type != rein_core::DpoLossKind::Robust {
        return Err(broken(
            "algorithm.label_smoothing",
            format!("only the `robust` loss reads it (TRL's definition); loss_type is `{loss_type:?}`"),
        ));
    }
    if !(sft_weight >= 0.0 && sft_weight.is_finite()) {
        return Err(broken("algorithm.sft_weight", format!("must be ≥ 0, got {sft_weight}")));
    }
    Ok(())
}

/// The sizes (batch_size at most [`crate::MAX_BATCH_SIZE`]), learning rate and clipping of training
/// on preference pairs (DPO, KTO, reward models).
pub(crate) fn check_pair_training(
    steps: usize,
    batch_size: usize,
    lr: f64,
    max_length: usize,
    max_grad_norm: f32,
) -> Result<(), Broken> {
    if steps == 0 || batch_size == 0 {
        return Err(broken(
            "algorithm.batch_size",
            "steps and batch_size must be at least 1",
        ));
    }
    if batch_size > crate::MAX_BATCH_SIZE {
        let max = crate::MAX_BATCH_SIZE;
        return Err(broken(
            "algorithm.batch_size",
            format!("must be at most {max}, got {batch_size}"),
        ));
    }
    if !(lr > 0.0 && lr.is_finite()) {
        return Err(broken("algorithm.lr", format!("must be positive, got {lr}")));
    }
    if max_length < 2 {
        return Err(broken("algorithm.max_length", "must be at least 2 tokens"));
    }
    if max_grad_norm <= 0.0 || max_grad_norm.is_nan() {
        return Err(broken("algorithm.max_grad_norm", "must be positive"));
    }
    Ok(())
}

/// The sections DPO reads: its own learning rate and clipping in `[algorithm]`, like SFT, and
/// an optional SFT stage; evaluation samples as SFT's does.
pub(crate) const READS: &[(&str, Keys)] = &[
    ("data", Keys::All),
    ("model", LM_MODEL),
    ("train", LM_TRAIN),
    ("sft", Keys::All),
    ("sampler", Keys::Only(&["max_new_tokens", "stop", "temperature"])),
    ("reward", Keys::All),
    ("eval", Keys::All),
    ("lora", Keys::All),
];
