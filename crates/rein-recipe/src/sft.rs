//! Supervised fine-tuning: its `[algorithm]` section, its view of a recipe and the keys it
//! reads (it has no rules beyond its data's).

use serde::{Deserialize, Serialize};

use crate::keys::{Keys, LM_MODEL, LM_TRAIN};
use crate::schema::{DataSection, Recipe};

/// The most examples (or preference pairs) one step of an offline learner (SFT, DPO, KTO, reward
/// models) may draw: checked with the recipe, before anything is allocated for a batch. Far
/// beyond what fits in memory at any sequence length.
pub const MAX_BATCH_SIZE: usize = 1 << 16;

/// Supervised fine-tuning on the data's target completions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SftSection {
    /// Optimiser steps.
    pub steps: usize,
    /// Examples per step.
    pub batch_size: usize,
    /// Peak learning rate (AdamW).
    pub lr: f64,
    /// Linear warm-up steps, then linear decay to 10%.
    pub warmup_steps: usize,
    /// AdamW weight decay.
    pub weight_decay: f32,
    /// Global gradient clipping.
    pub max_grad_norm: f32,
}

impl Default for SftSection {
    fn default() -> Self {
        Self {
            steps: 1000,
            batch_size: 32,
            lr: 1e-3,
            warmup_steps: 50,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
        }
    }
}

/// An SFT recipe: its settings and its data.
#[derive(Debug, Clone, Copy)]
pub struct SftRecipe<'a> {
    /// The whole recipe.
    pub recipe: &'a Recipe,
    /// `[algorithm]`.
    pub sft: &'a SftSection,
    /// `[data]`.
    pub data: &'a DataSection,
}

/// The sections SFT reads: it has its own learning rate, warm-up and clipping in
/// `[algorithm]`; the sampler's length, stop strings and temperature are what held-out
/// evaluation uses.
pub(crate) const READS: &[(&str, Keys)] = &[
    ("data", Keys::All),
    ("model", LM_MODEL),
    ("train", LM_TRAIN),
    ("sampler", Keys::Only(&["max_new_tokens", "stop", "temperature"])),
    ("reward", Keys::All),
    ("eval", Keys::All),
    ("lora", Keys::All),
    ("tool", Keys::All),
    ("agent", Keys::All),
];
