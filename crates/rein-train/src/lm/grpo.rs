//! The GRPO family (GRPO, Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++), one step in algorithm
//! order: sample prompts → generate G completions each → score groups with the reward plugins
//! (resampling groups without signal, DAPO) → outcome advantages (KL folded into the reward
//! when asked; GiGPO's per-turn ones for multi-turn episodes) → μ gradient steps on the policy loss against the sampling-time
//! log-probabilities → log.

use std::collections::BTreeMap;
use std::time::Duration;

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use rein_core::{AdvantageKind, FailureCounts, Group, LagCorrection, ToolErrorKind};
use rein_model::AutodiffBackend;
use rein_model::lm::{CausalLm, LmTokenizer};
use rein_optim::{
    Correction, GigpoConfig, LinearSchedule, PolicyLossConfig, clip_grad_norm, group_normalized, kl_estimate_scalar,
    lag_correction, policy_loss, reinforce_pp, rloo, zero_variance,
};
use rein_recipe::{GrpoSection, OptimizerSection, SamplerSection};
use rein_sampler::{FinishReason, GenerationConfig, Generator, NativeGenerator, SeededRng};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::batch::{TokenBatch, completion_log_probs};
use super::episodes::{Agent, Episode, TurnRecord, play};
use super::rewards::{GroupReward, WeightedReward, score_groups};
use super::rollout_source::{Job, RolloutSource};
use super::turn_advantages::{EpisodeTurns, token_advantages};
use super::{Prompt, completion_text};
use crate::TrainError;
use crate::checkpoint::{Checkpoint, learner_sections};
use crate::driver::{Algorithm, Record, Snapshot, Step};
use crate::watchdog::Phases;

/// Where a GRPO run's time went and how it ended.
#[derive(Debug, Clone, Default)]
pub struct GrpoOutcome {
    /// Steps performed.
    pub steps: usize,
    /// Sampling completions.
    pub generate: Duration,
    /// Scoring them with the reward plugins.
    pub reward: Duration,
    /// Forward/backward passes and optimiser steps (and the KL reference's forward passes).
    pub train: Duration,
    /// Mean reward over the last 10% of steps.
    pub final_reward: f64,
}

/// Everything a GRPO run needs besides the model.
pub struct GrpoContext<'a> {
    /// The tokenizer.
    pub tokenizer: &'a LmTokenizer,
    /// Training prompts.
    pub prompts: &'a [Prompt],
    /// Reward functions, weighted.
    pub rewards: &'a mut [WeightedReward],
    /// Algorithm settings.
    pub grpo: &'a GrpoSection,
    /// Sampling settings.
    pub sampler: &'a SamplerSection,
    /// Optimiser settings.
    pub optimizer: &'a OptimizerSection,
    /// Seed.
    pub seed: u64,
    /// Tools and a text environment: episodes of several turns instead of one completion.
    pub agent: Option<&'a mut Agent>,
}

/// Training prompts in a shuffled order, reshuffled after each pass (epoch).
#[derive(Clone, Serialize, Deserialize)]
struct PromptOrder {
    order: Vec<usize>,
    cursor: usize,
}

impl PromptOrder {
    fn new(prompts: usize, rng: &mut SeededRng) -> Self {
        let mut order: Vec<usize> = (0..prompts).collect();
        rng.shuffle(&mut order);
        Self { order, cursor: 0 }
    }

    fn next(&mut self, rng: &mut SeededRng) -> usize {
        if self.cursor == self.order.len() {
            rng.shuffle(&mut self.order);
            self.cursor = 0;
        }
        self.cursor += 1;
        self.order[self.cursor - 1]
    }
}

/// What a GRPO step carries to the next besides the model and optimiser (a checkpoint's
/// `state` section).
#[derive(Clone, Serialize, Deserialize)]
struct GrpoState {
    rng: SeededRng,
    prompt_order: PromptOrder,
    /// Each step's mean reward.
    rewards: Vec<f64>,
    /// Multi-turn episodes started so far (the text environment's episode ids).
    #[serde(default)]
    episodes: u64,
    /// Updates so far: the version of the policy being trained.
    #[serde(default)]
    version: u64,
}

/// One sampled completion, or one multi-turn episode: its opening, then everything after it.
struct Rollout {
    opening: Vec<u32>,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    /// Which of `tokens` the model sampled (`None`: all of them).
    trained: Option<Vec<bool>>,
    truncated: bool,
    /// What reward plugins score.
    text: String,
    /// The text environment's reward and components.
    env_reward: Option<(f64, BTreeMap<String, f64>)>,
    /// The model's turns (`end` counted from the start of `tokens`); empty for single-turn.
    turns: Vec<TurnRecord>,
    /// The version of the policy that sampled it.
    version: u64,
}

