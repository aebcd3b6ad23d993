//! What a recipe may contain. Every section rejects unknown keys; every key has a default
//! unless a recipe must choose it.

use rein_plugin::SandboxLimits;
use serde::{Deserialize, Serialize};

/// A resolved recipe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// Name of the run (defaults to the recipe's file name); run directories start with it.
    #[serde(default)]
    pub name: Option<String>,
    /// Seed for everything random: model init, environments, sampling, minibatches.
    #[serde(default = "defaults::seed")]
    pub seed: u64,
    /// `cpu` (burn Flex) or `cuda` (burn-cuda, when built with `--features cuda`).
    #[serde(default)]
    pub device: Device,
    /// The algorithm and its hyperparameters.
    pub algorithm: Algorithm,
    /// The environment (for PPO on environments).
    #[serde(default)]
    pub env: Option<EnvSection>,
    /// The network.
    #[serde(default)]
    pub model: ModelSection,
    /// The optimiser.
    #[serde(default)]
    pub optimizer: OptimizerSection,
    /// Length of training, stopping, evaluation, logging.
    #[serde(default)]
    pub train: TrainSection,
}

/// Where tensors live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// burn's Flex CPU backend.
    #[default]
    Cpu,
    /// burn-cuda (GPU 0).
    Cuda,
}

/// The algorithm, selected by `algorithm.name`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "lowercase", deny_unknown_fields)]
pub enum Algorithm {
    /// Proximal policy optimisation on vector environments.
    Ppo(PpoSection),
}

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

/// The environment plugin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvSection {
    /// Plugin name (`target/plugins/<name>.wasm`) or a path to a `.wasm` file.
    pub plugin: String,
    /// Environments stepped together.
    #[serde(default = "defaults::num_envs")]
    pub num_envs: usize,
    /// The plugin's own config (passed to it as JSON).
    #[serde(default)]
    pub config: toml::Table,
    /// Sandbox limits for the plugin.
    #[serde(default)]
    pub limits: SandboxLimits,
}

/// The network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// Hidden layer widths.
    pub hidden: Vec<usize>,
    /// `tanh` or `relu`.
    pub activation: rein_model::Activation,
    /// Initial log standard deviation of a Gaussian policy.
    pub init_log_std: f32,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            hidden: vec![64, 64],
            activation: rein_model::Activation::Tanh,
            init_log_std: 0.0,
        }
    }
}

/// Adam with global gradient clipping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OptimizerSection {
    /// Learning rate.
    pub lr: f64,
    /// Anneal the learning rate linearly to 0.
    pub anneal_lr: bool,
    /// Adam ε.
    pub eps: f32,
    /// Adam β₁.
    pub beta1: f32,
    /// Adam β₂.
    pub beta2: f32,
    /// Clip the global gradient norm to this.
    pub max_grad_norm: f32,
}

impl Default for OptimizerSection {
    fn default() -> Self {
        Self {
            lr: 2.5e-4,
            anneal_lr: true,
            eps: 1e-5,
            beta1: 0.9,
            beta2: 0.999,
            max_grad_norm: 0.5,
        }
    }
}

/// How long to train and what to record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainSection {
    /// Environment steps in total (all envs).
    pub total_steps: u64,
    /// Stop once the mean return of the last `return_window` episodes reaches this.
    pub stop_at_return: Option<f64>,
    /// Episodes in the moving mean return.
    pub return_window: usize,
    /// Episodes of the deterministic policy to evaluate at the end.
    pub eval_episodes: usize,
    /// Directory for run directories.
    pub runs_dir: String,
}

impl Default for TrainSection {
    fn default() -> Self {
        Self {
            total_steps: 100_000,
            stop_at_return: None,
            return_window: 20,
            eval_episodes: 10,
            runs_dir: "runs".into(),
        }
    }
}

mod defaults {
    pub fn seed() -> u64 {
        1
    }
    pub fn num_envs() -> usize {
        8
    }
}
