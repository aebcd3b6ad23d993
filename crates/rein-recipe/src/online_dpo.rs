//! Online DPO: each step's groups are sampled and scored as GRPO's, then each group's best
//! completion against its worst trains the policy on DPO's loss. Its `[algorithm]` section, its
//! view of a recipe, its rules and the keys it reads.

use serde::{Deserialize, Serialize};

use crate::dpo::check_preference_loss;
use crate::error::{Broken, broken};
use crate::rollout::Rollout;
use crate::schema::{DataSection, Recipe};

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

/// An online-DPO recipe: its hyperparameters and its prompts.
#[derive(Debug, Clone, Copy)]
pub struct OnlineDpoRecipe<'a> {
    /// The whole recipe.
    pub recipe: &'a Recipe,
    /// `[algorithm]`.
    pub online_dpo: &'a OnlineDpoSection,
    /// `[data]`.
    pub data: &'a DataSection,
}

impl OnlineDpoRecipe<'_> {
    /// Its rollouts: sampled within each step from the policy being trained.
    pub fn rollout(&self) -> Rollout {
        let online = self.online_dpo;
        Rollout::synchronous(online.steps, online.prompts_per_step, online.on_error)
    }

    /// Rewards to rank with, groups to rank, and DPO's own rules.
    pub(crate) fn check(&self) -> Result<(), Broken> {
        let (r, online) = (self.recipe, self.online_dpo);
        if r.reward.is_empty() {
            return Err(broken(
                "reward",
                "online DPO ranks completions by their rewards: add a [[reward]]",
            ));
        }
        if r.sampler.n < 2 {
            return Err(broken(
                "sampler.n",
                format!(
                    "must be at least 2, got {}: online DPO pairs a group's best completion with its worst",
                    r.sampler.n
                ),
            ));
        }
        if r.sampler.backend == rein_core::SamplerBackend::Http {
            return Err(broken(
                "sampler.backend",
                "online DPO samples in process for now: use backend = \"native\"",
            ));
        }
        self.rollout().check(r)?;
        check_preference_loss(online.beta, online.loss_type, online.label_smoothing, online.sft_weight)
    }
}

/// The sections online DPO reads: those of every single-turn online algorithm.
pub(crate) const READS: &[(&str, crate::keys::Keys)] = crate::rollout::SINGLE_TURN_READS;