/// One sampled, scored group.
struct Scored {
    rollouts: Vec<Rollout>,
    rewards: Vec<f64>,
    components: BTreeMap<String, Vec<f64>>,
}

/// What multi-turn episodes did in a step.
#[derive(Default)]
struct EpisodeStats {
    episodes: usize,
    turns: usize,
    tool_calls: usize,
    tool_errors: BTreeMap<&'static str, usize>,
    env_token_share: f64,
    truncated: usize,
}

impl EpisodeStats {
    fn add(&mut self, episode: &Episode) {
        self.episodes += 1;
        self.turns += episode.turns;
        self.tool_calls += episode.tool_calls;
        for (kind, count) in &episode.tool_errors {
            *self.tool_errors.entry(kind).or_default() += count;
        }
        self.env_token_share += episode.transcript.env_token_share();
        self.truncated += usize::from(episode.truncated);
    }

    /// The step's `episode/…` metrics.
    fn record(&self, record: &mut Record) {
        let per = |x: f64| x / self.episodes.max(1) as f64;
        record.insert("episode/turns".into(), json!(per(self.turns as f64)));
        record.insert("episode/tool_calls".into(), json!(per(self.tool_calls as f64)));
        record.insert("episode/env_token_share".into(), json!(per(self.env_token_share)));
        record.insert("episode/truncated_frac".into(), json!(per(self.truncated as f64)));
        for kind in ToolErrorKind::ALL {
            let count = self.tool_errors.get(kind.as_str()).copied().unwrap_or(0);
            record.insert(format!("episode/tool_errors/{}", kind.as_str()), json!(count));
        }
    }
}

/// A step's groups and what sampling them took.
#[derive(Default)]
struct Sampled {
    batch: Vec<Scored>,
    /// Groups whose rewards were all equal (no signal).
    degenerate: usize,
    /// Groups sampled, resampled ones included.
    groups: usize,
    /// Groups without signal that dynamic sampling dropped and replaced.
    resampled: usize,
    /// Tokens the model sampled.
    tokens: usize,
    /// Reward failures absorbed by `on_error`.
    failures: usize,
    /// Multi-turn episodes' figures.
    episodes: Option<EpisodeStats>,
}

/// The GRPO family on a language model.
pub struct Grpo<'a, B: AutodiffBackend> {
    /// The policy being trained.
    pub model: CausalLm<B>,
    optim: OptimizerAdaptor<AdamW, CausalLm<B>, B>,
    /// The frozen starting policy, for the KL term (none when β = 0).
    reference: Option<CausalLm<B::InnerBackend>>,
    ctx: GrpoContext<'a>,
    /// Single-turn completions: the native sampler or inference servers, possibly ahead of
    /// training (multi-turn episodes are played in process).
    source: Option<RolloutSource<B::InnerBackend>>,
    /// The last step whose prompts were submitted to `source`, with the prompts of the steps
    /// submitted and not yet taken.
    submitted: usize,
    in_flight: std::collections::VecDeque<Vec<usize>>,
    loss_config: PolicyLossConfig,
    lr: LinearSchedule,
    pad: u32,
    state: GrpoState,
    device: B::Device,
}

impl<'a, B: AutodiffBackend> Grpo<'a, B> {
    /// GRPO from `model` (also the KL reference when β ≠ 0), sampling in process.
    pub fn new(model: CausalLm<B>, ctx: GrpoContext<'a>, device: &B::Device) -> Result<Self, TrainError> {
        let native = Box::new(NativeGenerator::<B::InnerBackend>::new(ctx.tokenizer.clone(), device));
        Self::with_generator(model, ctx, native, device)
    }

