//! One SAC update in CleanRL's order (`sac_continuous_action.py`, the body of its training
//! step): the twin critics' step toward the soft target, then — every `policy_frequency` steps
//! — `policy_frequency` actor steps, each followed by a temperature step, then the targets'
//! Polyak averaging every `target_network_frequency` steps. The equations are in rein-optim's
//! `soft_actor_critic.rs`.

use burn::module::{AutodiffModule, Module, Param};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor};
use rein_model::{GaussianActor, QNetwork, ReinAutodiffBackend, ReinBackend};
use rein_optim::{
    SquashedSample, bounded_log_std, polyak_update, sac_actor_loss, soft_q_target, squashed_gaussian, temperature_loss,
    twin_critic_loss,
};

use rein_core::{BoxSpace, SeededRng};

use super::{BoxTensors, Transitions, normals, torch_adam};
use rein_run::checkpoint::{Checkpoint, CheckpointError, module_bytes, module_sections};
use rein_run::driver::Snapshot;

/// The twin critics `Q₁`, `Q₂`, stepped by one optimiser (CleanRL's `q_optimizer` over both).
#[derive(Module, Debug)]
pub struct TwinCritics<B: ReinBackend> {
    /// `Q₁`.
    pub q1: QNetwork<B>,
    /// `Q₂`.
    pub q2: QNetwork<B>,
}

impl<B: ReinBackend> TwinCritics<B> {
    /// `(Q₁(s, a), Q₂(s, a))`, `[batch]` each.
    pub fn forward(&self, obs: Tensor<B, 2>, actions: Tensor<B, 2>) -> (Tensor<B, 1>, Tensor<B, 1>) {
        (
            self.q1.forward(obs.clone(), actions.clone()),
            self.q2.forward(obs, actions),
        )
    }
}

/// The entropy temperature `α = exp(log α)`, learned when `target_entropy` is set.
#[derive(Module, Debug)]
pub struct Temperature<B: Backend> {
    /// `log α`, `[1]`.
    pub log_alpha: Param<Tensor<B, 1>>,
}

/// SAC's settings (CleanRL's names and defaults in the recipe).
#[derive(Debug, Clone, PartialEq)]
pub struct SacSettings {
    /// γ.
    pub gamma: f32,
    /// τ, the targets' Polyak coefficient.
    pub tau: f64,
    /// The actor's learning rate.
    pub policy_lr: f64,
    /// The critics' (and the temperature's) learning rate.
    pub q_lr: f64,
    /// Every this many steps, this many actor (and temperature) steps.
    pub policy_frequency: u64,
    /// Every this many steps, the targets move toward the critics.
    pub target_network_frequency: u64,
    /// `H̄`: learn α toward this entropy; `None` keeps α fixed.
    pub target_entropy: Option<f32>,
    /// α at the start (CleanRL: `alpha` when fixed, 1 = exp(0) when learned).
    pub alpha: f32,
}

/// The standard normals one update draws: `ε` for the next actions, and for each of the
/// `policy_frequency` actor steps the actor's and (when α is learned) the temperature's.
#[derive(Debug, Clone, PartialEq)]
pub struct SacNoise {
    /// `[batch × act_dim]`, for `a' ~ π(·|s')`.
    pub next: Vec<f32>,
    /// One `[batch × act_dim]` per actor step, for `ã ~ π(·|s)`.
    pub policy: Vec<Vec<f32>>,
    /// One per actor step, for the temperature's `log π(ã|s)` (empty when α is fixed).
    pub temperature: Vec<Vec<f32>>,
}

