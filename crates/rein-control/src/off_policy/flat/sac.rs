//! SAC on flat networks ([`FlatSac`]): [`super::super::sac::Sac::update`]'s steps in its order
//! (the equations are in rein-optim's `soft_actor_critic.rs`), with the gradients by hand:
//!
//! ```text
//! critics      ∂L/∂Qₖ = 2 (Qₖ − y) / n
//! actor        ∂L/∂log π = α / n,   ∂L/∂Qₖ = −1/n where Qₖ is the smaller,
//!              ∂L/∂ã = Σₖ ∂L/∂Qₖ ∂Qₖ/∂ã (through each critic), then through the squashing
//! temperature  ∂L/∂log α = −exp(log α) · mean(log π + H̄)
//! ```

use std::path::Path;

use burn::module::AutodiffModule;
use rein_core::{BoxSpace, SeededRng};
use rein_model::safetensors_file::{module_tensors, write};
use rein_model::{FlatMlp, GaussianActor, ReinAutodiffBackend, Trace};
use rein_optim::{FlatAdam, squashed_gaussian_row, squashed_gaussian_row_backward};

use super::{FlatBox, Twin, flat};
use crate::flat_sections::{floats_bytes, non_finite, read_adam, read_params};
use crate::off_policy::Batch;
use crate::off_policy::learner::Learner;
use crate::off_policy::sac::{SacLosses, SacNoise, SacSettings, TwinCritics};
use rein_run::checkpoint::{Checkpoint, CheckpointError};
use rein_run::driver::Snapshot;

/// SAC's actor, critics, targets, temperature and optimisers on flat buffers.
#[derive(Debug, Clone)]
pub struct FlatSac {
    actor: FlatMlp,
    actor_adam: FlatAdam,
    actor_grads: Vec<f32>,
    critics: Twin,
    log_alpha: f32,
    alpha: f32,
    alpha_adam: FlatAdam,
    settings: SacSettings,
    bounds: FlatBox,
    obs_dim: usize,
    act_dim: usize,
    /// The actor's passes in an update, its buffers kept from one update to the next.
    trace: Trace,
}

impl FlatSac {
    /// The agent of these networks, the critics' targets `targets` or copies of them, as
    /// [`Sac::new`](crate::off_policy::sac::Sac::new) makes it.
    pub fn new<B: ReinAutodiffBackend>(
        actor: &GaussianActor<B>,
        critics: &TwinCritics<B>,
        targets: Option<&TwinCritics<B::InnerBackend>>,
        bounds: &BoxSpace,
        settings: SacSettings,
    ) -> Self {
        let actor = flat(&module_tensors(&actor.valid()));
        let obs_dim = actor.widths()[0];
        let log_alpha = settings.alpha.ln();
        Self {
            actor_adam: FlatAdam::new(actor.params().len()),
            actor_grads: vec![0.0; actor.params().len()],
            actor,
            critics: Twin::new(critics, targets),
            log_alpha,
            alpha: settings.alpha,
            alpha_adam: FlatAdam::new(1),
            settings,
            bounds: FlatBox::new(bounds),
            obs_dim,
            act_dim: bounds.dim(),
            trace: Trace::default(),
        }
    }

    /// α now.
    pub fn alpha(&self) -> f32 {
        self.alpha
    }

    /// The networks' parameters under the names the burn modules give them: `actor.…`,
    /// `critics.q1.…`, `targets.q2.…` (for comparing with them).
    pub fn tensors(&self) -> rein_model::safetensors_file::Tensors {
        let mut tensors = self.actor.to_tensors("actor.mlp.");
        for (c, name) in self.critics.0.iter().zip(["q1", "q2"]) {
            tensors.extend(c.net.to_tensors(&format!("critics.{name}.mlp.")));
            tensors.extend(c.target.to_tensors(&format!("targets.{name}.mlp.")));
        }
        tensors
    }

