//! SAC and TD3 on a vector of environment plugins, in CleanRL's order: at each vector step
//! (CleanRL's `global_step`) act — uniformly at random until `learning_starts` environment
//! steps, then the agent's exploration — step the environments, store the transitions (an
//! episode's final observation where it ended), and once past `learning_starts` make one
//! update on a batch sampled from the replay buffer. One [`Driver`](rein_run::driver::Driver)
//! step is `log_every` vector steps: its metrics record carries the last update's losses.
//!
//! A checkpoint holds the networks, targets and optimisers, the replay buffer, the loop's
//! state and every action sent, so a resumed run replays the environments
//! ([`crate::environments::replay`]) and continues exactly as the uninterrupted one.

use rein_core::{BatchActions, BoxSpace, FailureCounts, SeededRng, Space};
use rein_model::{OffPolicyConfig, ReinAutodiffBackend};
use rein_recipe::{OffPolicyAlgorithm, OffPolicyRecipe, Recipe};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::build::agent;
use super::learner::Learner;
use super::replay_buffer::ReplayBuffer;
use crate::ControlError;
use crate::environments::EnvFactory;
use crate::environments::episodes::EpisodeReturns;
use crate::environments::replay::RecordedEnvs;
use rein_run::checkpoint::Checkpoint;
use rein_run::driver::{Snapshot, Step, Trainer};
use rein_run::watchdog::Phases;

/// What the loop carries besides the agent and the buffer (a checkpoint's `state` section).
#[derive(Clone, Serialize, Deserialize)]
pub(super) struct LoopState {
    /// Vector steps taken (CleanRL's `global_step`).
    pub(super) vector_steps: u64,
    /// Environment steps taken (all envs).
    pub(super) env_steps: u64,
    /// Updates made.
    pub(super) updates: u64,
    /// Exploration, batches and every update's draws.
    rng: SeededRng,
    pub(super) episodes: EpisodeReturns,
    /// When the mean return reached the target: (env steps, seconds).
    pub(super) solved_at: Option<(u64, f64)>,
}

/// An off-policy learner, its environments and its replay buffer.
pub struct OffPolicy<'a, B: ReinAutodiffBackend> {
    recipe: &'a Recipe,
    algorithm: OffPolicyAlgorithm<'a>,
    /// The environments, where they are, and the actions sent.
    envs: RecordedEnvs,
    bounds: BoxSpace,
    obs_dim: usize,
    num_envs: usize,
    /// Vector steps in the whole run.
    total_vector_steps: u64,
    pub(super) agent: Box<dyn Learner<B>>,
    buffer: ReplayBuffer,
    pub(super) state: LoopState,
    device: B::Device,
}

impl<'a, B: ReinAutodiffBackend> OffPolicy<'a, B> {
    /// Seeding → envs (their actions must be a bounded box) → agent → replay buffer. With
    /// `log_actions`, every action sent is kept for checkpoints.
    pub fn new(
        plan: OffPolicyRecipe<'a>,
        make_env: &EnvFactory<'_>,
        device: &B::Device,
        log_actions: bool,
    ) -> Result<Self, ControlError> {
        let OffPolicyRecipe { recipe, algorithm, env } = plan;
        let name = algorithm.name();
        let unsupported = |message: String| ControlError::Environment {
            plugin: env.plugin.clone(),
            message,
        };
        let envs = make_env(env.num_envs)?;
        let spec = envs.spec().clone();
        let obs_dim = match &spec.observation {
            Space::Box(b) => b.dim(),
            other => return Err(unsupported(format!("{name} needs box observations, not {other:?}"))),
        };
        let bounds = match &spec.action {
            Space::Box(b) if b.low.iter().chain(&b.high).all(|x| x.is_finite()) => b.clone(),
            Space::Box(_) => {
                return Err(unsupported(format!(
                    "{name} squashes its actions into the action box, whose bounds must be finite"
                )));
            }
            other => {
                return Err(unsupported(format!(
                    "{name} needs continuous (box) actions; this environment's action space is {other:?} \
                     (use `algorithm.name = \"ppo\"` for discrete actions)"
                )));
            }
        };
        let act_dim = bounds.dim();
        let buffer = ReplayBuffer::new(
            algorithm.buffer_size(),
            obs_dim,
            act_dim,
            rein_run::memory::available_bytes(),
        )
        .map_err(|e| {
            ControlError::Unsupported(format!("`algorithm.buffer_size` = {}: {e}", algorithm.buffer_size()))
        })?;
        let mut rng = SeededRng::new(recipe.seed);
        let config = OffPolicyConfig {
            obs_dim,
            act_dim,
            hidden: recipe.model.hidden.clone(),
        };
        let flat = recipe.flat_networks();
        let agent = agent::<B>(algorithm, &config, &bounds, flat, &mut rng.fork(), device);
        let num_envs = env.num_envs;
        Ok(Self {
            recipe,
            algorithm,
            envs: RecordedEnvs::new(env.plugin.clone(), envs, recipe.seed, log_actions)?,
            bounds,
            obs_dim,
            num_envs,
            total_vector_steps: recipe.train.total_steps.div_ceil(num_envs as u64).max(1),
            agent,
            buffer,
            state: LoopState {
                vector_steps: 0,
                env_steps: 0,
                updates: 0,
                rng,
                episodes: EpisodeReturns::new(num_envs, recipe.train.return_window),
                solved_at: None,
            },
            device: device.clone(),
        })
    }

