//! What a recipe says about PPO on a language model, with a critic (InstructGPT; TRL's
//! `PPOTrainer` and OpenRLHF): `algorithm.name = "ppo"` in a recipe with `[data]` (prompts)
//! rather than `[env]`. Keys that mean what classic PPO's mean have CleanRL's names
//! (`gae_lambda`, `update_epochs`, `num_minibatches`, `clip_coef`, `vf_coef`, `norm_adv`);
//! defaults are TRL's.

use serde::{Deserialize, Serialize};

use crate::error::{Broken, broken};
use crate::rollout::Rollout;
use crate::schema::{DataSection, Recipe};

/// PPO with a value model on a language model's completions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LmPpoSection {
    /// Steps (each one sampled batch, then `update_epochs` passes over it).
    pub steps: usize,
    /// Prompts per step (each sampled `sampler.n` times).
    pub prompts_per_step: usize,
    /// γ, the discount over tokens (TRL: 1).
    pub gamma: f32,
    /// GAE's λ (TRL's `lam`).
    pub gae_lambda: f32,
    /// Passes over each batch (TRL's `num_ppo_epochs`).
    pub update_epochs: usize,
    /// Minibatches per pass (TRL's `num_mini_batches`).
    pub num_minibatches: usize,
    /// ε, the policy ratio's clip range (TRL's `cliprange`).
    pub clip_coef: f32,
    /// Clip the value loss around the values the batch was collected with.
    pub clip_vloss: bool,
    /// The value clip range (TRL's `cliprange_value`).
    pub value_clip: f32,
    /// The value loss's weight.
    pub vf_coef: f32,
    /// Entropy bonus coefficient.
    pub ent_coef: f32,
    /// β, the KL penalty to the frozen starting policy (0: no reference model is kept).
    pub kl_coef: f32,
    /// `k1` (TRL's default), `k2` or `k3`.
    pub kl_estimator: rein_core::KlEstimator,
    /// Put `−β·KL` in each token's reward (InstructGPT, TRL) rather than in the loss.
    pub kl_in_reward: bool,
    /// Whiten the token rewards (scale only) before GAE.
    pub whiten_rewards: bool,
    /// Whiten the advantages over the batch's tokens.
    pub norm_adv: bool,
    /// `token-mean` (TRL), `seq-mean-token-mean` or `seq-mean-token-sum-norm`: how the policy
    /// loss is averaged.
    pub aggregation: rein_core::Aggregation,
    /// `separate` (a value model of its own, as TRL and OpenRLHF) or `head` (a value head on
    /// the policy's last hidden states).
    pub value_model: rein_core::ValueModel,
    /// A separate value model's starting weights: a reward model (its score head becomes the
    /// value head, TRL's default) or a causal LM (a fresh head); default the policy's.
    pub value_model_path: Option<String>,
    /// The value model's learning rate (default `optimizer.lr`).
    pub critic_lr: Option<f64>,
    /// Steps at the start during which only the critic learns (OpenRLHF's
    /// `freezing_actor_steps`).
    pub critic_warmup_steps: usize,
    /// `fail`, `zero` or `skip` when a reward fails.
    pub on_error: rein_core::OnError,
    /// How many policy versions generation may run ahead of training (0: synchronous).
    pub max_staleness: usize,
    /// `none`, `tis` or `icepop`: the correction for the sampler's lag and mismatch.
    pub correction: rein_core::LagCorrection,
    /// `token` or `sequence`: where the correction's ratio is taken.
    pub correction_level: rein_core::RatioLevel,
    /// TIS's cap on `π_trainer/π_sampler`.
    pub tis_cap: f32,
    /// IcePop's `[low, high]`.
    pub icepop_bounds: [f32; 2],
}

impl Default for LmPpoSection {
    fn default() -> Self {
        let rollout = Rollout::default();
        Self {
            steps: rollout.steps,
            prompts_per_step: rollout.prompts_per_step,
            gamma: 1.0,
            gae_lambda: 0.95,
            update_epochs: 4,
            num_minibatches: 1,
            clip_coef: 0.2,
            clip_vloss: true,
            value_clip: 0.2,
            vf_coef: 0.1,
            ent_coef: 0.0,
            kl_coef: 0.05,
            kl_estimator: rein_core::KlEstimator::K1,
            kl_in_reward: true,
            whiten_rewards: false,
            norm_adv: true,
            aggregation: rein_core::Aggregation::TokenMean,
            value_model: rein_core::ValueModel::Separate,
            value_model_path: None,
            critic_lr: None,
            critic_warmup_steps: 0,
            on_error: rollout.on_error,
            max_staleness: rollout.max_staleness,
            correction: rollout.correction,
            correction_level: rollout.correction_level,
            tis_cap: rollout.tis_cap,
            icepop_bounds: rollout.icepop_bounds,
        }
    }
}

