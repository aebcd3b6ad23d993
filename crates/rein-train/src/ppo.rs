//! PPO on a vector of environment plugins, in CleanRL's order (`ppo.py` for discrete actions,
//! `ppo_continuous_action.py` for continuous ones): seed → envs → storage → rollout → GAE →
//! flatten → epochs of minibatches (policy, value, entropy losses) → log.
//!
//! Implementation details followed (Huang et al., "The 37 implementation details of PPO"):
//! vectorised envs with same-step auto-reset, orthogonal init, Adam ε = 1e-5, linear LR
//! annealing, GAE, minibatch shuffling, per-minibatch advantage normalisation, clipped
//! surrogate, clipped value loss, entropy bonus, global gradient clipping, optional target-KL
//! early stop; for continuous actions a state-independent log-std, action clipping to the
//! bounds (log-probabilities use the unclipped action), optional observation normalisation and
//! reward scaling. One departure: truncated episodes bootstrap from the value of their final
//! observation (CleanRL treats truncation as termination).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use burn::module::AutodiffModule;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::{Int, Tensor, TensorData};
use rein_core::{BatchActions, PluginError, Space, VecEnv};
use rein_model::{ActionHead, ActorCritic, ActorCriticConfig};
use rein_model::{AutodiffBackend, Backend};
use rein_optim::{
    LinearSchedule, PpoLossConfig, RewardScaler, RunningMeanStd, clip_grad_norm, gae, normalize, ppo_loss,
};
use rein_sampler::{
    SeededRng, categorical_entropy, categorical_log_prob, gaussian_entropy, gaussian_log_prob, sample_categorical,
    sample_gaussian,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::checkpoint::{Checkpoint, Checkpointing, module_bytes, optimizer_bytes};
pub use crate::error::TrainError;
use crate::progress::Progress;
use crate::run_dir::{MetricsWriter, RunDir};
use rein_recipe::{Algorithm, LoadedRecipe, PpoSection, Recipe};

/// Where the wall-clock time of a run went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Stepping environments (plugin calls).
    pub env: Duration,
    /// Rollout forward passes and action sampling.
    pub inference: Duration,
    /// Training forward passes, losses and backward passes.
    pub backward: Duration,
    /// Gradient clipping and optimiser steps.
    pub optimizer: Duration,
    /// Everything, from start to the last update.
    pub total: Duration,
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct PpoOutcome {
    /// Updates performed.
    pub updates: usize,
    /// Environment steps taken (all envs).
    pub env_steps: u64,
    /// Episodes completed during training.
    pub episodes: usize,
    /// Mean return of the last `return_window` training episodes.
    pub mean_return: Option<f64>,
    /// When the mean return first reached `stop_at_return`: (env steps, seconds).
    pub solved_at: Option<(u64, f64)>,
    /// Mean return of the deterministic policy over `eval_episodes` episodes.
    pub eval_return: Option<f64>,
    /// Where the time went.
    pub timings: Timings,
    /// The run directory, when one was written.
    pub run_dir: Option<PathBuf>,
}

/// Makes `n` environments (the recipe's plugin and config); called for training and again
/// for evaluation.
pub type EnvFactory<'a> = dyn Fn(usize) -> Result<Box<dyn VecEnv>, PluginError> + 'a;

/// Everything a PPO run carries from one update to the next besides the model and optimiser:
/// what a checkpoint stores as its `state` section.
#[derive(Serialize, Deserialize)]
struct PpoState {
    update: usize,
    env_steps: u64,
    metrics_len: u64,
    rng: SeededRng,
    shuffle_rng: SeededRng,
    obs_stats: Option<RunningMeanStd>,
    reward_scaler: Option<RewardScaler>,
    episodes: Episodes,
    solved_at: Option<(u64, f64)>,
    timings: Timings,
}

/// Trains the recipe's PPO agent on `device`, writing the run into `run` when given, with
/// checkpoints (and resuming) as `checkpointing` says.
///
/// The environments live inside plugins, whose state the host cannot read; a checkpoint
/// therefore holds every action sent to them, and resuming resets them with the run's seed and
/// replays those actions (plugins are deterministic: no clock, no entropy), then checks that
/// the observations reached equal the saved ones.
pub fn train<B: AutodiffBackend>(
    loaded: &LoadedRecipe,
    make_env: &EnvFactory<'_>,
    device: &B::Device,
    run: Option<&RunDir>,
    checkpointing: &Checkpointing,
) -> Result<PpoOutcome, TrainError> {
    let recipe: &Recipe = &loaded.recipe;
    let Algorithm::Ppo(ppo) = &recipe.algorithm else {
        return Err(TrainError::Unsupported {
            plugin: String::new(),
            message: "not a PPO recipe".into(),
        });
    };
    let env_section = recipe.env.as_ref().ok_or_else(|| TrainError::Unsupported {
        plugin: String::new(),
        message: "PPO needs an [env] section".into(),
    })?;
    let plugin_name = env_section.plugin.clone();
    let unsupported = |message: String| TrainError::Unsupported {
        plugin: plugin_name.clone(),
        message,
    };

    // Seeding and envs.
    let num_envs = env_section.num_envs;
    let mut envs = make_env(num_envs)?;
    let spec = envs.spec().clone();
    let obs_dim = match &spec.observation {
        Space::Box(b) => b.dim(),
        Space::Discrete(_) => 1,
        Space::Text => return Err(unsupported("PPO needs vector observations, not text".into())),
    };
    let (head, action_bounds) = match &spec.action {
        Space::Discrete(n) => (ActionHead::Categorical(*n as usize), None),
        Space::Box(b) => (ActionHead::Gaussian(b.dim()), Some((b.low.clone(), b.high.clone()))),
        Space::Text => return Err(unsupported("PPO needs discrete or box actions, not text".into())),
    };
    B::seed(device, recipe.seed);
    let mut rng = SeededRng::new(recipe.seed);
    let mut shuffle_rng = rng.fork();
    let mut model: ActorCritic<B> = ActorCriticConfig {
        obs_dim,
        head,
        hidden: recipe.model.hidden.clone(),
        activation: recipe.model.activation,
        init_log_std: recipe.model.init_log_std,
    }
    .init(device);
    let opt = &recipe.optimizer;
    let mut optim = AdamConfig::new()
        .with_beta_1(opt.beta1)
        .with_beta_2(opt.beta2)
        .with_epsilon(opt.eps)
        .init::<B, ActorCritic<B>>();

    // Storage, laid out time-major: element t * num_envs + i is env i at step t.
    let steps = ppo.num_steps;
    let batch_size = num_envs * steps;
    let minibatch_size = batch_size / ppo.num_minibatches;
    let num_updates = recipe.train.total_steps.div_ceil(batch_size as u64).max(1) as usize;
    let lr = if opt.anneal_lr {
        LinearSchedule {
            start: opt.lr,
            end: 0.0,
            updates: num_updates,
        }
    } else {
        LinearSchedule::constant(opt.lr)
    };
    let act_dim = match head {
        ActionHead::Categorical(_) => 1,
        ActionHead::Gaussian(d) => d,
    };
    let mut buffer = Rollout::new(steps, num_envs, obs_dim, act_dim);
    let mut obs_stats = ppo.normalize_obs.then(|| RunningMeanStd::new(obs_dim));
    let mut reward_scaler = ppo
        .normalize_reward
        .then(|| RewardScaler::new(num_envs, f64::from(ppo.gamma)));
    let mut episodes = Episodes::new(num_envs, recipe.train.return_window);

    let mut timings = Timings::default();
    let mut next_obs = envs.reset(recipe.seed)?;
    let mut solved_at = None;
    let mut env_steps = 0u64;
    let mut updates_done = 0;
    // Every action sent to the environments, in order, when checkpoints are written (for
    // resuming; see above).
    let mut action_log: Vec<f32> = Vec::new();
    let mut metrics_len = 0;
    if let Some(checkpoint) = &checkpointing.resume {
        let state: PpoState = checkpoint.state()?;
        model = checkpoint.load_module("model", model, device)?;
        optim = checkpoint.load_optimizer::<B, ActorCritic<B>, _>("optimizer", optim, device)?;
        action_log = f32s(checkpoint.section("actions")?);
        next_obs = replay(envs.as_mut(), next_obs, &action_log, &plugin_name, checkpoint)?;
        (rng, shuffle_rng, obs_stats, reward_scaler) =
            (state.rng, state.shuffle_rng, state.obs_stats, state.reward_scaler);
        (episodes, solved_at, timings) = (state.episodes, state.solved_at, state.timings);
        (updates_done, env_steps, metrics_len) = (state.update, state.env_steps, state.metrics_len);
        eprintln!(
            "resuming after update {updates_done} ({env_steps} env steps replayed) from {}",
            checkpoint.path.display()
        );
    }
    let mut metrics = run.map(|r| r.metrics_from(metrics_len)).transpose()?;
    let mut progress = Progress::new();
    let start = Instant::now().checked_sub(timings.total).unwrap_or_else(Instant::now);
    let first_update = if solved_at.is_some() {
        num_updates + 1
    } else {
        updates_done + 1
    };

    for update in first_update..=num_updates {
        let lr_now = lr.at(update);
        let clip_coef = if ppo.anneal_clip {
            ppo.clip_coef * (1.0 - (update - 1) as f32 / num_updates as f32)
        } else {
            ppo.clip_coef
        };

        // ROLLOUT: the current policy, without gradients.
        let policy = model.valid();
        let log_std: Vec<f32> = policy
            .log_std()
            .map(|t| t.into_data().to_vec::<f32>().unwrap_or_default())
            .unwrap_or_default();
        for t in 0..steps {
            let tick = Instant::now();
            let mut obs = next_obs;
            if let Some(stats) = &mut obs_stats {
                stats.update(&obs);
                stats.normalize(&mut obs, ppo.clip_obs);
            }
            let (out, values) = forward::<B::InnerBackend>(&policy, &obs, num_envs, obs_dim, device);
            let mut env_actions = Vec::with_capacity(num_envs * act_dim);
            for i in 0..num_envs {
                let row = &out[i * head.outputs()..(i + 1) * head.outputs()];
                let k = t * num_envs + i;
                buffer.log_probs[k] = match head {
                    ActionHead::Categorical(_) => {
                        let (a, logp) = sample_categorical(row, &mut rng, false);
                        buffer.actions[k] = a as f32;
                        logp
                    }
                    ActionHead::Gaussian(d) => {
                        let mut a = Vec::with_capacity(d);
                        let logp = sample_gaussian(row, &log_std, &mut rng, false, &mut a);
                        buffer.actions[k * d..(k + 1) * d].copy_from_slice(&a);
                        logp
                    }
                };
            }
            let batch_actions = match head {
                ActionHead::Categorical(_) => BatchActions::Discrete(
                    buffer.actions[t * num_envs..(t + 1) * num_envs]
                        .iter()
                        .map(|&a| a as u32)
                        .collect(),
                ),
                ActionHead::Gaussian(d) => {
                    let (low, high) = action_bounds.as_ref().expect("box actions have bounds");
                    env_actions.extend(
                        buffer.actions[t * num_envs * d..(t + 1) * num_envs * d]
                            .iter()
                            .enumerate()
                            .map(|(j, &a)| a.clamp(low[j % d], high[j % d])),
                    );
                    BatchActions::Continuous(env_actions)
                }
            };
            buffer.obs[t * num_envs * obs_dim..(t + 1) * num_envs * obs_dim].copy_from_slice(&obs);
            buffer.values[t * num_envs..(t + 1) * num_envs].copy_from_slice(&values);
            timings.inference += tick.elapsed();

            if checkpointing.dir.is_some() {
                match &batch_actions {
                    BatchActions::Discrete(a) => action_log.extend(a.iter().map(|&a| a as f32)),
                    BatchActions::Continuous(a) => action_log.extend_from_slice(a),
                }
            }
            let tick = Instant::now();
            let step = envs.step(&batch_actions)?;
            timings.env += tick.elapsed();

            let tick = Instant::now();
            let mut rewards: Vec<f32> = step.rewards.iter().map(|&r| r as f32).collect();
            episodes.record(
                &step.rewards,
                &step.terminated,
                &step.truncated,
                env_steps + (t as u64 + 1) * num_envs as u64,
            );
            if let Some(scaler) = &mut reward_scaler {
                scaler.scale(&mut rewards, &step.terminated, ppo.clip_reward);
            }
            let row = t * num_envs..(t + 1) * num_envs;
            buffer.rewards[row.clone()].copy_from_slice(&rewards);
            buffer.terminated[row.clone()].copy_from_slice(&step.terminated);
            buffer.truncated[row].copy_from_slice(&step.truncated);
            // Truncated episodes bootstrap from their final observation's value.
            let truncated: Vec<usize> = (0..num_envs)
                .filter(|&i| step.truncated[i] && !step.terminated[i])
                .collect();
            if !truncated.is_empty() {
                let mut finals: Vec<f32> = Vec::with_capacity(truncated.len() * obs_dim);
                for (i, row) in step.final_observations(obs_dim) {
                    if truncated.contains(&i) {
                        finals.extend_from_slice(row);
                    }
                }
                if let Some(stats) = &obs_stats {
                    stats.normalize(&mut finals, ppo.clip_obs);
                }
                let (_, final_values) = forward::<B::InnerBackend>(&policy, &finals, truncated.len(), obs_dim, device);
                for (&i, v) in truncated.iter().zip(final_values) {
                    buffer.next_values[t * num_envs + i] = v;
                }
            }
            next_obs = step.observations;
            timings.inference += tick.elapsed();
        }
        env_steps += batch_size as u64;

        // GAE, bootstrapping the rollout's end from the value of the next observation.
        let tick = Instant::now();
        let mut last_obs = next_obs.clone();
        if let Some(stats) = &obs_stats {
            stats.normalize(&mut last_obs, ppo.clip_obs);
        }
        let (_, last_values) = forward::<B::InnerBackend>(&policy, &last_obs, num_envs, obs_dim, device);
        for t in 0..steps {
            for (i, &last_value) in last_values.iter().enumerate() {
                let k = t * num_envs + i;
                if !buffer.truncated[k] || buffer.terminated[k] {
                    buffer.next_values[k] = if t + 1 < steps {
                        buffer.values[k + num_envs]
                    } else {
                        last_value
                    };
                }
            }
        }
        let advantages = gae(
            &buffer.rewards,
            &buffer.values,
            &buffer.next_values,
            &buffer.terminated,
            &buffer.truncated,
            num_envs,
            ppo.gamma,
            ppo.gae_lambda,
        );
        let returns: Vec<f32> = advantages.iter().zip(&buffer.values).map(|(a, v)| a + v).collect();
        timings.inference += tick.elapsed();

        // LEARN: epochs of shuffled minibatches.
        let loss_config = PpoLossConfig {
            clip_coef,
            clip_vloss: ppo.clip_vloss,
            ent_coef: ppo.ent_coef,
            vf_coef: ppo.vf_coef,
        };
        let mut stats = LossStats::default();
        let mut indices: Vec<usize> = (0..batch_size).collect();
        'epochs: for _ in 0..ppo.update_epochs {
            shuffle_rng.shuffle(&mut indices);
            for mb in indices.chunks(minibatch_size) {
                let tick = Instant::now();
                let minibatch = buffer.gather(mb, &advantages, &returns, ppo.norm_adv);
                let (loss, new_model_grads) = {
                    let obs = tensor2::<B>(minibatch.obs, mb.len(), obs_dim, device);
                    let out = model.actor(obs.clone());
                    let new_values = model.value(obs);
                    let (new_log_prob, entropy) = match head {
                        ActionHead::Categorical(_) => {
                            let actions: Vec<i64> = minibatch.actions.iter().map(|&a| a as i64).collect();
                            let actions = Tensor::<B, 1, Int>::from_data(TensorData::new(actions, [mb.len()]), device);
                            (categorical_log_prob(out.clone(), actions), categorical_entropy(out))
                        }
                        ActionHead::Gaussian(d) => {
                            let log_std = model.log_std().expect("a Gaussian head has a log-std");
                            let actions = tensor2::<B>(minibatch.actions, mb.len(), d, device);
                            (
                                gaussian_log_prob(out, log_std.clone(), actions),
                                gaussian_entropy(log_std),
                            )
                        }
                    };
                    let loss = ppo_loss(
                        new_log_prob,
                        tensor1::<B>(minibatch.log_probs, device),
                        tensor1::<B>(minibatch.advantages, device),
                        new_values,
                        tensor1::<B>(minibatch.values, device),
                        tensor1::<B>(minibatch.returns, device),
                        entropy,
                        &loss_config,
                    );
                    let grads = loss.loss.backward();
                    (loss, grads)
                };
                let loss_value: f32 = loss.loss.clone().into_scalar().elem();
                TrainError::check_loss(update, "PPO loss", loss_value)?;
                let mut grads = GradientsParams::from_grads(new_model_grads, &model);
                timings.backward += tick.elapsed();

                let tick = Instant::now();
                let grad_norm = clip_grad_norm(&model, &mut grads, opt.max_grad_norm);
                TrainError::check_gradients(update, grad_norm, &model, &grads)?;
                model = optim.step(lr_now, model, grads);
                timings.optimizer += tick.elapsed();
                stats.add(&loss, grad_norm);
            }
            if ppo.target_kl.is_some_and(|target| stats.last_kl > target) {
                break 'epochs;
            }
        }
        updates_done = update;

        // LOG.
        timings.total = start.elapsed();
        let elapsed = timings.total.as_secs_f64();
        let mean_return = episodes.mean_return();
        if let (Some(target), Some(mean), None) = (recipe.train.stop_at_return, mean_return, solved_at)
            && mean >= target
        {
            solved_at = Some((env_steps, elapsed));
        }
        let record = json!({
            "update": update,
            "global_step": env_steps,
            "time/elapsed_s": elapsed,
            "time/env_s": timings.env.as_secs_f64(),
            "time/inference_s": timings.inference.as_secs_f64(),
            "time/backward_s": timings.backward.as_secs_f64(),
            "time/optimizer_s": timings.optimizer.as_secs_f64(),
            "charts/episodic_return": mean_return,
            "charts/episodes": episodes.completed,
            "charts/learning_rate": lr_now,
            "charts/sps": env_steps as f64 / elapsed.max(1e-9),
            "losses/policy_loss": stats.mean(stats.policy),
            "losses/value_loss": stats.mean(stats.value),
            "losses/entropy": stats.mean(stats.entropy),
            "losses/approx_kl": stats.mean(stats.approx_kl),
            "losses/clipfrac": stats.mean(stats.clip_frac),
            "losses/grad_norm": stats.mean(stats.grad_norm),
            "losses/explained_variance": explained_variance(&buffer.values, &returns),
        });
        if let Some(m) = &mut metrics {
            m.write(&record)?;
        }
        let last = if solved_at.is_some() { update } else { num_updates };
        checkpointing.after_step(update, last, &model, || {
            let state = PpoState {
                update,
                env_steps,
                metrics_len: metrics.as_ref().map_or(0, MetricsWriter::bytes_written),
                rng: rng.clone(),
                shuffle_rng: shuffle_rng.clone(),
                obs_stats: obs_stats.clone(),
                reward_scaler: reward_scaler.clone(),
                episodes: episodes.clone(),
                solved_at,
                timings,
            };
            vec![
                ("state", serde_json::to_vec(&state).expect("the state serialises")),
                ("model", module_bytes(&model)),
                ("optimizer", optimizer_bytes::<B, ActorCritic<B>, _>(&optim)),
                ("actions", bytes_of(&action_log)),
                ("next_obs", bytes_of(&next_obs)),
            ]
        })?;
        let shown = mean_return.map_or("-".to_string(), |r| format!("{r:.1}"));
        progress.show(
            &format!(
                "update {update}/{num_updates} | steps {env_steps} | {:.0} steps/s | return {shown} | episodes {}",
                env_steps as f64 / elapsed.max(1e-9),
                episodes.completed
            ),
            update == num_updates,
        );
        if solved_at.is_some() {
            progress.show(
                &format!(
                    "reached return {shown} ≥ {} at step {env_steps}",
                    recipe.train.stop_at_return.unwrap_or_default()
                ),
                true,
            );
            break;
        }
    }
    progress.finish();
    timings.total = start.elapsed();

    let eval_return = if recipe.train.eval_episodes > 0 {
        Some(evaluate(
            &model.valid(),
            make_env,
            recipe,
            obs_stats.as_ref(),
            ppo,
            action_bounds.as_ref(),
            device,
        )?)
    } else {
        None
    };
    if let Some(run) = run {
        save_policy(&model.valid(), run.path())?;
        if let Some(stats) = &obs_stats {
            std::fs::write(
                run.path().join("obs_normalizer.json"),
                serde_json::to_string_pretty(stats).unwrap_or_default(),
            )?;
        }
    }
    Ok(PpoOutcome {
        updates: updates_done,
        env_steps,
        episodes: episodes.completed,
        mean_return: episodes.mean_return(),
        solved_at,
        eval_return,
        timings,
        run_dir: run.map(|r| r.path().to_path_buf()),
    })
}