    /// One vector step and, past `learning_starts`, one update; the update's logged losses.
    fn vector_step(&mut self, step: usize, phases: &Phases) -> Result<Vec<(&'static str, f32)>, ControlError> {
        let global_step = self.state.vector_steps;
        let taken = global_step * self.num_envs as u64;
        let inference = phases.enter("inference", "choosing actions");
        let obs = std::mem::take(&mut self.envs.next_obs);
        let actions = match taken < self.algorithm.learning_starts() {
            true => self.random_actions(),
            false => self.agent.explore(&obs, &mut self.state.rng),
        };
        let batch = BatchActions::Continuous(actions.clone());
        self.envs.log(&batch);
        drop(inference);

        let env_phase = phases.enter("env", format!("`{}` stepping {} envs", self.envs.plugin, self.num_envs));
        let outcome = self.envs.envs.step(&batch)?;
        drop(env_phase);

        let inference = phases.enter("inference", "storing the transitions");
        let s = &mut self.state;
        s.episodes
            .record(&outcome.rewards, &outcome.terminated, &outcome.truncated);
        let mut real_next = outcome.observations.clone();
        for (i, last) in outcome.final_observations(self.obs_dim) {
            real_next[i * self.obs_dim..(i + 1) * self.obs_dim].copy_from_slice(last);
        }
        let rewards: Vec<f32> = outcome.rewards.iter().map(|&r| r as f32).collect();
        self.buffer
            .push(&obs, &actions, &rewards, &real_next, &outcome.terminated);
        self.envs.next_obs = outcome.observations;
        s.vector_steps += 1;
        s.env_steps += self.num_envs as u64;
        if let (Some(target), Some(mean), None) =
            (self.recipe.train.stop_at_return, s.episodes.mean_return(), s.solved_at)
            && mean >= target
        {
            s.solved_at = Some((s.env_steps, phases.elapsed().as_secs_f64()));
        }
        drop(inference);

        if taken <= self.algorithm.learning_starts() {
            return Ok(Vec::new());
        }
        let _update = phases.enter("backward", "an update: losses, gradients, optimiser steps");
        let indices = self
            .buffer
            .sample_indices(&mut self.state.rng, self.algorithm.batch_size());
        let batch = self.buffer.gather(&indices);
        let losses = self.agent.learn(&batch, &mut self.state.rng, global_step);
        for &(name, value) in &losses {
            rein_run::RunError::check_loss(step, name, value)?;
        }
        self.state.updates += 1;
        Ok(losses)
    }