impl LmPpoSection {
    /// Its rollouts: sampled and scored as GRPO's, on GRPO's keys and defaults.
    pub fn rollout(&self) -> Rollout {
        Rollout {
            steps: self.steps,
            prompts_per_step: self.prompts_per_step,
            on_error: self.on_error,
            max_staleness: self.max_staleness,
            correction: self.correction,
            correction_level: self.correction_level,
            tis_cap: self.tis_cap,
            icepop_bounds: self.icepop_bounds,
            tree: None,
        }
    }
}

/// A language-model PPO recipe: its hyperparameters and its prompts.
#[derive(Debug, Clone, Copy)]
pub struct LmPpoRecipe<'a> {
    /// The whole recipe.
    pub recipe: &'a Recipe,
    /// `[algorithm]`.
    pub ppo: &'a LmPpoSection,
    /// `[data]`.
    pub data: &'a DataSection,
}

impl LmPpoRecipe<'_> {
    /// Its rollouts (as GRPO's, [`LmPpoSection::rollout`]).
    pub fn rollout(&self) -> Rollout {
        self.ppo.rollout()
    }

    /// Rewards, sizes, coefficients in range, the value model, and its rollouts.
    pub(crate) fn check(&self) -> Result<(), Broken> {
        let (r, ppo) = (self.recipe, self.ppo);
        if r.reward.is_empty() {
            return Err(broken(
                "reward",
                "PPO on a language model needs at least one [[reward]] to score completions",
            ));
        }
        if r.sampler.n == 0 {
            return Err(broken("sampler.n", "must be at least 1"));
        }
        if ppo.update_epochs == 0 {
            return Err(broken("algorithm.update_epochs", "must be at least 1"));
        }
        let completions = ppo.prompts_per_step * r.sampler.n;
        if ppo.num_minibatches == 0 || ppo.num_minibatches > completions {
            return Err(broken(
                "algorithm.num_minibatches",
                format!(
                    "must be in 1..={completions} (prompts_per_step × sampler.n completions per step), got {}",
                    ppo.num_minibatches
                ),
            ));
        }
        for (key, value) in [("algorithm.gamma", ppo.gamma), ("algorithm.gae_lambda", ppo.gae_lambda)] {
            if !(0.0..=1.0).contains(&value) {
                return Err(broken(key, format!("must be in [0, 1], got {value}")));
            }
        }
        for (key, value) in [
            ("algorithm.clip_coef", ppo.clip_coef),
            ("algorithm.value_clip", ppo.value_clip),
        ] {
            if !(value > 0.0 && value.is_finite()) {
                return Err(broken(key, format!("must be > 0, got {value}")));
            }
        }
        for (key, value) in [("algorithm.vf_coef", ppo.vf_coef), ("algorithm.kl_coef", ppo.kl_coef)] {
            if !(value >= 0.0 && value.is_finite()) {
                return Err(broken(key, format!("must be ≥ 0, got {value}")));
            }
        }
        if !ppo.ent_coef.is_finite() {
            return Err(broken("algorithm.ent_coef", "must be a finite number"));
        }
        if let Some(lr) = ppo.critic_lr
            && !(lr > 0.0 && lr.is_finite())
        {
            return Err(broken("algorithm.critic_lr", format!("must be > 0, got {lr}")));
        }
        if ppo.critic_warmup_steps >= ppo.steps {
            return Err(broken(
                "algorithm.critic_warmup_steps",
                format!(
                    "is {} of {} steps: the policy would never learn",
                    ppo.critic_warmup_steps, ppo.steps
                ),
            ));
        }
        if ppo.value_model == rein_core::ValueModel::Head && ppo.value_model_path.is_some() {
            return Err(broken(
                "algorithm.value_model_path",
                "a value head reads the policy's hidden states and has no model of its own: \
                 set value_model = \"separate\" or remove value_model_path",
            ));
        }
        ppo.rollout().check(r)
    }
}

/// The sections PPO on a language model reads: those of every single-turn online algorithm.
pub(crate) const READS: &[(&str, crate::keys::Keys)] = crate::rollout::SINGLE_TURN_READS;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GrpoSection;

    /// PPO on a language model shares GRPO's asynchronous-rollout keys and their defaults, and
    /// online DPO's synchronous rollouts are theirs with no lag.
    #[test]
    fn the_online_algorithms_default_their_rollouts_alike() {
        let (grpo, ppo) = (GrpoSection::default(), LmPpoSection::default());
        let (of_grpo, of_ppo) = (grpo.rollout(), ppo.rollout());
        assert_eq!(of_ppo, of_grpo);
        let synchronous = Rollout::synchronous(of_grpo.steps, of_grpo.prompts_per_step, of_grpo.on_error);
        assert_eq!(synchronous, of_grpo);
    }
}
