//! What a recipe says about the off-policy actor-critics for continuous actions:
//! `algorithm.name = "sac"` (soft actor-critic) and `"td3"`, on an `[env]` plugin as PPO. Keys
//! and defaults are CleanRL's (`sac_continuous_action.py`, `td3_continuous_action.py`); the
//! networks' widths are `model.hidden` (CleanRL: `[256, 256]`). Sizes count environment steps
//! (all envs), as `train.total_steps` does.

use serde::{Deserialize, Serialize};

use crate::error::{Broken, broken};
use crate::schema::{EnvSection, Recipe};

/// Soft actor-critic (Haarnoja et al. 2018), with the automatic entropy temperature.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SacSection {
    /// Transitions the replay buffer keeps (the oldest are overwritten).
    pub buffer_size: usize,
    /// Discount γ.
    pub gamma: f32,
    /// τ, how far the target critics move toward the critics each time.
    pub tau: f64,
    /// Transitions per update.
    pub batch_size: usize,
    /// Environment steps of uniformly random actions before the first update.
    pub learning_starts: u64,
    /// The actor's learning rate.
    pub policy_lr: f64,
    /// The critics' (and the temperature's) learning rate.
    pub q_lr: f64,
    /// Every this many vector steps (past `learning_starts`), this many actor (and temperature)
    /// steps.
    pub policy_frequency: u64,
    /// Every this many vector steps, the target critics move toward the critics.
    pub target_network_frequency: u64,
    /// The entropy temperature α (its start when `autotune`).
    pub alpha: f32,
    /// Learn α toward the target entropy (CleanRL's `autotune`, default on; α then starts at 1).
    pub autotune: bool,
    /// The target entropy `H̄` (default `−act_dim`, SAC's).
    pub target_entropy: Option<f32>,
    /// Vector steps of the environments per metrics record (and per driver step, the unit of
    /// `train.checkpoint_every`).
    pub log_every: usize,
}

impl Default for SacSection {
    fn default() -> Self {
        Self {
            buffer_size: 1_000_000,
            gamma: 0.99,
            tau: 0.005,
            batch_size: 256,
            learning_starts: 5_000,
            policy_lr: 3e-4,
            q_lr: 1e-3,
            policy_frequency: 2,
            target_network_frequency: 1,
            alpha: 0.2,
            autotune: true,
            target_entropy: None,
            log_every: 100,
        }
    }
}

/// Twin delayed DDPG (Fujimoto et al. 2018).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Td3Section {
    /// Transitions the replay buffer keeps (the oldest are overwritten).
    pub buffer_size: usize,
    /// Discount γ.
    pub gamma: f32,
    /// τ, how far the target networks move toward the trained ones each time.
    pub tau: f64,
    /// Transitions per update.
    pub batch_size: usize,
    /// Environment steps of uniformly random actions before the first update.
    pub learning_starts: u64,
    /// The actor's and the critics' learning rate.
    pub learning_rate: f64,
    /// σ̃, the target policy smoothing noise (in half-widths of the action box).
    pub policy_noise: f32,
    /// c, where the smoothing noise is clipped.
    pub noise_clip: f32,
    /// σ_e, the exploration noise added to the actor's actions (in half-widths of the box).
    pub exploration_noise: f32,
    /// Every this many vector steps, one actor step and the targets' averaging.
    pub policy_frequency: u64,
    /// Vector steps of the environments per metrics record (and per driver step, the unit of
    /// `train.checkpoint_every`).
    pub log_every: usize,
}

impl Default for Td3Section {
    fn default() -> Self {
        Self {
            buffer_size: 1_000_000,
            gamma: 0.99,
            tau: 0.005,
            batch_size: 256,
            learning_starts: 25_000,
            learning_rate: 3e-4,
            policy_noise: 0.2,
            noise_clip: 0.5,
            exploration_noise: 0.1,
            policy_frequency: 2,
            log_every: 100,
        }
    }
}

/// Which off-policy algorithm, with its section.
#[derive(Debug, Clone, Copy)]
pub enum OffPolicyAlgorithm<'a> {
    /// `algorithm.name = "sac"`.
    Sac(&'a SacSection),
    /// `algorithm.name = "td3"`.
    Td3(&'a Td3Section),
}

impl OffPolicyAlgorithm<'_> {
    /// The algorithm's name as a reader knows it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Sac(_) => "SAC",
            Self::Td3(_) => "TD3",
        }
    }

    /// The replay buffer's capacity.
    pub fn buffer_size(&self) -> usize {
        match self {
            Self::Sac(s) => s.buffer_size,
            Self::Td3(t) => t.buffer_size,
        }
    }

    /// Transitions per update.
    pub fn batch_size(&self) -> usize {
        match self {
            Self::Sac(s) => s.batch_size,
            Self::Td3(t) => t.batch_size,
        }
    }

    /// Random-action environment steps before the first update.
    pub fn learning_starts(&self) -> u64 {
        match self {
            Self::Sac(s) => s.learning_starts,
            Self::Td3(t) => t.learning_starts,
        }
    }

    /// Vector steps per metrics record.
    pub fn log_every(&self) -> usize {
        match self {
            Self::Sac(s) => s.log_every,
            Self::Td3(t) => t.log_every,
        }
    }
}