    /// GRPO whose single-turn completions come from `generator`, running up to
    /// `algorithm.max_staleness` steps ahead of training.
    pub fn with_generator(
        model: CausalLm<B>,
        ctx: GrpoContext<'a>,
        generator: Box<dyn Generator<B::InnerBackend>>,
        device: &B::Device,
    ) -> Result<Self, TrainError> {
        let (grpo, sampler, optimizer) = (ctx.grpo, ctx.sampler, ctx.optimizer);
        if grpo.advantage == AdvantageKind::Rloo && sampler.n < 2 {
            return Err(TrainError::Unsupported("RLOO needs sampler.n ≥ 2".into()));
        }
        if grpo.advantage == AdvantageKind::Gigpo && ctx.agent.is_none() {
            return Err(TrainError::Unsupported(
                "algorithm.advantage = \"gigpo\" needs multi-turn episodes (an [agent] section)".into(),
            ));
        }
        let optim = AdamWConfig::new()
            .with_beta_1(optimizer.beta1)
            .with_beta_2(optimizer.beta2)
            .with_epsilon(optimizer.eps)
            .with_weight_decay(optimizer.weight_decay)
            .init::<B, CausalLm<B>>();
        let loss_config = PolicyLossConfig {
            level: grpo.ratio_level,
            clip_low: grpo.clip_low,
            clip_high: grpo.clip_high,
            dual_clip: grpo.dual_clip,
            aggregation: grpo.aggregation,
            max_completion_len: sampler.max_new_tokens,
            kl_coef: if grpo.kl_in_reward { 0.0 } else { grpo.kl_coef },
            kl_estimator: grpo.kl_estimator,
            kl_importance_weighted: grpo.kl_importance_weighted,
            entropy_coef: grpo.entropy_coef,
        };
        let lr = match optimizer.anneal_lr {
            Some(true) => LinearSchedule {
                start: optimizer.lr,
                end: 0.0,
                updates: grpo.steps,
            },
            _ => LinearSchedule::constant(optimizer.lr),
        };
        let mut rng = SeededRng::new(ctx.seed ^ 0x6A09_E667);
        let prompt_order = PromptOrder::new(ctx.prompts.len(), &mut rng);
        let source = match ctx.agent {
            Some(_) => None,
            None => Some(
                RolloutSource::new(generator, &model.valid(), 0, grpo.max_staleness)
                    .map_err(|error| TrainError::generator(0, error))?,
            ),
        };
        Ok(Self {
            source,
            submitted: 0,
            in_flight: Default::default(),
            reference: (grpo.kl_coef != 0.0).then(|| model.valid()),
            model,
            optim,
            pad: ctx.tokenizer.pad_id().unwrap_or(0),
            ctx,
            loss_config,
            lr,
            state: GrpoState {
                rng,
                prompt_order,
                rewards: Vec::new(),
                episodes: 0,
                version: 0,
            },
            device: device.clone(),
        })
    }

    /// The run's outcome once the driver is done, with its phase timings.
    pub fn outcome(&self, steps: usize, phases: &std::collections::BTreeMap<String, Duration>) -> GrpoOutcome {
        let phase = |name: &str| phases.get(name).copied().unwrap_or_default();
        let tail = (self.state.rewards.len() / 10).max(1);
        GrpoOutcome {
            steps,
            generate: phase("generate"),
            reward: phase("reward"),
            train: phase("reference") + phase("forward") + phase("backward") + phase("optimizer"),
            final_reward: self.state.rewards.iter().rev().take(tail).sum::<f64>() / tail as f64,
        }
    }

