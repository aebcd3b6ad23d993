//! Reward-model training on preference pairs (TRL's `RewardTrainer` names and defaults): its
//! `[algorithm]` section, its view of a recipe, its rules and the keys it reads.

use serde::{Deserialize, Serialize};

use crate::dpo::check_pair_training;
use crate::error::{Broken, broken};
use crate::keys::{Keys, LM_MODEL, LM_TRAIN};
use crate::schema::{DataSection, Recipe};

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

/// A reward-model recipe: its hyperparameters and its preference pairs.
#[derive(Debug, Clone, Copy)]
pub struct RewardModelRecipe<'a> {
    /// The whole recipe.
    pub recipe: &'a Recipe,
    /// `[algorithm]`.
    pub reward_model: &'a RewardModelSection,
    /// `[data]`.
    pub data: &'a DataSection,
}

impl RewardModelRecipe<'_> {
    /// Sizes and coefficients in range.
    pub(crate) fn check(&self) -> Result<(), Broken> {
        let rm = self.reward_model;
        check_pair_training(rm.steps, rm.batch_size, rm.lr, rm.max_length, rm.max_grad_norm)?;
        if !(rm.center_rewards_coefficient >= 0.0 && rm.center_rewards_coefficient.is_finite()) {
            return Err(broken(
                "algorithm.center_rewards_coefficient",
                format!("must be ≥ 0, got {}", rm.center_rewards_coefficient),
            ));
        }
        if !(rm.init_std > 0.0 && rm.init_std.is_finite()) {
            return Err(broken("algorithm.init_std", "must be positive"));
        }
        Ok(())
    }
}

/// The sections reward-model training reads: every weight trains on pairs, after an optional
/// SFT stage on the chosen completions; no sampling, rewards or adapters.
pub(crate) const READS: &[(&str, Keys)] = &[
    ("data", Keys::All),
    ("model", LM_MODEL),
    ("train", LM_TRAIN),
    ("sft", Keys::All),
];