/// A SAC or TD3 recipe: its hyperparameters and its environment.
#[derive(Debug, Clone, Copy)]
pub struct OffPolicyRecipe<'a> {
    /// The whole recipe.
    pub recipe: &'a Recipe,
    /// `[algorithm]`.
    pub algorithm: OffPolicyAlgorithm<'a>,
    /// `[env]`.
    pub env: &'a EnvSection,
}

impl OffPolicyRecipe<'_> {
    /// Sizes at least 1, coefficients in range, the environment's plugin limits. (That the
    /// environment's actions are a box is checked when its plugin is loaded.)
    pub(crate) fn check(&self) -> Result<(), Broken> {
        let (a, env) = (self.algorithm, self.env);
        let at_least_one = [
            ("env.num_envs", env.num_envs as u64),
            ("algorithm.buffer_size", a.buffer_size() as u64),
            ("algorithm.batch_size", a.batch_size() as u64),
            ("algorithm.log_every", a.log_every() as u64),
        ];
        let (gamma, tau, policy_frequency) = match a {
            OffPolicyAlgorithm::Sac(s) => (s.gamma, s.tau, s.policy_frequency),
            OffPolicyAlgorithm::Td3(t) => (t.gamma, t.tau, t.policy_frequency),
        };
        for (key, value) in at_least_one
            .into_iter()
            .chain([("algorithm.policy_frequency", policy_frequency)])
        {
            if value == 0 {
                return Err(broken(key, "must be at least 1"));
            }
        }
        if !(0.0..=1.0).contains(&gamma) {
            return Err(broken(
                "algorithm.gamma",
                format!("must be between 0 and 1, got {gamma}"),
            ));
        }
        if !(tau > 0.0 && tau <= 1.0) {
            return Err(broken("algorithm.tau", format!("must be in (0, 1], got {tau}")));
        }
        match a {
            OffPolicyAlgorithm::Sac(s) => check_sac(s)?,
            OffPolicyAlgorithm::Td3(t) => check_td3(t)?,
        }
        env.limits
            .validate()
            .map_err(|e| broken(&format!("env.limits.{}", e.key), e.reason))
    }
}

fn positive(key: &str, value: f64) -> Result<(), Broken> {
    match value > 0.0 && value.is_finite() {
        true => Ok(()),
        false => Err(broken(key, format!("must be positive, got {value}"))),
    }
}

fn check_sac(s: &SacSection) -> Result<(), Broken> {
    positive("algorithm.policy_lr", s.policy_lr)?;
    positive("algorithm.q_lr", s.q_lr)?;
    positive("algorithm.alpha", f64::from(s.alpha))?;
    if s.target_network_frequency == 0 {
        return Err(broken("algorithm.target_network_frequency", "must be at least 1"));
    }
    match (s.target_entropy, s.autotune) {
        (Some(_), false) => Err(broken(
            "algorithm.target_entropy",
            "is only read when `algorithm.autotune = true` learns the temperature",
        )),
        (Some(h), true) if !h.is_finite() => Err(broken("algorithm.target_entropy", "must be finite")),
        _ => Ok(()),
    }
}

fn check_td3(t: &Td3Section) -> Result<(), Broken> {
    positive("algorithm.learning_rate", t.learning_rate)?;
    for (key, value) in [
        ("algorithm.policy_noise", t.policy_noise),
        ("algorithm.noise_clip", t.noise_clip),
        ("algorithm.exploration_noise", t.exploration_noise),
    ] {
        if !(value >= 0.0 && value.is_finite()) {
            return Err(broken(key, format!("must be ≥ 0, got {value}")));
        }
    }
    Ok(())
}

/// The sections SAC and TD3 read: they keep their learning rates in `[algorithm]`, as CleanRL
/// does.
pub(crate) const READS: &[(&str, crate::keys::Keys)] = &[
    ("env", crate::keys::Keys::All),
    ("model", crate::keys::Keys::Only(&["hidden", "autodiff"])),
    ("train", crate::keys::Keys::All),
];