    /// SAMPLE and SCORE: `prompts_per_step` groups of `n` completions, scored; with dynamic
    /// sampling, groups without reward variance are replaced by new prompts (at most
    /// `max_resample` more rounds).
    fn sample(&mut self, step: usize, phases: &Phases) -> Result<Sampled, TrainError> {
        let (grpo, sampler, tokenizer) = (self.ctx.grpo, self.ctx.sampler, self.ctx.tokenizer);
        let (g, prompts) = (sampler.n, self.ctx.prompts);
        let mut out = Sampled::default();
        for round in 0..=grpo.max_resample {
            let want = grpo.prompts_per_step - out.batch.len();
            if want == 0 || (round > 0 && !grpo.dynamic_sampling) {
                break;
            }
            let config = |step: usize, round: usize| GenerationConfig {
                max_new_tokens: sampler.max_new_tokens,
                temperature: sampler.temperature,
                top_k: sampler.top_k,
                top_p: sampler.top_p,
                min_p: sampler.min_p,
                n: g,
                stop_token_ids: tokenizer.eos_ids().to_vec(),
                seed: generation_seed(self.ctx.seed, step, round),
            };
            let (picked, rollouts) = match (self.ctx.agent.as_deref_mut(), self.source.as_mut()) {
                (Some(agent), _) => {
                    let picked: Vec<usize> = (0..want)
                        .map(|_| self.state.prompt_order.next(&mut self.state.rng))
                        .collect();
                    let _generating = phases.enter("generate", format!("sampling {} episodes", want * g));
                    let chosen: Vec<&Prompt> = picked.iter().map(|&i| &prompts[i]).collect();
                    let first_id = self.state.episodes;
                    let policy = self.model.valid();
                    let config = config(step, round);
                    let episodes = play(&policy, tokenizer, agent, &chosen, &config, first_id, &self.device)?;
                    self.state.episodes += episodes.len() as u64;
                    let stats = out.episodes.get_or_insert_with(EpisodeStats::default);
                    episodes.iter().for_each(|e| stats.add(e));
                    let version = self.state.version;
                    let rollouts = (episodes.into_iter())
                        .map(|e| Rollout {
                            version,
                            ..Rollout::from(e)
                        })
                        .collect::<Vec<_>>();
                    (picked, rollouts)
                }
                (None, Some(source)) => {
                    // Round 0 of each step is submitted ahead (up to max_staleness steps);
                    // dynamic sampling's extra rounds (synchronous runs only) right away.
                    let (first, last) = match round {
                        0 => (self.submitted + 1, (step + source.max_staleness()).min(grpo.steps)),
                        _ => (step, step),
                    };
                    for ahead in first..=last {
                        let count = if round == 0 { grpo.prompts_per_step } else { want };
                        let picked: Vec<usize> = (0..count)
                            .map(|_| self.state.prompt_order.next(&mut self.state.rng))
                            .collect();
                        source.submit(Job {
                            step: ahead,
                            prompts: picked.iter().map(|&i| prompts[i].tokens.clone()).collect(),
                            config: config(ahead, round),
                            stops: sampler.stop.clone(),
                        });
                        self.in_flight.push_back(picked);
                        if round == 0 {
                            self.submitted = ahead;
                        }
                    }
                    let _generating = phases.enter(
                        "generate",
                        format!(
                            "waiting for {} completions of step {step} from {}",
                            want * g,
                            source.describe()
                        ),
                    );
                    let produced = source.take().map_err(|error| TrainError::generator(step, error))?;
                    debug_assert_eq!(produced.step, step, "completions come back in step order");
                    let picked = self.in_flight.pop_front().unwrap_or_default();
                    let ids: Vec<&Vec<u32>> = picked.iter().map(|&i| &prompts[i].tokens).collect();
                    let rollouts = (produced.generations.into_iter())
                        .map(|x| Rollout {
                            opening: ids[x.prompt].clone(),
                            text: completion_text(tokenizer, &x.tokens, &sampler.stop),
                            truncated: x.finish == FinishReason::Length,
                            tokens: x.tokens,
                            logprobs: x.logprobs,
                            trained: None,
                            env_reward: None,
                            turns: Vec::new(),
                            version: produced.version,
                        })
                        .collect();
                    (picked, rollouts)
                }
                (None, None) => unreachable!("single-turn GRPO always has a rollout source"),
            };
            out.tokens += rollouts.iter().map(Rollout::sampled).sum::<usize>();

            let scoring = phases.enter("reward", format!("scoring {} groups", picked.len()));
            let groups: Vec<Group> = picked
                .iter()
                .zip(rollouts.chunks(g))
                .map(|(&i, group)| Group {
                    prompt: prompts[i].text.clone(),
                    completions: group.iter().map(|x| x.text.clone()).collect(),
                    reference: prompts[i].answer.clone(),
                    metadata: with_token_counts(&prompts[i].metadata, group.iter().map(|x| x.tokens.len())),
                })
                .collect();
            let (mut scores, absorbed) =
                score_groups(self.ctx.rewards, &groups, grpo.on_error).map_err(|(group, error)| {
                    TrainError::Reward {
                        step,
                        prompt: groups[group].prompt.clone(),
                        error: Box::new(error),
                    }
                })?;
            drop(scoring);
            for failure in &absorbed {
                let prompt = &groups[failure.group].prompt;
                match failure.completion {
                    Some(c) => eprintln!(
                        "step {step}: {} (prompt {prompt:?}, completion {c}); scored 0",
                        failure.error
                    ),
                    None => eprintln!(
                        "step {step}: {} (prompt {prompt:?}); on_error = {:?}",
                        failure.error, grpo.on_error
                    ),
                }
            }
            out.failures += absorbed.len();
            add_env_rewards(&mut scores, &rollouts, g);
            let mut rollouts = rollouts.into_iter();
            for scored in scores {
                let group: Vec<Rollout> = rollouts.by_ref().take(g).collect();
                out.groups += 1;
                if scored.skipped {
                    continue;
                }
                let totals: Vec<f32> = scored.total.iter().map(|&r| r as f32).collect();
                let is_degenerate = zero_variance(&totals);
                out.degenerate += usize::from(is_degenerate);
                if grpo.dynamic_sampling && is_degenerate && round < grpo.max_resample {
                    out.resampled += 1;
                    continue;
                }
                out.batch.push(Scored {
                    rollouts: group,
                    rewards: scored.total,
                    components: scored.components,
                });
            }
        }
        Ok(out)
    }

