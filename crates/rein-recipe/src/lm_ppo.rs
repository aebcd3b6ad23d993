//! What a recipe says about PPO on a language model, with a critic (InstructGPT; TRL's
//! `PPOTrainer` and OpenRLHF): `algorithm.name = "ppo"` in a recipe with `[data]` (prompts)
//! rather than `[env]`. Keys that mean what classic PPO's mean have CleanRL's names
//! (`gae_lambda`, `update_epochs`, `num_minibatches`, `clip_coef`, `vf_coef`, `norm_adv`);
//! defaults are TRL's.

use serde::{Deserialize, Serialize};

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
        Self {
            steps: 100,
            prompts_per_step: 8,
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
            on_error: rein_core::OnError::Fail,
            max_staleness: 0,
            correction: rein_core::LagCorrection::None,
            correction_level: rein_core::RatioLevel::Token,
            tis_cap: 2.0,
            icepop_bounds: [0.5, 2.0],
        }
    }
}
