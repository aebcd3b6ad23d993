//! SAC and TD3 as the off-policy trainer drives them ([`Agent`]): actions to explore with and to
//! evaluate with, one update on a sampled batch with its random draws taken from the run's
//! generator, and their state as checkpoint sections. Built from a recipe by [`agent`].

use std::path::Path;

use burn::module::AutodiffModule;
use burn::tensor::Tensor;
use rein_core::{BoxSpace, SeededRng};
use rein_model::{OffPolicyConfig, ReinAutodiffBackend};
use rein_recipe::{OffPolicyAlgorithm, SacSection, Td3Section};

use super::Transitions;
use super::sac::{Sac, SacNoise, SacSettings, TwinCritics};
use super::td3::{Td3, Td3Settings};
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::driver::Snapshot;

/// An off-policy learner for continuous actions.
pub(crate) trait Agent<B: ReinAutodiffBackend> {
    /// Exploration actions for `obs` (`[n, obs_dim]`), row-major, drawing noise from `rng`.
    fn explore(&self, obs: Tensor<B::InnerBackend, 2>, rng: &mut SeededRng) -> Vec<f32>;

    /// The deterministic policy's actions for `obs` (evaluation).
    fn deterministic(&self, obs: Tensor<B::InnerBackend, 2>) -> Vec<f32>;

    /// The update of vector step `step` on `batch`; its logged losses by metric name.
    fn learn(&mut self, batch: &Transitions<B>, rng: &mut SeededRng, step: u64) -> Vec<(&'static str, f32)>;

    /// Networks, targets and optimisers as checkpoint sections.
    fn snapshot(&self) -> Snapshot;

    /// What [`Agent::snapshot`] wrote.
    fn restore(&mut self, checkpoint: &Checkpoint, device: &B::Device) -> Result<(), CheckpointError>;

    /// The first parameter holding a NaN or an infinity, named.
    fn non_finite_parameter(&self) -> Option<String>;

    /// Writes the policy's parameters as a safetensors file.
    fn save_policy(&self, path: &Path) -> std::io::Result<()>;
}

/// The recipe's agent, its networks initialised from `rng`.
pub(crate) fn agent<B: ReinAutodiffBackend>(
    algorithm: OffPolicyAlgorithm<'_>,
    config: &OffPolicyConfig,
    bounds: &BoxSpace,
    rng: &mut SeededRng,
    device: &B::Device,
) -> Box<dyn Agent<B>> {
    let twin = |rng: &mut SeededRng| TwinCritics {
        q1: config.q_network(rng, device),
        q2: config.q_network(rng, device),
    };
    match algorithm {
        OffPolicyAlgorithm::Sac(section) => {
            let actor = config.gaussian_actor(rng, device);
            let settings = sac_settings(section, config.act_dim);
            Box::new(Sac::new(actor, twin(rng), None, bounds, settings, device))
        }
        OffPolicyAlgorithm::Td3(section) => {
            let actor = config.deterministic_actor(rng, device);
            Box::new(Td3::new(
                actor,
                twin(rng),
                None,
                None,
                bounds,
                td3_settings(section),
                device,
            ))
        }
    }
}

/// SAC's settings from its section: with `autotune`, α starts at 1 and learns toward
/// `target_entropy` (default `−act_dim`), as CleanRL's `autotune` does.
fn sac_settings(s: &SacSection, act_dim: usize) -> SacSettings {
    SacSettings {
        gamma: s.gamma,
        tau: s.tau,
        policy_lr: s.policy_lr,
        q_lr: s.q_lr,
        policy_frequency: s.policy_frequency,
        target_network_frequency: s.target_network_frequency,
        target_entropy: s.autotune.then(|| s.target_entropy.unwrap_or(-(act_dim as f32))),
        alpha: if s.autotune { 1.0 } else { s.alpha },
    }
}

fn td3_settings(t: &Td3Section) -> Td3Settings {
    Td3Settings {
        gamma: t.gamma,
        tau: t.tau,
        learning_rate: t.learning_rate,
        policy_noise: t.policy_noise,
        noise_clip: t.noise_clip,
        policy_frequency: t.policy_frequency,
        exploration_noise: t.exploration_noise,
    }
}

fn normals(rng: &mut SeededRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.normal() as f32).collect()
}