    /// ADVANTAGES and LEARN: the outcome advantages of the batch (with −β·KL folded into the
    /// rewards when asked), then μ gradient steps. Returns the record's training entries.
    fn learn(&mut self, step: usize, batch: &[Scored], phases: &Phases) -> Result<Record, TrainError> {
        let (grpo, sampler) = (self.ctx.grpo, self.ctx.sampler);
        let temperature = sampler.temperature.max(1e-6);
        let flat: Vec<(&Rollout, f64)> = (batch.iter())
            .flat_map(|s| s.rollouts.iter().zip(s.rewards.iter().copied()))
            .collect();
        let pairs: Vec<(&[u32], &[u32])> = (flat.iter())
            .map(|(r, _)| (r.opening.as_slice(), r.tokens.as_slice()))
            .collect();
        let mut tokens = TokenBatch::new(&pairs, self.pad);
        for (row, (rollout, _)) in flat.iter().enumerate() {
            if let Some(trained) = &rollout.trained {
                tokens.keep_in_loss(row, trained);
            }
        }
        let [rows, width] = [tokens.rows, tokens.completion_width];
        let reference_log_probs: Option<Vec<f32>> = self.reference.as_ref().map(|r| {
            let _phase = phases.enter("reference", "the reference policy's log-probabilities");
            let (lp, _) = completion_log_probs(r, &tokens, temperature, false, &self.device);
            lp.into_data().convert::<f32>().to_vec().unwrap_or_default()
        });
        let mut rewards: Vec<f32> = flat.iter().map(|&(_, reward)| reward as f32).collect();
        let old: Vec<&[f32]> = flat.iter().map(|(r, _)| r.logprobs.as_slice()).collect();
        let kl_in_reward = match &reference_log_probs {
            Some(reference) if grpo.kl_in_reward => {
                Some(self.fold_kl_into_rewards(&mut rewards, &old, reference, &tokens.completion_mask, width))
            }
            _ => None,
        };
        let g = sampler.n;
        let per_sequence = |advantages: Vec<f32>| -> Vec<f32> {
            advantages
                .into_iter()
                .flat_map(|a| std::iter::repeat_n(a, width))
                .collect()
        };
        // One advantage per completion token, `[rows, width]`.
        let advantages: Vec<f32> = match grpo.advantage {
            AdvantageKind::Group => per_sequence(group_normalized(&rewards, g, grpo.std_scaling)),
            AdvantageKind::Rloo => per_sequence(rloo(&rewards, g)),
            AdvantageKind::ReinforcePp => per_sequence(reinforce_pp(&rewards, g, grpo.group_baseline)),
            AdvantageKind::Gigpo => {
                let config = GigpoConfig {
                    gamma: grpo.step_gamma,
                    step_weight: grpo.step_advantage_weight,
                    scale_by_std: grpo.std_scaling != rein_core::StdScaling::None,
                };
                let episodes: Vec<EpisodeTurns> = (flat.iter().zip(&rewards))
                    .map(|((rollout, _), &reward)| EpisodeTurns {
                        turns: &rollout.turns,
                        reward,
                        len: rollout.tokens.len(),
                    })
                    .collect();
                (episodes.chunks(g))
                    .flat_map(|group| token_advantages(group, config))
                    .flat_map(|mut row| {
                        row.resize(width, 0.0);
                        row
                    })
                    .collect()
            }
        };
        let mut advantages = advantages;
        let mut mask = tokens.completion_mask.clone();
        if grpo.mask_truncated {
            for (row, (rollout, _)) in flat.iter().enumerate() {
                if rollout.truncated {
                    mask[row * width..(row + 1) * width].fill(0.0);
                }
            }
        }

        let sampled_log_prob = tokens.per_token_values(&old);
        let mut old_log_prob =
            Tensor::<B, 2>::from_data(TensorData::new(sampled_log_prob.clone(), [rows, width]), &self.device);
        let tensor = |values: &[f32], device: &B::Device| {
            Tensor::<B, 2>::from_data(TensorData::new(values.to_vec(), [rows, width]), device)
        };
        let mut mask_tensor = tensor(&mask, &self.device);
        let mut advantage_tensor = tensor(&advantages, &self.device);
        let correction = Correction {
            kind: grpo.correction,
            level: grpo.correction_level,
            tis_cap: grpo.tis_cap,
            icepop_bounds: grpo.icepop_bounds,
        };
        let mut mismatch = Record::new();
        let reference = reference_log_probs
            .filter(|_| !grpo.kl_in_reward)
            .map(|lp| Tensor::<B, 2>::from_data(TensorData::new(lp, [rows, width]), &self.device));
        let mut record = Record::new();
        for update in 0..grpo.updates_per_batch.max(1) {
            self.model
                .set_dropout_key(generation_seed(self.ctx.seed ^ DROPOUT_SALT, step, update));
            let graph = rein_model::one_graph();
            let forward = phases.enter("forward", format!("the policy loss of {rows} completions"));
            let entropy_wanted = grpo.entropy_coef != 0.0;
            let (log_prob, entropy) =
                completion_log_probs(&self.model, &tokens, temperature, entropy_wanted, &self.device);
            if update == 0 {
                // The trainer's own log-probabilities before this batch's updates, against the
                // sampler's: the mismatch, and with a correction the PPO ratio's denominator.
                let trainer: Vec<f32> = log_prob
                    .clone()
                    .detach()
                    .into_data()
                    .convert::<f32>()
                    .to_vec()
                    .unwrap_or_default();
                let corrected = lag_correction(&trainer, &sampled_log_prob, &mask, width, &correction);
                mismatch.insert("train/mismatch_kl".into(), json!(corrected.mismatch_kl));
                if grpo.correction != LagCorrection::None {
                    mismatch.insert("train/correction_masked_frac".into(), json!(corrected.masked_frac));
                    mismatch.insert("train/correction_capped_frac".into(), json!(corrected.capped_frac));
                    for (i, a) in advantages.iter_mut().enumerate() {
                        *a *= corrected.weights[i];
                    }
                    for (i, m) in mask.iter_mut().enumerate() {
                        *m *= corrected.keep[i];
                    }
                    advantage_tensor = tensor(&advantages, &self.device);
                    mask_tensor = tensor(&mask, &self.device);
                    old_log_prob = log_prob.clone().detach();
                }
            }
            let (mask, advantages) = (&mask_tensor, &advantage_tensor);
            let entropy_value = entropy.as_ref().map(|h| {
                let mean = (h.clone().detach() * mask.clone())
                    .sum()
                    .div(mask.clone().sum().clamp_min(1.0));
                mean.into_scalar().elem::<f64>()
            });
            let out = policy_loss(
                log_prob,
                old_log_prob.clone(),
                advantages.clone(),
                mask.clone(),
                reference.clone(),
                entropy,
                &self.loss_config,
            );
            let loss_value: f32 = out.loss.clone().into_scalar().elem();
            TrainError::check_loss(step, "policy loss", loss_value)?;
            drop(forward);
            let backward = phases.enter("backward", "the policy loss's gradients");
            let mut grads = GradientsParams::from_grads(out.loss.backward(), &self.model);
            drop((backward, graph));
            let _optimizer = phases.enter("optimizer", "clipping and applying the gradients");
            let grad_norm = clip_grad_norm(&self.model, &mut grads, self.ctx.optimizer.max_grad_norm);
            TrainError::check_gradients(step, grad_norm, &self.model, &grads)?;
            self.model = self.optim.step(self.lr.at(step), self.model.clone(), grads);
            record = json!({
                "train/loss": loss_value,
                "train/clip_frac": out.clip_frac.into_scalar().elem::<f64>(),
                "train/grad_norm": grad_norm,
                "train/kl": out.kl.map(|k| k.into_scalar().elem::<f64>()),
                "train/entropy": entropy_value,
            })
            .as_object()
            .cloned()
            .unwrap_or_default();
        }
        record.extend(mismatch);
        let lag: Vec<f64> = (flat.iter())
            .map(|(r, _)| self.state.version.saturating_sub(r.version) as f64)
            .collect();
        record.insert("train/policy_lag".into(), json!(mean(&lag)));
        record.insert(
            "train/policy_lag_max".into(),
            json!(lag.iter().copied().fold(0.0, f64::max)),
        );
        if let Some((kl, penalty)) = kl_in_reward {
            record.insert("train/kl".into(), json!(kl));
            record.insert("train/kl_penalty".into(), json!(penalty));
        }
        let mean_reward = rewards.iter().map(|&r| f64::from(r)).sum::<f64>() / rewards.len() as f64;
        self.state.rewards.push(mean_reward);
        let lengths: Vec<f64> = flat.iter().map(|(r, _)| r.tokens.len() as f64).collect();
        let truncated = flat.iter().filter(|(r, _)| r.truncated).count();
        record.insert("train/reward".into(), json!(mean_reward));
        record.insert("train/completion_length".into(), json!(mean(&lengths)));
        record.insert(
            "train/truncated_frac".into(),
            json!(truncated as f64 / flat.len() as f64),
        );
        record.insert("train/learning_rate".into(), json!(self.lr.at(step)));
        Ok(record)
    }

