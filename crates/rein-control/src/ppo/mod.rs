//! PPO on a vector of environment plugins, in CleanRL's order (`ppo.py` for discrete actions,
//! `ppo_continuous_action.py` for continuous ones): rollout → GAE → epochs of shuffled
//! minibatches (clipped surrogate, value and entropy losses) → log. One update is one step of
//! the [`Driver`](rein_run::driver::Driver), which does the rest (checkpoints, metrics, progress).
//!
//! Implementation details followed (Huang et al., "The 37 implementation details of PPO"):
//! vectorised envs with same-step auto-reset, orthogonal init, Adam ε = 1e-5, linear LR
//! annealing, GAE, minibatch shuffling, per-minibatch advantage normalisation, clipped
//! surrogate, clipped value loss, entropy bonus, global gradient clipping, optional target-KL
//! early stop; for continuous actions a state-independent log-std, action clipping to the
//! bounds (log-probabilities use the unclipped action), optional observation normalisation and
//! reward scaling. One departure: truncated episodes bootstrap from the value of their final
//! observation (CleanRL treats truncation as termination).
//!
//! The actor-critic is a [`Learner`]: on the CPU by default two flat MLPs with the loss's
//! gradient by hand (`flat.rs`), with `model.autodiff = true` (and on a GPU) the burn module
//! through burn's autodiff (`learner.rs`); the two take the same steps up to rounding.

mod flat;
mod learner;
mod policy;
mod rollout;
mod run;

use rein_core::{FailureCounts, Space};
use rein_model::{ActionHead, ActorCritic, ActorCriticConfig, ReinAutodiffBackend};
use rein_optim::{LinearSchedule, PpoLossConfig, RewardScaler, RunningMeanStd, explained_variance, gae};
use rein_recipe::{PpoRecipe, PpoSection, Recipe};
use rein_sampler::SeededRng;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::ControlError;
use crate::environments::EnvFactory;
use crate::environments::episodes::EpisodeReturns;
use crate::environments::replay::RecordedEnvs;
use flat::FlatLearner;
use learner::{BurnLearner, Learner};
use policy::act;
use rein_run::checkpoint::Checkpoint;
use rein_run::driver::{Snapshot, Step, Trainer};
use rein_run::watchdog::Phases;
use rollout::{LossStats, Rollout};
pub use run::train;

/// What a PPO update carries to the next besides the model and optimiser (a checkpoint's
/// `state` section).
#[derive(Clone, Serialize, Deserialize)]
struct PpoState {
    env_steps: u64,
    rng: SeededRng,
    shuffle_rng: SeededRng,
    obs_stats: Option<RunningMeanStd>,
    reward_scaler: Option<RewardScaler>,
    episodes: EpisodeReturns,
    /// When the mean return reached the target: (env steps, seconds).
    solved_at: Option<(u64, f64)>,
}

/// PPO's agent, optimiser, environments and rollout storage.
pub struct Ppo<'a> {
    recipe: &'a Recipe,
    ppo: &'a PpoSection,
    /// The environments, where they are, and the actions sent.
    envs: RecordedEnvs,
    head: ActionHead,
    bounds: Option<(Vec<f32>, Vec<f32>)>,
    obs_dim: usize,
    act_dim: usize,
    num_envs: usize,
    num_updates: usize,
    lr: LinearSchedule,
    /// The actor-critic and its optimiser: on flat buffers, or (with `model.autodiff`, or on a
    /// GPU) a burn module.
    learner: Box<dyn Learner>,
    buffer: Rollout,
    state: PpoState,
}

