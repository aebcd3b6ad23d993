//! One TD3 update in CleanRL's order (`td3_continuous_action.py`, the body of its training
//! step): the twin critics' step toward the clipped double-Q target of the smoothed target
//! action, then — every `policy_frequency` steps — one actor step and the Polyak averaging of
//! the target actor and critics. The equations are in rein-optim's `td3.rs`.

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, GradientsParams, Optimizer};
use burn::tensor::{ElementConversion, Tensor};
use rein_model::{DeterministicActor, ReinAutodiffBackend};
use rein_optim::{
    clipped_double_q_target, deterministic_actor_loss, polyak_update, smoothed_target_actions, twin_critic_loss,
};

use super::sac::TwinCritics;
use rein_core::BoxSpace;

use super::{BoxTensors, Transitions, normals, torch_adam};
use rein_run::checkpoint::{Checkpoint, CheckpointError, module_bytes, module_sections};
use rein_run::driver::Snapshot;

/// TD3's settings (CleanRL's names and defaults in the recipe).
#[derive(Debug, Clone, PartialEq)]
pub struct Td3Settings {
    /// γ.
    pub gamma: f32,
    /// τ, the targets' Polyak coefficient.
    pub tau: f64,
    /// The actor's and critics' learning rate.
    pub learning_rate: f64,
    /// σ̃, the target smoothing noise's scale (in units of the action box's half-width).
    pub policy_noise: f32,
    /// c, where the smoothing noise is clipped.
    pub noise_clip: f32,
    /// Every this many steps, one actor step and the targets' averaging.
    pub policy_frequency: u64,
    /// σ_e, the exploration noise [`Td3::act`] adds (in half-widths of the action box).
    pub exploration_noise: f32,
}

/// What an update measured (CleanRL's logged losses).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Td3Losses {
    /// `mean((Q₁ − y)²)`.
    pub qf1_loss: f32,
    /// `mean((Q₂ − y)²)`.
    pub qf2_loss: f32,
    /// `mean(Q₁(s, a))`.
    pub qf1_values: f32,
    /// The actor's loss, when it stepped.
    pub actor_loss: Option<f32>,
}

impl Td3Losses {
    /// The losses by metric name (CleanRL's).
    pub fn logged(&self) -> Vec<(&'static str, f32)> {
        let mut logged = vec![
            ("losses/qf1_loss", self.qf1_loss),
            ("losses/qf2_loss", self.qf2_loss),
            ("losses/qf1_values", self.qf1_values),
        ];
        logged.extend(self.actor_loss.map(|l| ("losses/actor_loss", l)));
        logged
    }
}

/// TD3's networks, targets and optimisers.
pub struct Td3<B: ReinAutodiffBackend> {
    /// The policy `μ`.
    pub actor: DeterministicActor<B>,
    /// `μ̄` (no gradients).
    pub target_actor: DeterministicActor<B::InnerBackend>,
    /// `Q₁`, `Q₂`.
    pub critics: TwinCritics<B>,
    /// `Q̄₁`, `Q̄₂` (no gradients).
    pub targets: TwinCritics<B::InnerBackend>,
    actor_optim: OptimizerAdaptor<Adam, DeterministicActor<B>, B>,
    critic_optim: OptimizerAdaptor<Adam, TwinCritics<B>, B>,
    settings: Td3Settings,
    bounds: BoxTensors<B>,
}

impl<B: ReinAutodiffBackend> Td3<B> {
    /// An agent from its networks; the targets start as copies (CleanRL's `load_state_dict`)
    /// unless given.
    pub fn new(
        actor: DeterministicActor<B>,
        critics: TwinCritics<B>,
        target_actor: Option<DeterministicActor<B::InnerBackend>>,
        targets: Option<TwinCritics<B::InnerBackend>>,
        bounds: &BoxSpace,
        settings: Td3Settings,
        device: &B::Device,
    ) -> Self {
        let target_actor = target_actor.unwrap_or_else(|| actor.valid());
        let targets = targets.unwrap_or_else(|| critics.valid());
        Self {
            actor,
            target_actor,
            critics,
            targets,
            actor_optim: torch_adam().init(),
            critic_optim: torch_adam().init(),
            settings,
            bounds: BoxTensors::new(bounds, device),
        }
    }

    /// The critics' loss toward `y` with the target action smoothed by `noise` (standard
    /// normals, `[batch × act_dim]`): `(L_Q, L_Q₁, L_Q₂, mean Q₁)`.
    pub fn critic_loss(
        &self,
        batch: &Transitions<B>,
        noise: Vec<f32>,
    ) -> (Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>, f32) {
        let s = &self.settings;
        let next_obs = batch.next_obs.clone().inner();
        let b = self.bounds.inner();
        let target_actions = self
            .target_actor
            .forward(next_obs.clone(), b.scale.clone(), b.bias.clone());
        let noise = normals(noise, target_actions.dims(), &next_obs.device());
        let next_actions = smoothed_target_actions(
            target_actions,
            noise,
            s.policy_noise,
            s.noise_clip,
            b.scale,
            b.low,
            b.high,
        );
        let (target_q1, target_q2) = self.targets.forward(next_obs, next_actions);
        let y = clipped_double_q_target(
            batch.rewards.clone().inner(),
            batch.dones.clone().inner(),
            s.gamma,
            target_q1,
            target_q2,
        );
        let (q1, q2) = self.critics.forward(batch.obs.clone(), batch.actions.clone());
        let qf1_values = q1.clone().mean().into_scalar().elem();
        let (loss, l1, l2) = twin_critic_loss(q1, q2, Tensor::from_inner(y));
        (loss, l1, l2, qf1_values)
    }