fn values<C: burn::tensor::backend::Backend>(actions: Tensor<C, 2>) -> Vec<f32> {
    actions.into_data().to_vec().unwrap_or_default()
}

impl<B: ReinAutodiffBackend> Agent<B> for Sac<B> {
    fn explore(&self, obs: Tensor<B::InnerBackend, 2>, rng: &mut SeededRng) -> Vec<f32> {
        let eps = normals(rng, obs.dims()[0] * self.act_dim());
        values(self.act(obs, Some(eps)))
    }

    fn deterministic(&self, obs: Tensor<B::InnerBackend, 2>) -> Vec<f32> {
        values(self.act(obs, None))
    }

    fn learn(&mut self, batch: &Transitions<B>, rng: &mut SeededRng, step: u64) -> Vec<(&'static str, f32)> {
        let values = batch.actions.dims().iter().product();
        let noise = SacNoise::draw(rng, self.settings(), values, step);
        let losses = self.update(batch, noise, step);
        let mut logged = vec![
            ("losses/qf1_loss", losses.qf1_loss),
            ("losses/qf2_loss", losses.qf2_loss),
            ("losses/qf1_values", losses.qf1_values),
            ("losses/alpha", self.alpha),
        ];
        logged.extend(losses.actor_loss.map(|l| ("losses/actor_loss", l)));
        logged.extend(losses.alpha_loss.map(|l| ("losses/alpha_loss", l)));
        logged
    }

    fn snapshot(&self) -> Snapshot {
        Sac::snapshot(self)
    }

    fn restore(&mut self, checkpoint: &Checkpoint, device: &B::Device) -> Result<(), CheckpointError> {
        Sac::restore(self, checkpoint, device)
    }

    fn non_finite_parameter(&self) -> Option<String> {
        let named = |what: &str, found: Option<String>| found.map(|p| format!("{what}.{p}"));
        named("actor", rein_optim::non_finite_parameter(&self.actor))
            .or_else(|| named("critics", rein_optim::non_finite_parameter(&self.critics)))
            .or_else(|| named("temperature", rein_optim::non_finite_parameter(&self.temperature)))
    }

    fn save_policy(&self, path: &Path) -> std::io::Result<()> {
        rein_model::safetensors_file::save_module(&self.actor.valid(), path)
    }
}

impl<B: ReinAutodiffBackend> Agent<B> for Td3<B> {
    fn explore(&self, obs: Tensor<B::InnerBackend, 2>, rng: &mut SeededRng) -> Vec<f32> {
        let noise = normals(rng, obs.dims()[0] * self.act_dim());
        values(self.act(obs, Some(noise)))
    }

    fn deterministic(&self, obs: Tensor<B::InnerBackend, 2>) -> Vec<f32> {
        values(self.act(obs, None))
    }

    fn learn(&mut self, batch: &Transitions<B>, rng: &mut SeededRng, step: u64) -> Vec<(&'static str, f32)> {
        let noise = normals(rng, batch.actions.dims().iter().product());
        let losses = self.update(batch, noise, step);
        let mut logged = vec![
            ("losses/qf1_loss", losses.qf1_loss),
            ("losses/qf2_loss", losses.qf2_loss),
            ("losses/qf1_values", losses.qf1_values),
        ];
        logged.extend(losses.actor_loss.map(|l| ("losses/actor_loss", l)));
        logged
    }

    fn snapshot(&self) -> Snapshot {
        Td3::snapshot(self)
    }

    fn restore(&mut self, checkpoint: &Checkpoint, device: &B::Device) -> Result<(), CheckpointError> {
        Td3::restore(self, checkpoint, device)
    }

    fn non_finite_parameter(&self) -> Option<String> {
        let named = |what: &str, found: Option<String>| found.map(|p| format!("{what}.{p}"));
        named("actor", rein_optim::non_finite_parameter(&self.actor))
            .or_else(|| named("critics", rein_optim::non_finite_parameter(&self.critics)))
    }

    fn save_policy(&self, path: &Path) -> std::io::Result<()> {
        rein_model::safetensors_file::save_module(&self.actor.valid(), path)
    }
}