    /// Hands the generator the policy after step `step` when it will sample again from it
    /// (every `sampler.sync_every` steps, and never after the last).
    fn publish(&mut self, step: usize, phases: &Phases) -> Result<(), TrainError> {
        let Some(source) = self.source.as_mut() else {
            return Ok(());
        };
        if step >= self.ctx.grpo.steps || !step.is_multiple_of(self.ctx.sampler.sync_every) {
            return Ok(());
        }
        let _sync = phases.enter(
            "sync",
            format!("handing policy version {step} to {}", source.describe()),
        );
        (source.publish(&self.model.valid(), step as u64)).map_err(|error| TrainError::generator(step, error))
    }

    /// The KL in the reward: `r_i − β Σ_t KL_t` for each completion, over the tokens the
    /// model sampled (`mask`), from their sampled log-probabilities and the reference's (both
    /// `[rows, width]`). Returns the mean KL per token and the mean penalty per completion, for
    /// the log.
    fn fold_kl_into_rewards(
        &self,
        rewards: &mut [f32],
        sampled: &[&[f32]],
        reference: &[f32],
        mask: &[f32],
        width: usize,
    ) -> (f64, f64) {
        let grpo = self.ctx.grpo;
        let (mut kl_total, mut kl_tokens, mut penalty) = (0.0f64, 0usize, 0.0f64);
        for (row, (reward, log_probs)) in rewards.iter_mut().zip(sampled).enumerate() {
            let counted = (0..log_probs.len()).filter(|&t| mask[row * width + t] > 0.0);
            let kl: f32 = counted
                .clone()
                .map(|t| kl_estimate_scalar(log_probs[t], reference[row * width + t], grpo.kl_estimator))
                .sum();
            *reward -= grpo.kl_coef * kl;
            kl_total += f64::from(kl);
            kl_tokens += counted.count();
            penalty += f64::from(grpo.kl_coef * kl);
        }
        (kl_total / kl_tokens.max(1) as f64, penalty / rewards.len() as f64)
    }
}

