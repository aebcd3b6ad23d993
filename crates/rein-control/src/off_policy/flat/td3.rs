//! TD3 on flat networks ([`FlatTd3`]): [`super::super::td3::Td3::update`]'s steps in its order
//! (the equations are in rein-optim's `td3.rs`), with the gradients by hand:
//!
//! ```text
//! critics  ∂L/∂Qₖ = 2 (Qₖ − y) / n
//! actor    L_μ = −mean(Q₁(s, μ(s))):  ∂L/∂Q₁ = −1/n,  ∂L/∂μ through Q₁,
//!          μ = s_a tanh(o) + b_a:  ∂L/∂o = ∂L/∂μ · s_a (1 − tanh²(o))
//! ```

use std::path::Path;

use burn::module::AutodiffModule;
use rein_core::{BoxSpace, SeededRng};
use rein_model::safetensors_file::{module_tensors, write};
use rein_model::{DeterministicActor, FlatMlp, ReinAutodiffBackend, Trace};
use rein_optim::FlatAdam;

use super::{Critic, FlatBox, Twin, flat, polyak};
use crate::flat_sections::{floats_bytes, non_finite, read_adam, read_params};
use crate::off_policy::Batch;
use crate::off_policy::learner::Learner;
use crate::off_policy::sac::TwinCritics;
use crate::off_policy::td3::{Td3Losses, Td3Settings};
use rein_run::checkpoint::{Checkpoint, CheckpointError};
use rein_run::driver::Snapshot;

/// TD3's actor, critics, targets and optimisers on flat buffers.
#[derive(Debug, Clone)]
pub struct FlatTd3 {
    actor: FlatMlp,
    target_actor: FlatMlp,
    actor_adam: FlatAdam,
    actor_grads: Vec<f32>,
    critics: Twin,
    settings: Td3Settings,
    bounds: FlatBox,
    act_dim: usize,
    /// The actors' passes in an update, their buffers kept from one update to the next.
    trace: Trace,
}

impl FlatTd3 {
    /// The agent of these networks, the targets given or copies, as
    /// [`Td3::new`](crate::off_policy::td3::Td3::new) makes it.
    pub fn new<B: ReinAutodiffBackend>(
        (actor, target_actor): (&DeterministicActor<B>, Option<&DeterministicActor<B::InnerBackend>>),
        critics: &TwinCritics<B>,
        targets: Option<&TwinCritics<B::InnerBackend>>,
        bounds: &BoxSpace,
        settings: Td3Settings,
    ) -> Self {
        let actor = flat(&module_tensors(&actor.valid()));
        Self {
            target_actor: target_actor.map_or_else(|| actor.clone(), |t| flat(&module_tensors(t))),
            actor_adam: FlatAdam::new(actor.params().len()),
            actor_grads: vec![0.0; actor.params().len()],
            actor,
            critics: Twin::new(critics, targets),
            settings,
            bounds: FlatBox::new(bounds),
            act_dim: bounds.dim(),
            trace: Trace::default(),
        }
    }

    /// The networks' parameters under the names the burn modules give them: `actor.…`,
    /// `target_actor.…`, `critics.q1.…`, `targets.q2.…`.
    pub fn tensors(&self) -> rein_model::safetensors_file::Tensors {
        let mut tensors = self.actor.to_tensors("actor.mlp.");
        tensors.extend(self.target_actor.to_tensors("target_actor.mlp."));
        for (c, name) in self.critics.0.iter().zip(["q1", "q2"]) {
            tensors.extend(c.net.to_tensors(&format!("critics.{name}.mlp.")));
            tensors.extend(c.target.to_tensors(&format!("targets.{name}.mlp.")));
        }
        tensors
    }

    /// The update of CleanRL's global step `step` on `batch`, the target smoothed by `noise`.
    pub fn update(&mut self, batch: &Batch, noise: &[f32], step: u64) -> Td3Losses {
        let s = self.settings.clone();
        let mut trace = std::mem::take(&mut self.trace);
        // a' = clip(μ̄(s') + s_a · clip(σ̃ ε, −c, c), low, high);  y = r + γ (1 − d) min(Q̄₁, Q̄₂)(s', a').
        let mut next_actions = policy(&self.target_actor, &self.bounds, &batch.next_obs, &mut trace);
        let b = &self.bounds;
        for (i, a) in next_actions.iter_mut().enumerate() {
            let j = i % self.act_dim;
            let shifted = *a + (noise[i] * s.policy_noise).clamp(-s.noise_clip, s.noise_clip) * b.scale[j];
            *a = shifted.max(b.low[j]).min(b.high[j]);
        }
        let target_min = self.critics.target_min(&batch.next_obs, &next_actions, batch.rows);
        let y: Vec<f32> = (0..batch.rows)
            .map(|i| batch.rewards[i] + (-batch.dones[i] + 1.0) * target_min[i] * s.gamma)
            .collect();
        // The actor step reads Q₁ only: it follows Q₁'s step on one thread while Q₂ steps on the
        // other (the same operations in the same order as one after the other).
        let update_actor = step.is_multiple_of(s.policy_frequency);
        let [q1, q2] = &mut self.critics.0;
        let actor = ActorStep {
            net: &mut self.actor,
            adam: &mut self.actor_adam,
            grads: &mut self.actor_grads,
            bounds: &self.bounds,
            lr: s.learning_rate,
        };
        let step_toward = |q: &mut Critic| {
            q.values(&batch.obs, &batch.actions, batch.rows);
            q.step_toward(&y, s.learning_rate)
        };
        let (((qf1_loss, qf1_values), actor_loss), (qf2_loss, _)) = rein_kernels::team::join(
            || {
                let first = step_toward(q1);
                (first, update_actor.then(|| actor.run(q1, &batch.obs, &mut trace)))
            },
            || step_toward(q2),
        );
        let losses = Td3Losses {
            qf1_loss,
            qf2_loss,
            qf1_values,
            actor_loss,
        };
        if update_actor {
            polyak(&mut self.target_actor, &self.actor, s.tau);
            self.critics.polyak(s.tau);
        }
        self.trace = trace;
        losses
    }
}

