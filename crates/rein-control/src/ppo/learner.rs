//! PPO's actor-critic and its optimiser as the update loop uses them ([`Learner`]): forward
//! passes for acting, a minibatch's loss and gradients, the clipped optimiser step, checkpoint
//! sections and the saved policy. Implemented here for the burn module trained through burn's
//! autodiff ([`BurnLearner`], `model.autodiff = true`), in `flat.rs` for flat buffers with the
//! gradient by hand (the default).

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, AdamConfig, GradientsParams, Optimizer};
use burn::tensor::{Int, Tensor, TensorData};
use rein_model::safetensors_file::{Tensors, module_tensors};
use rein_model::{ActionHead, ActorCritic, ReinAutodiffBackend};
use rein_optim::{PpoLossConfig, PpoLossValues, clip_grad_norm, ppo_loss};
use rein_recipe::OptimizerSection;
use rein_sampler::{categorical_entropy, categorical_log_prob, gaussian_entropy, gaussian_log_prob};

use super::rollout::Minibatch;
use crate::ControlError;
use rein_run::checkpoint::{Checkpoint, module_sections};
use rein_run::driver::Snapshot;

/// An actor `π(a|s)` and critic `V(s)` with their optimiser.
pub(super) trait Learner {
    /// Actor outputs (`[n, head]`, row-major) and values (`[n]`) for `n` observations, without
    /// gradients.
    fn forward(&mut self, obs: &[f32], n: usize) -> (Vec<f32>, Vec<f32>);

    /// The Gaussian head's log standard deviations (empty for a categorical head).
    fn log_std(&self) -> Vec<f32>;

    /// The loss of `minibatch` and its gradients, kept for [`Learner::apply`].
    fn gradients(&mut self, minibatch: Minibatch, config: &PpoLossConfig) -> PpoLossValues;

    /// Clips the last gradients to a global norm of `max_norm` and takes an Adam step of `lr`:
    /// the norm before clipping. A non-finite norm stops the update at `update`, naming the
    /// first parameter whose gradient is not finite; the parameters are then unchanged.
    fn apply(&mut self, update: usize, lr: f64, max_norm: f32) -> Result<f32, ControlError>;

    /// The networks and the optimiser as checkpoint sections.
    fn snapshot(&self) -> Snapshot;

    /// What [`Learner::snapshot`] wrote.
    fn restore(&mut self, checkpoint: &Checkpoint) -> Result<(), ControlError>;

    /// The first parameter holding a NaN or an infinity, named.
    fn non_finite_parameter(&self) -> Option<String>;

    /// The parameters under the burn module's names (`actor.layers.0.weight`, …, `log_std`),
    /// as the saved policy holds them.
    fn tensors(&self) -> Tensors;
}

/// The actor-critic as a burn module, trained through burn's autodiff.
pub(super) struct BurnLearner<B: ReinAutodiffBackend> {
    model: ActorCritic<B>,
    optim: OptimizerAdaptor<Adam, ActorCritic<B>, B>,
    /// `model` without gradient tracking, for acting.
    policy: ActorCritic<B::InnerBackend>,
    grads: Option<GradientsParams>,
    obs_dim: usize,
    device: B::Device,
}

impl<B: ReinAutodiffBackend> BurnLearner<B> {
    /// Trains `model` with Adam as `optimizer` configures it.
    pub(super) fn new(model: ActorCritic<B>, optimizer: &OptimizerSection, obs_dim: usize, device: &B::Device) -> Self {
        let optim = AdamConfig::new()
            .with_beta_1(optimizer.beta1)
            .with_beta_2(optimizer.beta2)
            .with_epsilon(optimizer.eps)
            .init::<B, ActorCritic<B>>();
        Self {
            policy: model.valid(),
            model,
            optim,
            grads: None,
            obs_dim,
            device: device.clone(),
        }
    }