    /// Draws `a ~ π(·|s)` for each row of `trace`'s last forward pass with the normals `eps`:
    /// the actions and `log π(a|s)`.
    fn sample(&self, trace: &Trace, eps: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let act = self.act_dim;
        let mut actions = vec![0.0; eps.len()];
        let rows = trace.output().chunks_exact(2 * act).zip(eps.chunks_exact(act));
        let log_probs = rows
            .zip(actions.chunks_exact_mut(act))
            .map(|((out, eps), action)| {
                let (mean, raw) = out.split_at(act);
                squashed_gaussian_row(mean, raw, eps, [&self.bounds.scale, &self.bounds.bias], action)
            })
            .collect();
        (actions, log_probs)
    }

    /// The actor's forward pass on `obs` into a trace.
    fn actor_pass(&self, obs: &[f32], trace: &mut Trace) {
        let rows = obs.len() / self.obs_dim;
        trace.input(&self.actor, rows).copy_from_slice(obs);
        self.actor.forward(trace);
    }

    /// The update of CleanRL's global step `step` on `batch`.
    ///
    /// # Panics
    /// If `noise` has fewer draws than the update takes.
    pub fn update(&mut self, batch: &Batch, noise: SacNoise, step: u64) -> SacLosses {
        let s = self.settings.clone();
        let n = batch.rows as f32;
        // y = r + γ (1 − d) (min(Q̄₁, Q̄₂)(s', a') − α log π(a'|s')), a' ~ π(·|s').
        let mut trace = std::mem::take(&mut self.trace);
        self.actor_pass(&batch.next_obs, &mut trace);
        let (next_actions, next_log_probs) = self.sample(&trace, &noise.next);
        let target_min = self.critics.target_min(&batch.next_obs, &next_actions, batch.rows);
        let y: Vec<f32> = (0..batch.rows)
            .map(|i| {
                let soft_value = target_min[i] - next_log_probs[i] * self.alpha;
                batch.rewards[i] + (-batch.dones[i] + 1.0) * soft_value * s.gamma
            })
            .collect();
        let [(qf1_loss, qf1_values), (qf2_loss, _)] = self.critics.step_toward(&batch.obs, &batch.actions, &y, s.q_lr);
        let mut losses = SacLosses {
            qf1_loss,
            qf2_loss,
            qf1_values,
            actor_loss: None,
            alpha_loss: None,
        };
        if step.is_multiple_of(s.policy_frequency) {
            let (mut policy, mut temperature) = (noise.policy.into_iter(), noise.temperature.into_iter());
            for _ in 0..s.policy_frequency {
                let eps = policy.next().expect("a policy draw per actor step");
                losses.actor_loss = Some(self.actor_step(&batch.obs, &eps, &mut trace));
                if let Some(target_entropy) = s.target_entropy {
                    let eps = temperature.next().expect("a temperature draw per actor step");
                    self.actor_pass(&batch.obs, &mut trace);
                    let (_, log_probs) = self.sample(&trace, &eps);
                    // L_α = mean(−exp(log α)(log π + H̄)); ∂L_α/∂log α is L_α itself.
                    let mean = log_probs.iter().map(|l| l + target_entropy).sum::<f32>() / n;
                    let loss = -self.log_alpha.exp() * mean;
                    losses.alpha_loss = Some(loss);
                    let mut log_alpha = [self.log_alpha];
                    self.alpha_adam.step(s.q_lr, &mut log_alpha, &[loss]);
                    self.log_alpha = log_alpha[0];
                    self.alpha = self.log_alpha.exp();
                }
            }
        }
        if step.is_multiple_of(s.target_network_frequency) {
            self.critics.polyak(s.tau);
        }
        self.trace = trace;
        losses
    }