/// `μ(s) = s_a tanh(o) + b_a` of `net` for each row of `obs`, with the trace of `o`.
fn policy(net: &FlatMlp, bounds: &FlatBox, obs: &[f32], trace: &mut Trace) -> Vec<f32> {
    trace.input(net, obs.len() / net.widths()[0]).copy_from_slice(obs);
    net.forward(trace);
    let (scale, bias) = (&bounds.scale, &bounds.bias);
    let rows = trace.output().chunks_exact(scale.len());
    rows.flat_map(|o| o.iter().zip(scale).zip(bias).map(|((o, s), b)| o.tanh() * s + b))
        .collect()
}

/// What an actor step changes, and how.
struct ActorStep<'a> {
    net: &'a mut FlatMlp,
    adam: &'a mut FlatAdam,
    grads: &'a mut Vec<f32>,
    bounds: &'a FlatBox,
    lr: f64,
}

impl ActorStep<'_> {
    /// One actor step on `−mean(Q₁(s, μ(s)))` through `q1`; its loss.
    fn run(self, q1: &mut Critic, obs: &[f32], trace: &mut Trace) -> f32 {
        let act = self.bounds.scale.len();
        let rows = obs.len() / self.net.widths()[0];
        let n = rows as f32;
        let actions = policy(self.net, self.bounds, obs, trace);
        let loss = -(q1.values(obs, &actions, rows).iter().sum::<f32>() / n);
        let mut d_actions = vec![0.0; rows * act];
        q1.add_action_grad(&vec![-1.0 / n; rows], &mut d_actions);
        let out = trace.output().to_vec();
        let scale = &self.bounds.scale;
        for (i, ((d, o), d_a)) in trace.output_grad().iter_mut().zip(&out).zip(&d_actions).enumerate() {
            let t = o.tanh();
            *d = d_a * scale[i % act] * (1.0 - t * t);
        }
        self.net.backward(trace, Some(self.grads), false);
        self.adam.step(self.lr, self.net.params_mut(), self.grads);
        loss
    }
}

impl<B: ReinAutodiffBackend> Learner<B> for FlatTd3 {
    /// `clip(μ(s) + s_a σ_e ε, low, high)`.
    fn explore(&self, obs: &[f32], rng: &mut SeededRng) -> Vec<f32> {
        let mut actions = policy(&self.actor, &self.bounds, obs, &mut Trace::default());
        let (b, sigma) = (&self.bounds, self.settings.exploration_noise);
        for (i, a) in actions.iter_mut().enumerate() {
            let j = i % self.act_dim;
            let noise = rng.normal() as f32 * (b.scale[j] * sigma);
            *a = (*a + noise).max(b.low[j]).min(b.high[j]);
        }
        actions
    }

    fn deterministic(&self, obs: &[f32]) -> Vec<f32> {
        policy(&self.actor, &self.bounds, obs, &mut Trace::default())
    }

    fn learn(&mut self, batch: &Batch, rng: &mut SeededRng, step: u64) -> Vec<(&'static str, f32)> {
        let noise: Vec<f32> = (0..batch.actions.len()).map(|_| rng.normal() as f32).collect();
        let losses = self.update(batch, &noise, step);
        losses.logged()
    }

    fn snapshot(&self) -> Snapshot {
        let agent = self.clone();
        Box::new(move || {
            let mut sections = vec![
                ("actor".into(), floats_bytes(agent.actor.params())),
                ("actor_optimizer".into(), agent.actor_adam.to_bytes()),
                ("target_actor".into(), floats_bytes(agent.target_actor.params())),
            ];
            sections.extend(agent.critics.sections());
            sections
        })
    }

    fn restore(&mut self, checkpoint: &Checkpoint, _: &B::Device) -> Result<(), CheckpointError> {
        let mut restored = self.clone();
        read_params(checkpoint, "actor", &mut restored.actor)?;
        read_adam(checkpoint, "actor_optimizer", &mut restored.actor_adam)?;
        read_params(checkpoint, "target_actor", &mut restored.target_actor)?;
        restored.critics.restore(checkpoint)?;
        *self = restored;
        Ok(())
    }

    fn non_finite_parameter(&self) -> Option<String> {
        non_finite(&self.actor, "actor.mlp.").or_else(|| self.critics.non_finite_parameter())
    }

    fn save_policy(&self, path: &Path) -> std::io::Result<()> {
        write(path, &self.actor.to_tensors("mlp."), "pt")
    }
}