impl SacNoise {
    /// The draws of update `step` on a batch of `rows × act_dim` actions, from `rng` in the
    /// order the update reads them; only the actor steps `step` takes are drawn for.
    pub fn draw(rng: &mut SeededRng, settings: &SacSettings, values: usize, step: u64) -> Self {
        let mut normals = |n: usize| (0..n).map(|_| rng.normal() as f32).collect::<Vec<f32>>();
        let next = normals(values);
        let actor_steps = match step.is_multiple_of(settings.policy_frequency) {
            true => settings.policy_frequency as usize,
            false => 0,
        };
        let (mut policy, mut temperature) = (Vec::new(), Vec::new());
        for _ in 0..actor_steps {
            policy.push(normals(values));
            if settings.target_entropy.is_some() {
                temperature.push(normals(values));
            }
        }
        Self {
            next,
            policy,
            temperature,
        }
    }
}

/// What an update measured (CleanRL's logged losses).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SacLosses {
    /// `mean((Q₁ − y)²)`.
    pub qf1_loss: f32,
    /// `mean((Q₂ − y)²)`.
    pub qf2_loss: f32,
    /// `mean(Q₁(s, a))`.
    pub qf1_values: f32,
    /// The last actor step's loss, when the actor stepped.
    pub actor_loss: Option<f32>,
    /// The last temperature step's loss, when α is learned and the actor stepped.
    pub alpha_loss: Option<f32>,
}

impl SacLosses {
    /// The losses by metric name (CleanRL's), with α after the update.
    pub fn logged(&self, alpha: f32) -> Vec<(&'static str, f32)> {
        let mut logged = vec![
            ("losses/qf1_loss", self.qf1_loss),
            ("losses/qf2_loss", self.qf2_loss),
            ("losses/qf1_values", self.qf1_values),
            ("losses/alpha", alpha),
        ];
        logged.extend(self.actor_loss.map(|l| ("losses/actor_loss", l)));
        logged.extend(self.alpha_loss.map(|l| ("losses/alpha_loss", l)));
        logged
    }
}

/// SAC's networks, targets, temperature and optimisers.
pub struct Sac<B: ReinAutodiffBackend> {
    /// The policy.
    pub actor: GaussianActor<B>,
    /// `Q₁`, `Q₂`.
    pub critics: TwinCritics<B>,
    /// `Q̄₁`, `Q̄₂` (no gradients).
    pub targets: TwinCritics<B::InnerBackend>,
    /// `log α`.
    pub temperature: Temperature<B>,
    /// α now (CleanRL's `alpha`, read after each temperature step).
    pub alpha: f32,
    actor_optim: OptimizerAdaptor<Adam, GaussianActor<B>, B>,
    critic_optim: OptimizerAdaptor<Adam, TwinCritics<B>, B>,
    temperature_optim: OptimizerAdaptor<Adam, Temperature<B>, B>,
    settings: SacSettings,
    bounds: BoxTensors<B>,
}

impl<B: ReinAutodiffBackend> Sac<B> {
    /// An agent from its networks; the targets start as copies of the critics (CleanRL's
    /// `load_state_dict`) unless given.
    pub fn new(
        actor: GaussianActor<B>,
        critics: TwinCritics<B>,
        targets: Option<TwinCritics<B::InnerBackend>>,
        bounds: &BoxSpace,
        settings: SacSettings,
        device: &B::Device,
    ) -> Self {
        let log_alpha = Tensor::from_floats([settings.alpha.ln()], device);
        Self {
            targets: targets.unwrap_or_else(|| critics.valid()),
            actor,
            critics,
            temperature: Temperature {
                log_alpha: Param::from_tensor(log_alpha),
            },
            alpha: settings.alpha,
            actor_optim: torch_adam().init(),
            critic_optim: torch_adam().init(),
            temperature_optim: torch_adam().init(),
            settings,
            bounds: BoxTensors::new(bounds, device),
        }
    }