impl Trainer for Ppo<'_> {
    type Error = ControlError;

    fn total_steps(&self) -> usize {
        self.num_updates
    }

    /// One PPO update, as CleanRL's `ppo.py` loop body: rollout, GAE, epochs of minibatch
    /// updates, log.
    fn step(&mut self, update: usize, phases: &Phases) -> Result<Step, ControlError> {
        let ppo = self.ppo;
        let lr_now = self.lr.at(update);
        let clip_coef = match ppo.anneal_clip {
            true => ppo.clip_coef * (1.0 - (update - 1) as f32 / self.num_updates as f32),
            false => ppo.clip_coef,
        };
        self.rollout(phases)?;
        let (advantages, returns) = self.advantages(phases);
        let stats = self.learn(update, lr_now, clip_coef, &advantages, &returns, phases)?;
        Ok(self.log(update, lr_now, &stats, &returns, phases))
    }

    fn snapshot(&self) -> Snapshot {
        let learner = self.learner.snapshot();
        let state = serde_json::to_vec(&self.state).expect("the state serialises");
        let envs = self.envs.sections();
        Box::new(move || {
            let mut sections = vec![("state".into(), state)];
            sections.extend(learner());
            sections.extend(envs);
            sections
        })
    }

    fn restore(&mut self, checkpoint: &Checkpoint) -> Result<(), ControlError> {
        let state = checkpoint.state()?;
        self.learner.restore(checkpoint)?;
        self.state = state;
        self.envs.restore(checkpoint)
    }

    fn non_finite_parameter(&self) -> Option<String> {
        self.learner.non_finite_parameter()
    }

    fn plugin_failures(&self) -> Vec<(String, FailureCounts)> {
        self.envs.failures()
    }
}