/// Sends freshly reset environments `actions` (the log of a checkpoint) again, returning the
/// observations reached; errors if they differ from the ones the checkpoint saw, since then the
/// plugin is not deterministic and the run cannot continue exactly.
fn replay(
    envs: &mut dyn VecEnv,
    reset_obs: Vec<f32>,
    actions: &[f32],
    plugin: &str,
    checkpoint: &Checkpoint,
) -> Result<Vec<f32>, TrainError> {
    let width = match &envs.spec().action {
        Space::Box(b) => b.dim(),
        _ => 1,
    };
    let discrete = matches!(envs.spec().action, Space::Discrete(_));
    let mut obs = reset_obs;
    for step in actions.chunks(envs.num_envs() * width) {
        let batch = if discrete {
            BatchActions::Discrete(step.iter().map(|&a| a as u32).collect())
        } else {
            BatchActions::Continuous(step.to_vec())
        };
        obs = envs.step(&batch)?.observations;
    }
    let saved = f32s(checkpoint.section("next_obs")?);
    if obs.iter().map(|x| x.to_bits()).ne(saved.iter().map(|x| x.to_bits())) {
        return Err(TrainError::Resume {
            run: checkpoint.path.clone(),
            message: format!(
                "replaying the recorded actions in environment plugin `{plugin}` reached other observations than the run did: the plugin is not deterministic"
            ),
        });
    }
    Ok(obs)
}