impl<B: AutodiffBackend> Algorithm for Grpo<'_, B> {
    fn total_steps(&self) -> usize {
        self.ctx.grpo.steps
    }

    fn step(&mut self, step: usize, phases: &Phases) -> Result<Step, TrainError> {
        let started = phases.elapsed();
        let sampled = self.sample(step, phases)?;
        let mut record = match sampled.batch.is_empty() {
            true => {
                eprintln!("step {step}: every group was skipped; nothing to learn from");
                Record::new()
            }
            false => self.learn(step, &sampled.batch, phases)?,
        };
        // The policy after step k is version k (a step without groups leaves it unchanged).
        self.state.version = step as u64;
        self.publish(step, phases)?;
        let seconds = (phases.elapsed() - started).as_secs_f64();
        record.insert("step".into(), json!(step));
        record.insert(
            "train/zero_variance_frac".into(),
            json!(sampled.degenerate as f64 / sampled.groups.max(1) as f64),
        );
        record.insert("train/resampled_groups".into(), json!(sampled.resampled));
        record.insert("train/reward_failures".into(), json!(sampled.failures));
        record.insert(
            "train/tokens_per_s".into(),
            json!(sampled.tokens as f64 / seconds.max(1e-9)),
        );
        for (name, value) in component_means(&sampled.batch) {
            record.insert(format!("train/reward/{name}"), json!(value));
        }
        if let Some(stats) = &sampled.episodes {
            stats.record(&mut record);
        }
        Ok(Step { record, done: false })
    }

    fn snapshot(&self) -> Snapshot {
        let (model, optim, state) = (self.model.clone(), self.optim.clone(), self.state.clone());
        Box::new(move || learner_sections::<B, CausalLm<B>, _, _>(&state, &model, &optim))
    }

    fn restore(&mut self, checkpoint: &Checkpoint) -> Result<(), TrainError> {
        // The KL reference stays the model GRPO started from, as in the first run.
        (self.state, self.model, self.optim) =
            checkpoint.load_learner(self.model.clone(), self.optim.clone(), &self.device)?;
        // Older checkpoints have no version: one update per step.
        self.state.version = self.state.version.max(self.state.rewards.len() as u64);
        let version = self.state.version;
        self.submitted = version as usize;
        if let Some(source) = self.source.as_mut() {
            let error = |error| TrainError::generator(version as usize, error);
            source.publish(&self.model.valid(), version).map_err(error)?;
        }
        Ok(())
    }

    fn non_finite_parameter(&self) -> Option<String> {
        rein_optim::non_finite_parameter(&self.model)
    }

    fn progress(&self, step: usize, record: &Record) -> String {
        let value = |key: &str| record.get(key).and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
        format!(
            "grpo step {step}/{} | reward {:.3} | {:.2} s/step",
            self.ctx.grpo.steps,
            value("train/reward"),
            value("time/step_s")
        )
    }

    fn plugin_failures(&self) -> Vec<(String, FailureCounts)> {
        let mut out: Vec<(String, FailureCounts)> = Vec::new();
        for weighted in self.ctx.rewards.iter() {
            let name = weighted.reward.name().to_string();
            match out.iter_mut().find(|(n, _)| *n == name) {
                Some((_, counts)) => *counts = counts.plus(weighted.reward.failures()),
                None => out.push((name, weighted.reward.failures())),
            }
        }
        out
    }
}