    /// The actor's loss `−mean(Q₁(s, μ(s)))`.
    pub fn actor_loss(&self, obs: Tensor<B, 2>) -> Tensor<B, 1> {
        let b = &self.bounds;
        let actions = self.actor.forward(obs.clone(), b.scale.clone(), b.bias.clone());
        deterministic_actor_loss(self.critics.q1.forward(obs, actions))
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
    pub fn settings(&self) -> &Td3Settings {
        &self.settings
    }

    /// The networks, targets and optimisers as checkpoint sections (serialised when called,
    /// possibly on another thread).
    pub fn snapshot(&self) -> Snapshot {
        let (actor, critics) = (self.actor.clone(), self.critics.clone());
        let (actor_optim, critic_optim) = (self.actor_optim.clone(), self.critic_optim.clone());
        let (target_actor, targets) = (self.target_actor.clone(), self.targets.clone());
        Box::new(move || {
            let mut sections = module_sections::<B, _, _>(["actor", "actor_optimizer"], &actor, &actor_optim);
            sections.extend(module_sections::<B, _, _>(
                ["critics", "critic_optimizer"],
                &critics,
                &critic_optim,
            ));
            sections.push(("target_actor".into(), module_bytes(&target_actor)));
            sections.push(("targets".into(), module_bytes(&targets)));
            sections
        })
    }

    /// What [`Td3::snapshot`] wrote.
    pub fn restore(&mut self, checkpoint: &Checkpoint, device: &B::Device) -> Result<(), CheckpointError> {
        self.actor = checkpoint.load_module("actor", self.actor.clone(), device)?;
        self.actor_optim = checkpoint.load_optimizer::<B, DeterministicActor<B>, _>(
            "actor_optimizer",
            self.actor_optim.clone(),
            device,
        )?;
        self.critics = checkpoint.load_module("critics", self.critics.clone(), device)?;
        self.critic_optim =
            checkpoint.load_optimizer::<B, TwinCritics<B>, _>("critic_optimizer", self.critic_optim.clone(), device)?;
        self.target_actor = checkpoint.load_module("target_actor", self.target_actor.clone(), device)?;
        self.targets = checkpoint.load_module("targets", self.targets.clone(), device)?;
        Ok(())
    }

    /// Actions for `obs` without gradients: `μ(s)`, with `noise` (standard normals,
    /// `[batch × act_dim]`) the exploration `μ(s) + s_a σ_e ε` clipped to the box (CleanRL's
    /// `exploration_noise` σ_e).
    pub fn act(&self, obs: Tensor<B::InnerBackend, 2>, noise: Option<Vec<f32>>) -> Tensor<B::InnerBackend, 2> {
        let device = obs.device();
        let b = self.bounds.inner();
        let actions = self.actor.valid().forward(obs, b.scale.clone(), b.bias.clone());
        let (Some(noise), sigma) = (noise, self.settings.exploration_noise) else {
            return actions;
        };
        let [rows, cols] = actions.dims();
        let noise = normals(noise, [rows, cols], &device) * (b.scale * sigma).unsqueeze::<2>();
        let low = b.low.unsqueeze::<2>().expand([rows, cols]);
        let high = b.high.unsqueeze::<2>().expand([rows, cols]);
        (actions + noise).max_pair(low).min_pair(high)
    }

    /// The update of CleanRL's global step `step` on `batch`, the target smoothed by `noise`.
    pub fn update(&mut self, batch: &Transitions<B>, noise: Vec<f32>, step: u64) -> Td3Losses {
        let s = self.settings.clone();
        // One autodiff graph at a time in the process, as every trainer's step.
        let _graph = rein_model::one_graph();
        let (loss, l1, l2, qf1_values) = self.critic_loss(batch, noise);
        let grads = GradientsParams::from_grads(loss.backward(), &self.critics);
        self.critics = self.critic_optim.step(s.learning_rate, self.critics.clone(), grads);
        let mut losses = Td3Losses {
            qf1_loss: l1.into_scalar().elem(),
            qf2_loss: l2.into_scalar().elem(),
            qf1_values,
            actor_loss: None,
        };
        if step.is_multiple_of(s.policy_frequency) {
            let loss = self.actor_loss(batch.obs.clone());
            losses.actor_loss = Some(loss.clone().into_scalar().elem());
            let grads = GradientsParams::from_grads(loss.backward(), &self.actor);
            self.actor = self.actor_optim.step(s.learning_rate, self.actor.clone(), grads);
            let (actor, critics) = (self.actor.valid(), self.critics.valid());
            let target_actor = std::mem::replace(&mut self.target_actor, actor.clone());
            self.target_actor = polyak_update(target_actor, &actor, s.tau);
            let targets = std::mem::replace(&mut self.targets, critics.clone());
            self.targets = polyak_update(targets, &critics, s.tau);
        }
        losses
    }
}
