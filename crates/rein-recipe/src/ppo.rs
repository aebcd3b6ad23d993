//! PPO on vector environments (CleanRL's `ppo.py`): its `[algorithm]` section, its view of a
//! recipe, its rules and the keys it reads.

use serde::{Deserialize, Serialize};

use crate::error::{Broken, broken};
use crate::keys::Keys;
use crate::schema::{EnvSection, Recipe};

/// PPO hyperparameters (CleanRL's names and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PpoSection {
    /// Steps per env per rollout.
    pub num_steps: usize,
    /// Discount γ.
    pub gamma: f32,
    /// GAE λ.
    pub gae_lambda: f32,
    /// Passes over each rollout.
    pub update_epochs: usize,
    /// Minibatches per pass.
    pub num_minibatches: usize,
    /// Surrogate clipping ε.
    pub clip_coef: f32,
    /// Anneal ε linearly to 0 with the learning rate.
    pub anneal_clip: bool,
    /// Clip the value loss around the old values.
    pub clip_vloss: bool,
    /// Entropy bonus coefficient.
    pub ent_coef: f32,
    /// Value loss coefficient.
    pub vf_coef: f32,
    /// Normalise advantages per minibatch.
    pub norm_adv: bool,
    /// Stop an update's epochs early when the approximate KL exceeds this.
    pub target_kl: Option<f32>,
    /// Normalise observations with running statistics.
    pub normalize_obs: bool,
    /// Scale rewards by the running std of the discounted return.
    pub normalize_reward: bool,
    /// Clip normalised observations to ±this.
    pub clip_obs: f32,
    /// Clip scaled rewards to ±this.
    pub clip_reward: f32,
}

impl Default for PpoSection {
    fn default() -> Self {
        Self {
            num_steps: 128,
            gamma: 0.99,
            gae_lambda: 0.95,
            update_epochs: 4,
            num_minibatches: 4,
            clip_coef: 0.2,
            anneal_clip: false,
            clip_vloss: true,
            ent_coef: 0.01,
            vf_coef: 0.5,
            norm_adv: true,
            target_kl: None,
            normalize_obs: false,
            normalize_reward: false,
            clip_obs: 10.0,
            clip_reward: 10.0,
        }
    }
}

/// A PPO recipe: its hyperparameters and its environment.
#[derive(Debug, Clone, Copy)]
pub struct PpoRecipe<'a> {
    /// The whole recipe.
    pub recipe: &'a Recipe,
    /// `[algorithm]`.
    pub ppo: &'a PpoSection,
    /// `[env]`.
    pub env: &'a EnvSection,
}

impl PpoRecipe<'_> {
    /// Sizes that must divide, coefficients in range, the environment's plugin limits.
    pub(crate) fn check(&self) -> Result<(), Broken> {
        let (ppo, env) = (self.ppo, self.env);
        if env.num_envs == 0 {
            return Err(broken("env.num_envs", "must be at least 1"));
        }
        if ppo.num_steps == 0 {
            return Err(broken("algorithm.num_steps", "must be at least 1"));
        }
        let batch = env.num_envs * ppo.num_steps;
        if ppo.num_minibatches == 0 || batch % ppo.num_minibatches != 0 {
            return Err(broken(
                "algorithm.num_minibatches",
                format!("must divide the batch of num_envs × num_steps = {batch}"),
            ));
        }
        if ppo.update_epochs == 0 {
            return Err(broken("algorithm.update_epochs", "must be at least 1"));
        }
        for (key, value) in [("algorithm.gamma", ppo.gamma), ("algorithm.gae_lambda", ppo.gae_lambda)] {
            if !(0.0..=1.0).contains(&value) {
                return Err(broken(key, format!("must be between 0 and 1, got {value}")));
            }
        }
        if ppo.clip_coef <= 0.0 {
            return Err(broken("algorithm.clip_coef", "must be positive"));
        }
        for (key, value) in [("algorithm.ent_coef", ppo.ent_coef), ("algorithm.vf_coef", ppo.vf_coef)] {
            if !(value >= 0.0 && value.is_finite()) {
                return Err(broken(key, format!("must be ≥ 0, got {value}")));
            }
        }
        env.limits
            .validate()
            .map_err(|e| broken(&format!("env.limits.{}", e.key), e.reason))?;
        Ok(())
    }
}

/// The sections PPO reads besides `name`, `seed`, `device` and `[algorithm]`.
pub(crate) const READS: &[(&str, Keys)] = &[
    ("env", Keys::All),
    (
        "model",
        Keys::Only(&["hidden", "activation", "init_log_std", "autodiff"]),
    ),
    (
        "optimizer",
        Keys::Only(&["lr", "anneal_lr", "eps", "beta1", "beta2", "max_grad_norm"]),
    ),
    ("train", Keys::All),
];