/// The sampler's seed for round `round` of step `step` (and LoRA dropout's key, from another
/// `seed`, for update `round` of a step): distinct for every (step, round).
/// Sets LoRA dropout's keys apart from the sampler's seeds.
pub(crate) const DROPOUT_SALT: u64 = 0xD80F_0A7C;

pub(crate) fn generation_seed(seed: u64, step: usize, round: usize) -> u64 {
    let mix = |mut z: u64| {
        // SplitMix64's finaliser.
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    mix(mix(seed ^ mix(step as u64)) ^ round as u64)
}

impl Rollout {
    /// Tokens the model sampled (not those a tool or the environment added).
    fn sampled(&self) -> usize {
        match &self.trained {
            Some(trained) => trained.iter().filter(|&&t| t).count(),
            None => self.tokens.len(),
        }
    }
}

impl From<Episode> for Rollout {
    fn from(episode: Episode) -> Self {
        let transcript = &episode.transcript;
        let at = transcript.prompt_len();
        Self {
            opening: transcript.tokens()[..at].to_vec(),
            tokens: transcript.tokens()[at..].to_vec(),
            logprobs: transcript.log_probs()[at..].to_vec(),
            trained: Some(transcript.sampled()[at..].to_vec()),
            truncated: episode.truncated,
            text: episode.text,
            env_reward: episode.env_reward.map(|r| (r, episode.env_components)),
            turns: (episode.turn_log.into_iter())
                .map(|t| TurnRecord { end: t.end - at, ..t })
                .collect(),
            version: 0,
        }
    }
}

/// Adds the text environment's rewards to the plugins' (groups of `g` rollouts in order), its
/// components as `env/<name>`.
fn add_env_rewards(scores: &mut [GroupReward], rollouts: &[Rollout], g: usize) {
    for (scored, group) in scores.iter_mut().zip(rollouts.chunks(g)) {
        for (c, rollout) in group.iter().enumerate() {
            let Some((reward, components)) = &rollout.env_reward else {
                continue;
            };
            scored.total[c] += reward;
            for (name, value) in components {
                let values = (scored.components)
                    .entry(format!("env/{name}"))
                    .or_insert_with(|| vec![f64::NAN; group.len()]);
                values[c] = *value;
            }
        }
    }
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// Each reward component's mean over the batch's completions (NaN entries, where a reward did
/// not apply, left out); `None` when no completion had one.
fn component_means(batch: &[Scored]) -> std::collections::BTreeMap<String, Option<f64>> {
    let mut sums: std::collections::BTreeMap<String, (f64, usize)> = Default::default();
    for scored in batch {
        for (name, values) in &scored.components {
            let entry = sums.entry(name.clone()).or_default();
            for v in values.iter().filter(|v| v.is_finite()) {
                entry.0 += v;
                entry.1 += 1;
            }
        }
    }
    sums.into_iter()
        .map(|(name, (sum, count))| (name, (count > 0).then(|| sum / count as f64)))
        .collect()
}

/// Adds `completion_tokens` (each completion's length in tokens) to a group's metadata, for
/// rewards that count tokens (the `length-penalty` plugin's `unit = "tokens"`).
fn with_token_counts(metadata: &str, lengths: impl Iterator<Item = usize>) -> String {
    let mut value = match serde_json::from_str::<serde_json::Value>(metadata) {
        Ok(serde_json::Value::Object(map)) => serde_json::Value::Object(map),
        _ => json!({}),
    };
    value["completion_tokens"] = json!(lengths.collect::<Vec<_>>());
    value.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_seeds_never_collide_across_steps_and_rounds() {
        let mut seen = std::collections::HashSet::new();
        for step in 1..=500 {
            for round in 0..=40 {
                assert!(
                    seen.insert(generation_seed(1, step, round)),
                    "step {step} round {round}"
                );
            }
        }
    }
}
