//! Process-reward-model training on step labels (TRL's `PRMTrainer` names and defaults): its
//! `[algorithm]` section, its view of a recipe, its rules and the keys it reads.

use serde::{Deserialize, Serialize};

use crate::dpo::check_pair_training;
use crate::error::{Broken, broken};
use crate::keys::{Keys, LM_MODEL, LM_TRAIN};
use crate::schema::{DataSection, Recipe};

/// Training a process reward model — a token classifier judging each step of a solution — on
/// rows of a prompt, its steps and a label per step, with TRL's `PRMConfig` names and defaults
/// where they apply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProcessRewardModelSection {
    /// Optimiser steps.
    pub steps: usize,
    /// Rows per step.
    pub batch_size: usize,
    /// Peak learning rate (AdamW).
    pub lr: f64,
    /// Linear warm-up steps, then linear decay to 10%.
    pub warmup_steps: usize,
    /// AdamW weight decay.
    pub weight_decay: f32,
    /// Global gradient clipping.
    pub max_grad_norm: f32,
    /// The text after each step (its last token is where the step is judged).
    pub step_separator: String,
    /// Train on each row's last step only (held-out rows are still judged on every step).
    pub train_on_last_step_only: bool,
    /// Most tokens of prompt and steps together (the rest cut).
    pub max_length: usize,
    /// Most tokens of the steps (the rest cut); none when unset.
    pub max_completion_length: Option<usize>,
    /// Standard deviation of the new score head's weights.
    pub init_std: f64,
    /// Held-out step accuracy every this many steps (and after the last); 0 = only before and
    /// after training.
    pub eval_every: usize,
}

impl Default for ProcessRewardModelSection {
    fn default() -> Self {
        Self {
            steps: 1000,
            batch_size: 8,
            lr: 1e-5,
            warmup_steps: 0,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            step_separator: "\n".into(),
            train_on_last_step_only: false,
            max_length: 1024,
            max_completion_length: None,
            init_std: 0.02,
            eval_every: 0,
        }
    }
}

/// A process-reward-model recipe: its hyperparameters and its step-labelled rows.
#[derive(Debug, Clone, Copy)]
pub struct ProcessRewardModelRecipe<'a> {
    /// The whole recipe.
    pub recipe: &'a Recipe,
    /// `[algorithm]`.
    pub prm: &'a ProcessRewardModelSection,
    /// `[data]`.
    pub data: &'a DataSection,
}

impl ProcessRewardModelRecipe<'_> {
    /// Sizes in range; a separator to judge steps at.
    pub(crate) fn check(&self) -> Result<(), Broken> {
        let prm = self.prm;
        check_pair_training(prm.steps, prm.batch_size, prm.lr, prm.max_length, prm.max_grad_norm)?;
        if prm.step_separator.is_empty() {
            return Err(broken(
                "algorithm.step_separator",
                "must not be empty: each step is judged at its separator's last token",
            ));
        }
        if prm.max_completion_length == Some(0) {
            return Err(broken("algorithm.max_completion_length", "must be at least 1 token"));
        }
        if !(prm.init_std > 0.0 && prm.init_std.is_finite()) {
            return Err(broken("algorithm.init_std", "must be positive"));
        }
        Ok(())
    }
}

/// The sections process-reward-model training reads: every weight trains on step labels,
/// after an optional SFT stage on the rows whose every step is right; no sampling, rewards or
/// adapters.
pub(crate) const READS: &[(&str, Keys)] = &[
    ("data", Keys::All),
    ("model", LM_MODEL),
    ("train", LM_TRAIN),
    ("sft", Keys::All),
];