    /// One actor step on `L_π = mean(α log π(ã|s) − min(Q₁, Q₂)(s, ã))`; its loss.
    fn actor_step(&mut self, obs: &[f32], eps: &[f32], trace: &mut Trace) -> f32 {
        let (rows, act, alpha) = (obs.len() / self.obs_dim, self.act_dim, self.alpha);
        let n = rows as f32;
        self.actor_pass(obs, trace);
        let (actions, log_probs) = self.sample(trace, eps);
        let [q1, q2] = self.critics.both(|_, c| c.values(obs, &actions, rows).to_vec());
        let loss = (0..rows).map(|i| log_probs[i] * alpha - q1[i].min(q2[i])).sum::<f32>() / n;
        // The smaller critic carries the gradient (Q₁ on a tie).
        let first = |i: usize| q1[i] <= q2[i];
        let d_q = |k: usize| -> Vec<f32> {
            (0..rows)
                .map(|i| if first(i) == (k == 0) { -1.0 / n } else { 0.0 })
                .collect()
        };
        let [d1, d2] = self.critics.both(|k, c| {
            let mut d_actions = vec![0.0; rows * act];
            c.add_action_grad(&d_q(k), &mut d_actions);
            d_actions
        });
        let d_actions: Vec<f32> = d1.iter().zip(&d2).map(|(a, b)| a + b).collect();
        let out = trace.output().to_vec();
        let d_out = trace.output_grad();
        let rows = out.chunks_exact(2 * act).zip(d_out.chunks_exact_mut(2 * act));
        for (i, (out, d_out)) in rows.enumerate() {
            let ((mean, raw), (d_mean, d_raw)) = (out.split_at(act), d_out.split_at_mut(act));
            let at = i * act..(i + 1) * act;
            squashed_gaussian_row_backward(
                mean,
                raw,
                &eps[at.clone()],
                &self.bounds.scale,
                (&d_actions[at], alpha / n),
                [d_mean, d_raw],
            );
        }
        self.actor.backward(trace, Some(&mut self.actor_grads), false);
        self.actor_adam
            .step(self.settings.policy_lr, self.actor.params_mut(), &self.actor_grads);
        loss
    }
}

impl<B: ReinAutodiffBackend> Learner<B> for FlatSac {
    fn explore(&self, obs: &[f32], rng: &mut SeededRng) -> Vec<f32> {
        let eps: Vec<f32> = (0..obs.len() / self.obs_dim * self.act_dim)
            .map(|_| rng.normal() as f32)
            .collect();
        let mut trace = Trace::default();
        self.actor_pass(obs, &mut trace);
        self.sample(&trace, &eps).0
    }

    /// `s_a tanh(μ) + b_a`.
    fn deterministic(&self, obs: &[f32]) -> Vec<f32> {
        let mut trace = Trace::default();
        self.actor_pass(obs, &mut trace);
        let act = self.act_dim;
        let rows = trace.output().chunks_exact(2 * act);
        rows.flat_map(|out| (0..act).map(move |j| out[j].tanh() * self.bounds.scale[j] + self.bounds.bias[j]))
            .collect()
    }

    fn learn(&mut self, batch: &Batch, rng: &mut SeededRng, step: u64) -> Vec<(&'static str, f32)> {
        let noise = SacNoise::draw(rng, &self.settings, batch.actions.len(), step);
        let losses = self.update(batch, noise, step);
        losses.logged(self.alpha)
    }

    fn snapshot(&self) -> Snapshot {
        let agent = self.clone();
        Box::new(move || {
            let mut sections = vec![
                ("actor".into(), floats_bytes(agent.actor.params())),
                ("actor_optimizer".into(), agent.actor_adam.to_bytes()),
                ("log_alpha".into(), floats_bytes(&[agent.log_alpha])),
                ("log_alpha_optimizer".into(), agent.alpha_adam.to_bytes()),
            ];
            sections.extend(agent.critics.sections());
            sections
        })
    }

    fn restore(&mut self, checkpoint: &Checkpoint, _: &B::Device) -> Result<(), CheckpointError> {
        let mut restored = self.clone();
        read_params(checkpoint, "actor", &mut restored.actor)?;
        read_adam(checkpoint, "actor_optimizer", &mut restored.actor_adam)?;
        let bytes = checkpoint.section("log_alpha")?;
        let bytes: [u8; 4] = bytes
            .try_into()
            .map_err(|_| checkpoint.mismatch(format!("section `log_alpha` holds {} bytes, not 4", bytes.len())))?;
        restored.log_alpha = f32::from_le_bytes(bytes);
        read_adam(checkpoint, "log_alpha_optimizer", &mut restored.alpha_adam)?;
        restored.critics.restore(checkpoint)?;
        if restored.settings.target_entropy.is_some() {
            restored.alpha = restored.log_alpha.exp();
        }
        *self = restored;
        Ok(())
    }