    /// The critics' loss toward the soft target (`y` with the next actions drawn from `next`):
    /// `(L_Q, L_Q₁, L_Q₂, mean Q₁)`.
    pub fn critic_loss(
        &self,
        batch: &Transitions<B>,
        next: Vec<f32>,
    ) -> (Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>, f32) {
        let next_obs = batch.next_obs.clone().inner();
        let next = sample(&self.actor.valid(), next_obs.clone(), next, &self.bounds.inner());
        let (target_q1, target_q2) = self.targets.forward(next_obs, next.action);
        let y = soft_q_target(
            batch.rewards.clone().inner(),
            batch.dones.clone().inner(),
            self.settings.gamma,
            target_q1,
            target_q2,
            self.alpha,
            next.log_prob,
        );
        let (q1, q2) = self.critics.forward(batch.obs.clone(), batch.actions.clone());
        let qf1_values = q1.clone().mean().into_scalar().elem();
        let (loss, l1, l2) = twin_critic_loss(q1, q2, Tensor::from_inner(y));
        (loss, l1, l2, qf1_values)
    }

    /// The actor's loss with `ã` drawn from `eps`.
    pub fn actor_loss(&self, obs: Tensor<B, 2>, eps: Vec<f32>) -> Tensor<B, 1> {
        let pi = sample(&self.actor, obs.clone(), eps, &self.bounds);
        let (q1, q2) = self.critics.forward(obs, pi.action);
        sac_actor_loss(self.alpha, pi.log_prob, q1, q2)
    }

    /// The temperature's loss with `ã` drawn from `eps` (no gradient to the actor).
    pub fn temperature_loss(&self, obs: Tensor<B, 2>, eps: Vec<f32>, target_entropy: f32) -> Tensor<B, 1> {
        let log_prob = sample(&self.actor.valid(), obs.inner(), eps, &self.bounds.inner()).log_prob;
        temperature_loss(
            self.temperature.log_alpha.val(),
            Tensor::from_inner(log_prob),
            target_entropy,
        )
    }

    /// The update of CleanRL's global step `step` on `batch`.
    ///
    /// # Panics
    /// If `noise` has fewer draws than the update takes.
    pub fn update(&mut self, batch: &Transitions<B>, noise: SacNoise, step: u64) -> SacLosses {
        let s = self.settings.clone();
        // One autodiff graph at a time in the process, as every trainer's step.
        let _graph = rein_model::one_graph();
        let (loss, l1, l2, qf1_values) = self.critic_loss(batch, noise.next);
        let grads = GradientsParams::from_grads(loss.backward(), &self.critics);
        self.critics = self.critic_optim.step(s.q_lr, self.critics.clone(), grads);
        let mut losses = SacLosses {
            qf1_loss: l1.into_scalar().elem(),
            qf2_loss: l2.into_scalar().elem(),
            qf1_values,
            actor_loss: None,
            alpha_loss: None,
        };
        if step.is_multiple_of(s.policy_frequency) {
            let (mut policy, mut temperature) = (noise.policy.into_iter(), noise.temperature.into_iter());
            for _ in 0..s.policy_frequency {
                let eps = policy.next().expect("a policy draw per actor step");
                let loss = self.actor_loss(batch.obs.clone(), eps);
                losses.actor_loss = Some(loss.clone().into_scalar().elem());
                let grads = GradientsParams::from_grads(loss.backward(), &self.actor);
                self.actor = self.actor_optim.step(s.policy_lr, self.actor.clone(), grads);
                if let Some(target_entropy) = s.target_entropy {
                    let eps = temperature.next().expect("a temperature draw per actor step");
                    let loss = self.temperature_loss(batch.obs.clone(), eps, target_entropy);
                    losses.alpha_loss = Some(loss.clone().into_scalar().elem());
                    let grads = GradientsParams::from_grads(loss.backward(), &self.temperature);
                    self.temperature = self.temperature_optim.step(s.q_lr, self.temperature.clone(), grads);
                    self.alpha = self.temperature.log_alpha.val().exp().into_scalar().elem();
                }
            }
        }
        if step.is_multiple_of(s.target_network_frequency) {
            let critics = self.critics.valid();
            let targets = std::mem::replace(&mut self.targets, critics.clone());
            self.targets = polyak_update(targets, &critics, s.tau);
        }
        losses
    }