    /// Uniform draws from the action box (CleanRL's `envs.action_space.sample()`).
    fn random_actions(&mut self) -> Vec<f32> {
        let (low, high) = (&self.bounds.low, &self.bounds.high);
        let rng = &mut self.state.rng;
        (0..self.num_envs)
            .flat_map(|_| {
                low.iter()
                    .zip(high)
                    .map(|(l, h)| l + (h - l) * rng.uniform() as f32)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The deterministic policy's actions for `obs` (`n` envs).
    pub(super) fn deterministic(&self, obs: Vec<f32>) -> BatchActions {
        BatchActions::Continuous(self.agent.deterministic(&obs))
    }

    /// The metrics record and progress line after driver step `step`.
    fn log(&self, step: usize, losses: &[(&'static str, f32)], phases: &Phases) -> Step {
        let s = &self.state;
        let elapsed = phases.elapsed().as_secs_f64();
        let sps = s.env_steps as f64 / elapsed.max(1e-9);
        let mean_return = s.episodes.mean_return();
        let mut record = json!({
            "global_step": s.env_steps,
            "charts/episodic_return": mean_return,
            "charts/episodes": s.episodes.completed,
            "charts/updates": s.updates,
            "charts/sps": sps,
        });
        for &(name, value) in losses {
            record[name] = json!(value);
        }
        let shown = mean_return.map_or("-".to_string(), |r| format!("{r:.1}"));
        let mut progress = format!(
            "{} step {step}/{} | steps {} | {sps:.0} steps/s | return {shown} | episodes {}",
            self.algorithm.name().to_lowercase(),
            self.total_steps(),
            s.env_steps,
            s.episodes.completed
        );
        if let Some((at, _)) = s.solved_at {
            let target = self.recipe.train.stop_at_return.unwrap_or_default();
            progress += &format!("\nreached return {shown} ≥ {target} at step {at}");
        }
        Step {
            record: record.as_object().cloned().unwrap_or_default(),
            done: s.solved_at.is_some(),
            progress,
        }
    }
}

impl<B: ReinAutodiffBackend> Trainer for OffPolicy<'_, B> {
    type Error = ControlError;

    fn total_steps(&self) -> usize {
        self.total_vector_steps.div_ceil(self.algorithm.log_every() as u64) as usize
    }

    /// `log_every` vector steps (fewer when the run ends or reaches its target first).
    fn step(&mut self, step: usize, phases: &Phases) -> Result<Step, ControlError> {
        let end = (step as u64 * self.algorithm.log_every() as u64).min(self.total_vector_steps);
        // Each loss as the last update that computed it left it (the actor's is not computed
        // on every update).
        let mut last_losses: Vec<(&'static str, f32)> = Vec::new();
        while self.state.vector_steps < end && self.state.solved_at.is_none() {
            for (name, value) in self.vector_step(step, phases)? {
                match last_losses.iter_mut().find(|(n, _)| *n == name) {
                    Some(entry) => entry.1 = value,
                    None => last_losses.push((name, value)),
                }
            }
        }
        Ok(self.log(step, &last_losses, phases))
    }

    fn snapshot(&self) -> Snapshot {
        let agent = self.agent.snapshot();
        let state = serde_json::to_vec(&self.state).expect("the loop state serialises");
        let buffer = self.buffer.to_bytes();
        let envs = self.envs.sections();
        Box::new(move || {
            let mut sections = agent();
            sections.push(("state".into(), state));
            sections.push(("replay_buffer".into(), buffer));
            sections.extend(envs);
            sections
        })
    }

    fn restore(&mut self, checkpoint: &Checkpoint) -> Result<(), ControlError> {
        self.state = checkpoint.state()?;
        self.agent.restore(checkpoint, &self.device)?;
        if !self.buffer.read_bytes(checkpoint.section("replay_buffer")?) {
            let (capacity, obs_dim, act_dim) = (self.algorithm.buffer_size(), self.obs_dim, self.bounds.dim());
            return Err(rein_run::RunError::Resume {
                run: checkpoint.path.clone(),
                message: format!(
                    "its replay buffer is not one of {capacity} transitions of {obs_dim} observation and \
                     {act_dim} action values"
                ),
            }
            .into());
        }
        self.envs.restore(checkpoint)
    }

    fn non_finite_parameter(&self) -> Option<String> {
        self.agent.non_finite_parameter()
    }

    fn plugin_failures(&self) -> Vec<(String, FailureCounts)> {
        self.envs.failures()
    }
}