    fn non_finite_parameter(&self) -> Option<String> {
        non_finite(&self.actor, "actor.mlp.")
            .or_else(|| self.critics.non_finite_parameter())
            .or_else(|| (!self.log_alpha.is_finite()).then(|| "temperature.log_alpha".to_string()))
    }

    fn save_policy(&self, path: &Path) -> std::io::Result<()> {
        write(path, &self.actor.to_tensors("mlp."), "pt")
    }
}

#[cfg(test)]
mod tests {
    use rein_model::{CpuAutodiff, OffPolicyConfig};

    use super::*;
    use rein_run::checkpoint::{CheckpointDir, read};

    fn agent(hidden: usize, seed: u64) -> FlatSac {
        let config = OffPolicyConfig {
            obs_dim: 3,
            act_dim: 1,
            hidden: vec![hidden, hidden],
        };
        let (device, mut rng) = (Default::default(), SeededRng::new(seed));
        let actor = config.gaussian_actor::<CpuAutodiff>(&mut rng, &device);
        let critics = TwinCritics {
            q1: config.q_network(&mut rng, &device),
            q2: config.q_network(&mut rng, &device),
        };
        let bounds = BoxSpace {
            low: vec![-2.0],
            high: vec![2.0],
        };
        let settings = SacSettings {
            gamma: 0.99,
            tau: 0.005,
            policy_lr: 3e-4,
            q_lr: 1e-3,
            policy_frequency: 2,
            target_network_frequency: 1,
            target_entropy: Some(-1.0),
            alpha: 1.0,
        };
        FlatSac::new(&actor, &critics, None, &bounds, settings)
    }

    /// A checkpoint of a trained agent restores it exactly into a fresh one; one of networks of
    /// another size is refused by section, leaving the agent as it was.
    #[test]
    fn checkpoints_restore_exactly_and_refuse_other_sizes() {
        let mut trained = agent(8, 1);
        let mut rng = SeededRng::new(2);
        let normals = |rng: &mut SeededRng, n: usize| (0..n).map(|_| rng.normal() as f32).collect::<Vec<f32>>();
        let batch = Batch {
            rows: 16,
            obs: normals(&mut rng, 48),
            actions: normals(&mut rng, 16),
            rewards: normals(&mut rng, 16),
            next_obs: normals(&mut rng, 48),
            dones: vec![0.0; 16],
        };
        for step in 1..=4 {
            let noise = SacNoise::draw(&mut rng, &trained.settings, 16, step);
            trained.update(&batch, noise, step);
        }
        let sections = <FlatSac as Learner<CpuAutodiff>>::snapshot(&trained)();
        let dir = std::env::temp_dir().join(format!("rein-flat-sac-{}", std::process::id()));
        let borrowed: Vec<(&str, &[u8])> = sections.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
        let path = CheckpointDir::of_run(&dir).save(4, &borrowed).unwrap();
        let checkpoint = read(&path).unwrap();

        let mut fresh = agent(8, 3);
        Learner::<CpuAutodiff>::restore(&mut fresh, &checkpoint, &Default::default()).unwrap();
        assert_eq!(fresh.tensors(), trained.tensors());
        assert_eq!(
            (fresh.alpha, fresh.actor_adam.clone()),
            (trained.alpha, trained.actor_adam.clone())
        );

        let mut other = agent(16, 3);
        let before = other.tensors();
        let error = Learner::<CpuAutodiff>::restore(&mut other, &checkpoint, &Default::default()).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("section `actor` holds 488 bytes; the network has 370 parameters (1480 bytes)"),
            "{error}"
        );
        assert_eq!(other.tensors(), before);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