    /// The device its networks are on.
    pub fn device(&self) -> B::Device {
        self.bounds.scale.device()
    }

    /// The observation's features.
    pub fn obs_dim(&self) -> usize {
        self.actor.obs_dim()
    }

    /// The action's dimensions.
    pub fn act_dim(&self) -> usize {
        self.bounds.scale.dims()[0]
    }

    /// Its settings.
    pub fn settings(&self) -> &SacSettings {
        &self.settings
    }

    /// The networks, targets, temperature and optimisers as checkpoint sections (serialised
    /// when called, possibly on another thread).
    pub fn snapshot(&self) -> Snapshot {
        let (actor, critics, temperature) = (self.actor.clone(), self.critics.clone(), self.temperature.clone());
        let optims = (
            self.actor_optim.clone(),
            self.critic_optim.clone(),
            self.temperature_optim.clone(),
        );
        let targets = self.targets.clone();
        Box::new(move || {
            let mut sections = module_sections::<B, _, _>(["actor", "actor_optimizer"], &actor, &optims.0);
            sections.extend(module_sections::<B, _, _>(
                ["critics", "critic_optimizer"],
                &critics,
                &optims.1,
            ));
            sections.extend(module_sections::<B, _, _>(
                ["temperature", "temperature_optimizer"],
                &temperature,
                &optims.2,
            ));
            sections.push(("targets".into(), module_bytes(&targets)));
            sections
        })
    }

    /// What [`Sac::snapshot`] wrote.
    pub fn restore(&mut self, checkpoint: &Checkpoint, device: &B::Device) -> Result<(), CheckpointError> {
        self.actor = checkpoint.load_module("actor", self.actor.clone(), device)?;
        self.actor_optim =
            checkpoint.load_optimizer::<B, GaussianActor<B>, _>("actor_optimizer", self.actor_optim.clone(), device)?;
        self.critics = checkpoint.load_module("critics", self.critics.clone(), device)?;
        self.critic_optim =
            checkpoint.load_optimizer::<B, TwinCritics<B>, _>("critic_optimizer", self.critic_optim.clone(), device)?;
        self.temperature = checkpoint.load_module("temperature", self.temperature.clone(), device)?;
        self.temperature_optim = checkpoint.load_optimizer::<B, Temperature<B>, _>(
            "temperature_optimizer",
            self.temperature_optim.clone(),
            device,
        )?;
        self.targets = checkpoint.load_module("targets", self.targets.clone(), device)?;
        if self.settings.target_entropy.is_some() {
            self.alpha = self.temperature.log_alpha.val().exp().into_scalar().elem();
        }
        Ok(())
    }

    /// Actions for `obs` without gradients: drawn from the policy with the standard normals
    /// `eps` (`[batch × act_dim]`), or with `None` the deterministic `s_a tanh(μ) + b_a`
    /// (evaluation).
    pub fn act(&self, obs: Tensor<B::InnerBackend, 2>, eps: Option<Vec<f32>>) -> Tensor<B::InnerBackend, 2> {
        let (actor, bounds) = (self.actor.valid(), self.bounds.inner());
        match eps {
            Some(eps) => sample(&actor, obs, eps, &bounds).action,
            None => bounds.squash(actor.forward(obs).0.tanh()),
        }
    }
}

/// `a ~ π(·|s)` with the given standard normals, and `log π(a|s)`.
fn sample<C: ReinBackend>(
    actor: &GaussianActor<C>,
    obs: Tensor<C, 2>,
    eps: Vec<f32>,
    bounds: &BoxTensors<C>,
) -> SquashedSample<C> {
    let (mean, raw) = actor.forward(obs);
    let eps = normals(eps, mean.dims(), &mean.device());
    squashed_gaussian(
        mean,
        bounded_log_std(raw),
        eps,
        bounds.scale.clone(),
        bounds.bias.clone(),
    )
}