/// Little-endian bytes of `values`.
fn bytes_of(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The values of [`bytes_of`].
fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Actor outputs (`[n, head]` flattened) and values (`[n]`) for `n` observations.
fn forward<B: Backend>(
    policy: &ActorCritic<B>,
    obs: &[f32],
    n: usize,
    obs_dim: usize,
    device: &B::Device,
) -> (Vec<f32>, Vec<f32>) {
    let obs = Tensor::<B, 2>::from_data(TensorData::new(obs.to_vec(), [n, obs_dim]), device);
    let out = policy
        .actor(obs.clone())
        .into_data()
        .to_vec::<f32>()
        .unwrap_or_default();
    let values = policy.value(obs).into_data().to_vec::<f32>().unwrap_or_default();
    (out, values)
}

fn tensor1<B: Backend>(values: Vec<f32>, device: &B::Device) -> Tensor<B, 1> {
    let n = values.len();
    Tensor::from_data(TensorData::new(values, [n]), device)
}

fn tensor2<B: Backend>(values: Vec<f32>, rows: usize, cols: usize, device: &B::Device) -> Tensor<B, 2> {
    Tensor::from_data(TensorData::new(values, [rows, cols]), device)
}

use burn::tensor::ElementConversion;

/// One rollout of `steps × num_envs` transitions.
struct Rollout {
    obs_dim: usize,
    act_dim: usize,
    obs: Vec<f32>,
    actions: Vec<f32>,
    log_probs: Vec<f32>,
    values: Vec<f32>,
    next_values: Vec<f32>,
    rewards: Vec<f32>,
    terminated: Vec<bool>,
    truncated: Vec<bool>,
}

/// The rows of one minibatch.
struct Minibatch {
    obs: Vec<f32>,
    actions: Vec<f32>,
    log_probs: Vec<f32>,
    advantages: Vec<f32>,
    values: Vec<f32>,
    returns: Vec<f32>,
}

impl Rollout {
    fn new(steps: usize, num_envs: usize, obs_dim: usize, act_dim: usize) -> Self {
        let n = steps * num_envs;
        Self {
            obs_dim,
            act_dim,
            obs: vec![0.0; n * obs_dim],
            actions: vec![0.0; n * act_dim],
            log_probs: vec![0.0; n],
            values: vec![0.0; n],
            next_values: vec![0.0; n],
            rewards: vec![0.0; n],
            terminated: vec![false; n],
            truncated: vec![false; n],
        }
    }

    fn gather(&self, rows: &[usize], advantages: &[f32], returns: &[f32], norm_adv: bool) -> Minibatch {
        let pick = |src: &[f32], width: usize| -> Vec<f32> {
            let mut out = Vec::with_capacity(rows.len() * width);
            for &r in rows {
                out.extend_from_slice(&src[r * width..(r + 1) * width]);
            }
            out
        };
        let mut mb_advantages = pick(advantages, 1);
        if norm_adv {
            normalize(&mut mb_advantages);
        }
        Minibatch {
            obs: pick(&self.obs, self.obs_dim),
            actions: pick(&self.actions, self.act_dim),
            log_probs: pick(&self.log_probs, 1),
            advantages: mb_advantages,
            values: pick(&self.values, 1),
            returns: pick(returns, 1),
        }
    }
}

/// Episode returns and lengths as they complete.
#[derive(Clone, Serialize, Deserialize)]
struct Episodes {
    running: Vec<f64>,
    recent: VecDeque<f64>,
    window: usize,
    completed: usize,
}

impl Episodes {
    fn new(num_envs: usize, window: usize) -> Self {
        Self {
            running: vec![0.0; num_envs],
            recent: VecDeque::with_capacity(window),
            window,
            completed: 0,
        }
    }

    fn record(&mut self, rewards: &[f64], terminated: &[bool], truncated: &[bool], _global_step: u64) {
        for i in 0..self.running.len() {
            self.running[i] += rewards[i];
            if terminated[i] || truncated[i] {
                if self.recent.len() == self.window {
                    self.recent.pop_front();
                }
                self.recent.push_back(self.running[i]);
                self.running[i] = 0.0;
                self.completed += 1;
            }
        }
    }

    /// Mean return over the last `window` episodes, once `window` episodes completed.
    fn mean_return(&self) -> Option<f64> {
        (self.recent.len() == self.window).then(|| self.recent.iter().sum::<f64>() / self.window as f64)
    }
}

#[derive(Default)]
struct LossStats {
    policy: f64,
    value: f64,
    entropy: f64,
    approx_kl: f64,
    clip_frac: f64,
    grad_norm: f64,
    last_kl: f32,
    count: usize,
}

impl LossStats {
    fn add<B: Backend>(&mut self, loss: &rein_optim::PpoLoss<B>, grad_norm: f32) {
        let scalar = |t: &Tensor<B, 1>| -> f64 { t.clone().into_scalar().elem::<f64>() };
        self.policy += scalar(&loss.policy);
        self.value += scalar(&loss.value);
        self.entropy += scalar(&loss.entropy);
        let kl = scalar(&loss.approx_kl);
        self.last_kl = kl as f32;
        self.approx_kl += kl;
        self.clip_frac += scalar(&loss.clip_frac);
        self.grad_norm += f64::from(grad_norm);
        self.count += 1;
    }

    fn mean(&self, total: f64) -> f64 {
        total / self.count.max(1) as f64
    }
}

/// `1 − Var[R − V] / Var[R]`: how much of the returns' variance the critic explains.
fn explained_variance(values: &[f32], returns: &[f32]) -> Option<f64> {
    let var = |xs: &mut dyn Iterator<Item = f64>| {
        let v: Vec<f64> = xs.collect();
        let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len().max(1) as f64
    };
    let var_returns = var(&mut returns.iter().map(|&r| f64::from(r)));
    (var_returns > 0.0).then(|| 1.0 - var(&mut returns.iter().zip(values).map(|(r, v)| f64::from(r - v))) / var_returns)
}

/// Mean return of the deterministic policy (argmax / mean action) over `eval_episodes`
/// episodes, on fresh environments seeded away from the training seeds.
fn evaluate<B: Backend>(
    policy: &ActorCritic<B>,
    make_env: &EnvFactory<'_>,
    recipe: &Recipe,
    obs_stats: Option<&RunningMeanStd>,
    ppo: &PpoSection,
    action_bounds: Option<&(Vec<f32>, Vec<f32>)>,
    device: &B::Device,
) -> Result<f64, TrainError> {
    let wanted = recipe.train.eval_episodes;
    let n = wanted.min(16);
    let mut envs = make_env(n)?;
    let obs_dim = envs.spec().observation.flat_dim();
    let mut obs = envs.reset(recipe.seed.wrapping_add(1_000_003))?;
    let mut running = vec![0.0f64; n];
    let mut returns = Vec::with_capacity(wanted);
    let mut rng = SeededRng::new(0);
    let head = policy.head();
    let log_std = policy
        .log_std()
        .map(|t| t.into_data().to_vec::<f32>().unwrap_or_default())
        .unwrap_or_default();
    while returns.len() < wanted {
        if let Some(stats) = obs_stats {
            stats.normalize(&mut obs, ppo.clip_obs);
        }
        let (out, _) = forward(policy, &obs, n, obs_dim, device);
        let width = head.outputs();
        let actions = match head {
            ActionHead::Categorical(_) => BatchActions::Discrete(
                (0..n)
                    .map(|i| sample_categorical(&out[i * width..(i + 1) * width], &mut rng, true).0)
                    .collect(),
            ),
            ActionHead::Gaussian(d) => {
                let mut a = Vec::with_capacity(n * d);
                for i in 0..n {
                    sample_gaussian(&out[i * d..(i + 1) * d], &log_std, &mut rng, true, &mut a);
                }
                if let Some((low, high)) = action_bounds {
                    for (j, x) in a.iter_mut().enumerate() {
                        *x = x.clamp(low[j % d], high[j % d]);
                    }
                }
                BatchActions::Continuous(a)
            }
        };
        let step = envs.step(&actions)?;
        for (i, total) in running.iter_mut().enumerate() {
            *total += step.rewards[i];
            if step.terminated[i] || step.truncated[i] {
                returns.push(*total);
                *total = 0.0;
            }
        }
        obs = step.observations;
    }
    returns.truncate(wanted);
    Ok(returns.iter().sum::<f64>() / wanted as f64)
}

/// Writes the policy's parameters as `policy.safetensors`.
fn save_policy<B: Backend>(policy: &ActorCritic<B>, dir: &Path) -> Result<(), TrainError> {
    rein_model::safetensors_file::save_module(policy, &dir.join("policy.safetensors")).map_err(TrainError::Io)
}