/// The four parts of an update.
impl Ppo<'_> {
    /// The progress line after `update`.
    fn progress(&self, update: usize, sps: f64) -> String {
        let shown = self
            .state
            .episodes
            .mean_return()
            .map_or("-".to_string(), |r| format!("{r:.1}"));
        let mut line = format!(
            "update {update}/{} | steps {} | {sps:.0} steps/s | return {shown} | episodes {}",
            self.num_updates, self.state.env_steps, self.state.episodes.completed
        );
        if self.state.solved_at.is_some() {
            let target = self.recipe.train.stop_at_return.unwrap_or_default();
            line += &format!("\nreached return {shown} ≥ {target} at step {}", self.state.env_steps);
        }
        line
    }

    /// ROLLOUT: `num_steps` steps of every environment under the current policy, without
    /// gradients.
    fn rollout(&mut self, phases: &Phases) -> Result<(), ControlError> {
        let (ppo, num_envs, steps) = (self.ppo, self.num_envs, self.ppo.num_steps);
        let log_std = self.learner.log_std();
        for t in 0..steps {
            let rows = t * num_envs..(t + 1) * num_envs;
            let inference = phases.enter("inference", "the policy's forward pass");
            let mut obs = std::mem::take(&mut self.envs.next_obs);
            if let Some(stats) = &mut self.state.obs_stats {
                stats.update(&obs);
                stats.normalize(&mut obs, ppo.clip_obs);
            }
            let (out, values) = self.learner.forward(&obs, num_envs);
            let b = &mut self.buffer;
            let actions = &mut b.actions[rows.start * self.act_dim..rows.end * self.act_dim];
            let env_actions = act(
                self.head,
                &out,
                &log_std,
                self.bounds.as_ref(),
                &mut self.state.rng,
                false,
                actions,
                &mut b.log_probs[rows.clone()],
            );
            b.obs[rows.start * self.obs_dim..rows.end * self.obs_dim].copy_from_slice(&obs);
            b.values[rows.clone()].copy_from_slice(&values);
            self.envs.log(&env_actions);
            drop(inference);

            let env_phase = phases.enter("env", format!("`{}` stepping {num_envs} envs", self.envs.plugin));
            let step = self.envs.envs.step(&env_actions)?;
            drop(env_phase);

            let _inference = phases.enter("inference", "recording the transition");
            let mut rewards: Vec<f32> = step.rewards.iter().map(|&r| r as f32).collect();
            self.state
                .episodes
                .record(&step.rewards, &step.terminated, &step.truncated);
            if let Some(scaler) = &mut self.state.reward_scaler {
                scaler.scale(&mut rewards, &step.terminated, ppo.clip_reward);
            }
            b.rewards[rows.clone()].copy_from_slice(&rewards);
            b.terminated[rows.clone()].copy_from_slice(&step.terminated);
            b.truncated[rows.clone()].copy_from_slice(&step.truncated);
            // Truncated episodes bootstrap from their final observation's value.
            let truncated: Vec<usize> = (0..num_envs)
                .filter(|&i| step.truncated[i] && !step.terminated[i])
                .collect();
            if !truncated.is_empty() {
                let mut finals: Vec<f32> = Vec::with_capacity(truncated.len() * self.obs_dim);
                for (i, row) in step.final_observations(self.obs_dim) {
                    if truncated.contains(&i) {
                        finals.extend_from_slice(row);
                    }
                }
                if let Some(stats) = &self.state.obs_stats {
                    stats.normalize(&mut finals, ppo.clip_obs);
                }
                let n = truncated.len();
                let (_, final_values) = self.learner.forward(&finals, n);
                for (&i, v) in truncated.iter().zip(final_values) {
                    b.next_values[rows.start + i] = v;
                }
            }
            self.envs.next_obs = step.observations;
        }
        self.state.env_steps += (num_envs * steps) as u64;

        Ok(())
    }

    /// GAE over the rollout, bootstrapping its end from the value of the next observation:
    /// (advantages, returns).
    fn advantages(&mut self, phases: &Phases) -> (Vec<f32>, Vec<f32>) {
        let (ppo, num_envs, steps) = (self.ppo, self.num_envs, self.ppo.num_steps);
        let inference = phases.enter("inference", "advantages");
        let mut last_obs = self.envs.next_obs.clone();
        if let Some(stats) = &self.state.obs_stats {
            stats.normalize(&mut last_obs, ppo.clip_obs);
        }
        let (_, last_values) = self.learner.forward(&last_obs, num_envs);
        let b = &mut self.buffer;
        for k in 0..steps * num_envs {
            if !b.truncated[k] || b.terminated[k] {
                b.next_values[k] = match b.values.get(k + num_envs) {
                    Some(&v) => v,
                    None => last_values[k % num_envs],
                };
            }
        }
        let advantages = gae(
            &b.rewards,
            &b.values,
            &b.next_values,
            &b.terminated,
            &b.truncated,
            num_envs,
            ppo.gamma,
            ppo.gae_lambda,
        );
        let returns: Vec<f32> = advantages.iter().zip(&b.values).map(|(a, v)| a + v).collect();
        drop(inference);

        (advantages, returns)
    }

    /// LEARN: `update_epochs` epochs of shuffled minibatches (stopping early past `target_kl`).
    fn learn(
        &mut self,
        update: usize,
        lr_now: f64,
        clip_coef: f32,
        advantages: &[f32],
        returns: &[f32],
        phases: &Phases,
    ) -> Result<LossStats, ControlError> {
        let (ppo, num_envs, steps) = (self.ppo, self.num_envs, self.ppo.num_steps);
        let loss_config = PpoLossConfig {
            clip_coef,
            clip_vloss: ppo.clip_vloss,
            ent_coef: ppo.ent_coef,
            vf_coef: ppo.vf_coef,
        };
        let mut stats = LossStats::default();
        let batch_size = num_envs * steps;
        let mut b_inds: Vec<usize> = (0..batch_size).collect();
        'epochs: for _ in 0..ppo.update_epochs {
            self.state.shuffle_rng.shuffle(&mut b_inds);
            for mb_inds in b_inds.chunks(batch_size / ppo.num_minibatches) {
                let backward = phases.enter("backward", "the loss and its gradients");
                let mb = self.buffer.gather(mb_inds, advantages, returns, ppo.norm_adv);
                let loss = self.learner.gradients(mb, &loss_config);
                rein_run::RunError::check_loss(update, "PPO loss", loss.loss)?;
                drop(backward);

                let _optimizer = phases.enter("optimizer", "clipping and applying the gradients");
                let max_norm = self.recipe.optimizer.max_grad_norm;
                let grad_norm = self.learner.apply(update, lr_now, max_norm)?;
                stats.add(&loss, grad_norm);
            }
            if ppo.target_kl.is_some_and(|target| stats.last_kl > target) {
                break 'epochs;
            }
        }

        Ok(stats)
    }

    /// LOG: the update's metrics record; done once the target return is reached.
    fn log(&mut self, update: usize, lr_now: f64, stats: &LossStats, returns: &[f32], phases: &Phases) -> Step {
        let elapsed = phases.elapsed().as_secs_f64();
        let env_steps = self.state.env_steps;
        let mean_return = self.state.episodes.mean_return();
        if let (Some(target), Some(mean), None) = (self.recipe.train.stop_at_return, mean_return, self.state.solved_at)
            && mean >= target
        {
            self.state.solved_at = Some((env_steps, elapsed));
        }
        let [policy_loss, value_loss, entropy, approx_kl, clip_frac, grad_norm] = stats.means();
        let sps = env_steps as f64 / elapsed.max(1e-9);
        let record = json!({
            "update": update,
            "global_step": env_steps,
            "charts/episodic_return": mean_return,
            "charts/episodes": self.state.episodes.completed,
            "charts/learning_rate": lr_now,
            "charts/sps": sps,
            "losses/policy_loss": policy_loss,
            "losses/value_loss": value_loss,
            "losses/entropy": entropy,
            "losses/approx_kl": approx_kl,
            "losses/clipfrac": clip_frac,
            "losses/grad_norm": grad_norm,
            "losses/explained_variance": explained_variance(&self.buffer.values, returns),
        });
        Step {
            record: record.as_object().cloned().unwrap_or_default(),
            done: self.state.solved_at.is_some(),
            progress: self.progress(update, sps),
        }
    }
}