    /// `log π(a|s)` of the minibatch's actions and the policy's entropy, with gradients.
    fn log_prob_and_entropy(&self, obs: Tensor<B, 2>, actions: Vec<f32>, n: usize) -> (Tensor<B, 1>, Tensor<B, 1>) {
        let out = self.model.actor(obs);
        match self.model.head() {
            ActionHead::Categorical(_) => {
                let actions: Vec<i64> = actions.iter().map(|&a| a as i64).collect();
                let actions = Tensor::<B, 1, Int>::from_data(TensorData::new(actions, [n]), &self.device);
                (categorical_log_prob(out.clone(), actions), categorical_entropy(out))
            }
            ActionHead::Gaussian(d) => {
                let log_std = self.model.log_std().expect("a Gaussian head has a log-std");
                let actions = Tensor::from_data(TensorData::new(actions, [n, d]), &self.device);
                (
                    gaussian_log_prob(out, log_std.clone(), actions),
                    gaussian_entropy(log_std),
                )
            }
        }
    }
}

impl<B: ReinAutodiffBackend> Learner for BurnLearner<B> {
    fn forward(&mut self, obs: &[f32], n: usize) -> (Vec<f32>, Vec<f32>) {
        let obs =
            Tensor::<B::InnerBackend, 2>::from_data(TensorData::new(obs.to_vec(), [n, self.obs_dim]), &self.device);
        let out = self.policy.actor(obs.clone()).into_data().to_vec::<f32>();
        let values = self.policy.value(obs).into_data().to_vec::<f32>();
        (out.unwrap_or_default(), values.unwrap_or_default())
    }

    fn log_std(&self) -> Vec<f32> {
        let log_std = self.policy.log_std().map(|t| t.into_data().to_vec::<f32>());
        log_std.and_then(Result::ok).unwrap_or_default()
    }

    fn gradients(&mut self, mb: Minibatch, config: &PpoLossConfig) -> PpoLossValues {
        let n = mb.log_probs.len();
        let row = |values: Vec<f32>| Tensor::<B, 1>::from_data(TensorData::new(values, [n]), &self.device);
        let _graph = rein_model::one_graph();
        let obs = Tensor::<B, 2>::from_data(TensorData::new(mb.obs, [n, self.obs_dim]), &self.device);
        let (new_log_prob, entropy) = self.log_prob_and_entropy(obs.clone(), mb.actions, n);
        let loss = ppo_loss(
            new_log_prob,
            row(mb.log_probs),
            row(mb.advantages),
            self.model.value(obs),
            row(mb.values),
            row(mb.returns),
            entropy,
            config,
        );
        self.grads = Some(GradientsParams::from_grads(loss.loss.backward(), &self.model));
        loss.values()
    }

    fn apply(&mut self, update: usize, lr: f64, max_norm: f32) -> Result<f32, ControlError> {
        let mut grads = self.grads.take().expect("gradients are taken before a step");
        let grad_norm = clip_grad_norm(&self.model, &mut grads, max_norm);
        rein_run::RunError::check_gradients(update, grad_norm, || {
            rein_optim::non_finite_gradient(&self.model, &grads)
        })?;
        self.model = self.optim.step(lr, self.model.clone(), grads);
        self.policy = self.model.valid();
        Ok(grad_norm)
    }

    fn snapshot(&self) -> Snapshot {
        let (model, optim) = (self.model.clone(), self.optim.clone());
        Box::new(move || module_sections::<B, ActorCritic<B>, _>(["model", "optimizer"], &model, &optim))
    }

    fn restore(&mut self, checkpoint: &Checkpoint) -> Result<(), ControlError> {
        let model = checkpoint.load_module("model", self.model.clone(), &self.device)?;
        let optim = checkpoint.load_optimizer::<B, ActorCritic<B>, _>("optimizer", self.optim.clone(), &self.device)?;
        (self.model, self.optim, self.policy) = (model.clone(), optim, model.valid());
        Ok(())
    }

    fn non_finite_parameter(&self) -> Option<String> {
        rein_optim::non_finite_parameter(&self.model)
    }

    fn tensors(&self) -> Tensors {
        module_tensors(&self.policy)
    }
}
