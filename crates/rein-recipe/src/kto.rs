//! KTO on completions labelled desirable or undesirable (TRL's `KTOTrainer` names and
//! defaults): its `[algorithm]` section, its view of a recipe, its rules and the keys it reads.

use serde::{Deserialize, Serialize};

use crate::dpo::check_pair_training;
use crate::error::{Broken, broken};
use crate::schema::{DataSection, Recipe};

/// Kahneman–Tversky optimisation on unpaired completions, each labelled desirable or not, with
/// TRL's `KTOConfig` names and defaults where they apply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KtoSection {
    /// Optimiser steps.
    pub steps: usize,
    /// Labelled completions per step (at least 2 for `kto`: the reference point is estimated
    /// from the batch's mismatched pairs).
    pub batch_size: usize,
    /// Peak learning rate (AdamW).
    pub lr: f64,
    /// Linear warm-up steps, then linear decay to 10%.
    pub warmup_steps: usize,
    /// AdamW weight decay.
    pub weight_decay: f32,
    /// Global gradient clipping.
    pub max_grad_norm: f32,
    /// `β`: how strongly the policy is held to the reference.
    pub beta: f32,
    /// `kto` or `apo_zero_unpaired`.
    pub loss_type: rein_core::KtoLossKind,
    /// `λ_D`, the weight of a desirable completion's loss.
    pub desirable_weight: f32,
    /// `λ_U`, the weight of an undesirable completion's loss.
    pub undesirable_weight: f32,
    /// Keep each example's reference log-probability once computed, instead of running the
    /// reference on it in every batch (the mismatched completions of the reference point are
    /// paired anew in each batch, so theirs are always computed).
    pub precompute_ref: bool,
    /// Most tokens of prompt and completion together: longer completions are cut (their start
    /// kept), examples whose prompt alone reaches it are skipped.
    pub max_length: usize,
}

impl Default for KtoSection {
    fn default() -> Self {
        Self {
            steps: 1000,
            batch_size: 8,
            lr: 1e-6,
            warmup_steps: 0,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            beta: 0.1,
            loss_type: rein_core::KtoLossKind::Kto,
            desirable_weight: 1.0,
            undesirable_weight: 1.0,
            precompute_ref: true,
            max_length: 1024,
        }
    }
}

/// A KTO recipe: its hyperparameters and its labelled completions.
#[derive(Debug, Clone, Copy)]
pub struct KtoRecipe<'a> {
    /// The whole recipe.
    pub recipe: &'a Recipe,
    /// `[algorithm]`.
    pub kto: &'a KtoSection,
    /// `[data]`.
    pub data: &'a DataSection,
}

impl KtoRecipe<'_> {
    /// Sizes, β and the weights in range; a batch that can estimate the reference point.
    pub(crate) fn check(&self) -> Result<(), Broken> {
        let kto = self.kto;
        check_pair_training(kto.steps, kto.batch_size, kto.lr, kto.max_length, kto.max_grad_norm)?;
        if !(kto.beta > 0.0 && kto.beta.is_finite()) {
            return Err(broken("algorithm.beta", format!("must be > 0, got {}", kto.beta)));
        }
        for (key, weight) in [
            ("algorithm.desirable_weight", kto.desirable_weight),
            ("algorithm.undesirable_weight", kto.undesirable_weight),
        ] {
            if !(weight > 0.0 && weight.is_finite()) {
                return Err(broken(key, format!("must be > 0, got {weight}")));
            }
        }
        if kto.loss_type == rein_core::KtoLossKind::Kto && kto.batch_size < 2 {
            return Err(broken(
                "algorithm.batch_size",
                "must be at least 2 for loss_type = \"kto\": its reference point pairs each prompt with \
                 another example's completion of the batch (with one, it is the example's own reward)",
            ));
        }
        Ok(())
    }
}

/// The sections KTO reads: the same as DPO's.
pub(crate) const READS: &[(&str, crate::keys::Keys)] = crate::dpo::READS;