impl<'a> Ppo<'a> {
    /// Seeding → envs → agent → storage, for a PPO recipe on envs from `make_env`, the agent a
    /// burn module on `device` unless [`Recipe::flat_networks`]. With `log_actions`, every action sent is
    /// kept for checkpoints (see [`RecordedEnvs`]).
    pub fn new<B: ReinAutodiffBackend>(
        plan: PpoRecipe<'a>,
        make_env: &EnvFactory<'_>,
        device: &B::Device,
        log_actions: bool,
    ) -> Result<Self, ControlError> {
        let PpoRecipe {
            recipe,
            ppo,
            env: section,
        } = plan;
        let plugin = section.plugin.clone();
        let unsupported = |message: &str| ControlError::Environment {
            plugin: plugin.clone(),
            message: message.into(),
        };
        let num_envs = section.num_envs;
        let envs = make_env(num_envs)?;
        let spec = envs.spec().clone();
        let obs_dim = match &spec.observation {
            Space::Box(b) => b.dim(),
            Space::Discrete(_) => 1,
            Space::Text => return Err(unsupported("PPO needs vector observations, not text")),
        };
        let (head, bounds) = match &spec.action {
            Space::Discrete(n) => (ActionHead::Categorical(*n as usize), None),
            Space::Box(b) => (ActionHead::Gaussian(b.dim()), Some((b.low.clone(), b.high.clone()))),
            Space::Text => return Err(unsupported("PPO needs discrete or box actions, not text")),
        };
        let mut rng = SeededRng::new(recipe.seed);
        let shuffle_rng = rng.fork();
        let config = ActorCriticConfig {
            obs_dim,
            head,
            hidden: recipe.model.hidden.clone(),
            activation: recipe.model.activation,
            init_log_std: recipe.model.init_log_std,
        };
        let model: ActorCritic<B> = config.init(&mut rng.fork(), device);
        let opt = &recipe.optimizer;
        let learner: Box<dyn Learner> = match recipe.flat_networks() {
            true => Box::new(FlatLearner::new(&model, recipe.model.activation, opt)),
            false => Box::new(BurnLearner::new(model, opt, obs_dim, device)),
        };
        let batch_size = num_envs * ppo.num_steps;
        let num_updates = recipe.train.total_steps.div_ceil(batch_size as u64).max(1) as usize;
        let lr = match opt.anneal_lr == Some(true) {
            true => LinearSchedule {
                start: opt.lr,
                end: 0.0,
                updates: num_updates,
            },
            false => LinearSchedule::constant(opt.lr),
        };
        let act_dim = match head {
            ActionHead::Categorical(_) => 1,
            ActionHead::Gaussian(d) => d,
        };
        let state = PpoState {
            env_steps: 0,
            rng,
            shuffle_rng,
            obs_stats: ppo.normalize_obs.then(|| RunningMeanStd::new(obs_dim)),
            reward_scaler: ppo
                .normalize_reward
                .then(|| RewardScaler::new(num_envs, f64::from(ppo.gamma))),
            episodes: EpisodeReturns::new(num_envs, recipe.train.return_window),
            solved_at: None,
        };
        Ok(Self {
            recipe,
            ppo,
            envs: RecordedEnvs::new(plugin, envs, recipe.seed, log_actions)?,
            head,
            bounds,
            obs_dim,
            act_dim,
            num_envs,
            num_updates,
            lr,
            learner,
            buffer: Rollout::new(ppo.num_steps, num_envs, obs_dim, act_dim),
            state,
        })
    }
}
