//! SAC and TD3 as the off-policy trainer drives them ([`Learner`]): actions to explore with and to
//! evaluate with, one update on a sampled batch with its random draws taken from the run's
//! generator, and their state as checkpoint sections; implemented here for the burn-module
//! agents, in `flat/` for the flat ones. Built from a recipe by `build.rs`.

use std::path::Path;

use burn::module::AutodiffModule;
use burn::tensor::{Tensor, TensorData};
use rein_core::SeededRng;
use rein_model::ReinAutodiffBackend;

use super::Batch;
use super::sac::{Sac, SacNoise};
use super::td3::Td3;
use rein_run::checkpoint::{Checkpoint, CheckpointError};
use rein_run::driver::Snapshot;

/// An off-policy learner for continuous actions.
pub(crate) trait Learner<B: ReinAutodiffBackend>: Send {
    /// Exploration actions for `obs` (`[n, obs_dim]`), row-major, drawing noise from `rng`.
    fn explore(&self, obs: &[f32], rng: &mut SeededRng) -> Vec<f32>;

    /// The deterministic policy's actions for `obs` (evaluation).
    fn deterministic(&self, obs: &[f32]) -> Vec<f32>;

    /// The update of vector step `step` on `batch`; its logged losses by metric name.
    fn learn(&mut self, batch: &Batch, rng: &mut SeededRng, step: u64) -> Vec<(&'static str, f32)>;

    /// Networks, targets and optimisers as checkpoint sections.
    fn snapshot(&self) -> Snapshot;

    /// What [`Learner::snapshot`] wrote.
    fn restore(&mut self, checkpoint: &Checkpoint, device: &B::Device) -> Result<(), CheckpointError>;

    /// The first parameter holding a NaN or an infinity, named.
    fn non_finite_parameter(&self) -> Option<String>;

    /// Writes the policy's parameters as a safetensors file.
    fn save_policy(&self, path: &Path) -> std::io::Result<()>;
}

fn normals(rng: &mut SeededRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.normal() as f32).collect()
}

/// Row-major observations (`[n, obs_dim]`) as a tensor on `device`.
fn observations<C: burn::tensor::backend::Backend>(obs: &[f32], obs_dim: usize, device: &C::Device) -> Tensor<C, 2> {
    Tensor::from_data(TensorData::new(obs.to_vec(), [obs.len() / obs_dim, obs_dim]), device)
}

fn values<C: burn::tensor::backend::Backend>(actions: Tensor<C, 2>) -> Vec<f32> {
    actions.into_data().to_vec().unwrap_or_default()
}

impl<B: ReinAutodiffBackend> Learner<B> for Sac<B> {
    fn explore(&self, obs: &[f32], rng: &mut SeededRng) -> Vec<f32> {
        let obs = observations(obs, self.obs_dim(), &self.device());
        let eps = normals(rng, obs.dims()[0] * self.act_dim());
        values(self.act(obs, Some(eps)))
    }

    fn deterministic(&self, obs: &[f32]) -> Vec<f32> {
        values(self.act(observations(obs, self.obs_dim(), &self.device()), None))
    }

    fn learn(&mut self, batch: &Batch, rng: &mut SeededRng, step: u64) -> Vec<(&'static str, f32)> {
        let noise = SacNoise::draw(rng, self.settings(), batch.actions.len(), step);
        let losses = self.update(&batch.to_device(&self.device()), noise, step);
        losses.logged(self.alpha)
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

impl<B: ReinAutodiffBackend> Learner<B> for Td3<B> {
    fn explore(&self, obs: &[f32], rng: &mut SeededRng) -> Vec<f32> {
        let obs = observations(obs, self.obs_dim(), &self.device());
        let noise = normals(rng, obs.dims()[0] * self.act_dim());
        values(self.act(obs, Some(noise)))
    }

    fn deterministic(&self, obs: &[f32]) -> Vec<f32> {
        values(self.act(observations(obs, self.obs_dim(), &self.device()), None))
    }

    fn learn(&mut self, batch: &Batch, rng: &mut SeededRng, step: u64) -> Vec<(&'static str, f32)> {
        let noise = normals(rng, batch.actions.len());
        let losses = self.update(&batch.to_device(&self.device()), noise, step);
        losses.logged()
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
