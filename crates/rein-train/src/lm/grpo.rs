//! The GRPO family (GRPO, Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++), in algorithm order:
//! sample prompts → generate G completions each → score groups with the reward plugins →
//! outcome advantages → (optionally resample degenerate groups) → μ gradient steps on the
//! policy loss → log.

use std::time::{Duration, Instant};

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use rein_core::Group;
use rein_model::AutodiffBackend;
use rein_model::lm::{CausalLm, LmTokenizer};
use rein_optim::{
    PolicyLossConfig, clip_grad_norm, group_normalized, kl_estimate_scalar, policy_loss, reinforce_pp, rloo,
    zero_variance,
};
use rein_sampler::{FinishReason, GenerationConfig, SeededRng, generate};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::batch::{TokenBatch, completion_log_probs};
use super::rewards::{WeightedReward, score_groups};
use super::{Prompt, completion_text, stop_check};
use crate::MetricsWriter;
use crate::checkpoint::{Checkpointing, module_bytes, optimizer_bytes};
use crate::ppo::TrainError;
use crate::progress::Progress;
use rein_recipe::{AdvantageKind, GrpoSection, OptimizerSection, SamplerSection};

/// Where a GRPO run's time went and how it ended.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GrpoOutcome {
    /// Steps performed.
    pub steps: usize,
    /// Sampling completions.
    pub generate: Duration,
    /// Scoring them with the reward plugins.
    pub reward: Duration,
    /// Forward/backward passes and optimiser steps.
    pub train: Duration,
    /// Mean reward over the last 10% of steps.
    pub final_reward: f64,
}

/// One sampled, scored group.
struct Scored {
    prompt: usize,
    completions: Vec<Vec<u32>>,
    logprobs: Vec<Vec<f32>>,
    truncated: Vec<bool>,
    rewards: Vec<f64>,
    components: std::collections::BTreeMap<String, Vec<f64>>,
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
    /// Checkpoints to write, and the one to resume from.
    pub checkpointing: &'a Checkpointing,
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

/// What a GRPO run carries from step to step besides the model and optimiser: the `state`
/// section of its checkpoints.
#[derive(Serialize, Deserialize)]
struct GrpoState {
    step: usize,
    metrics_len: u64,
    rng: SeededRng,
    prompt_order: PromptOrder,
    recent_rewards: Vec<f64>,
    outcome: GrpoOutcome,
    elapsed_s: f64,
}

/// Trains `model` with the GRPO family.
pub fn train_grpo<B: AutodiffBackend>(
    mut model: CausalLm<B>,
    ctx: GrpoContext<'_>,
    mut metrics: Option<&mut MetricsWriter>,
    device: &B::Device,
) -> Result<(CausalLm<B>, GrpoOutcome), TrainError> {
    let GrpoContext {
        tokenizer,
        prompts,
        rewards,
        grpo,
        sampler,
        optimizer,
        seed,
        checkpointing,
    } = ctx;
    let g = sampler.n.max(1);
    if grpo.advantage == AdvantageKind::Rloo && g < 2 {
        return Err(TrainError::Unsupported {
            plugin: String::new(),
            message: "RLOO needs sampler.n ≥ 2".into(),
        });
    }
    let reference = (grpo.kl_coef != 0.0).then(|| model.valid());
    let mut optim = AdamWConfig::new()
        .with_beta_1(optimizer.beta1)
        .with_beta_2(optimizer.beta2)
        .with_epsilon(optimizer.eps)
        .with_weight_decay(optimizer.weight_decay)
        .init::<B, CausalLm<B>>();
    let pad = tokenizer.pad_id().unwrap_or(0);
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
    let mut rng = SeededRng::new(seed ^ 0x6A09_E667);
    let prompt_order = PromptOrder::new(prompts.len(), &mut rng);
    let mut state = GrpoState {
        step: 0,
        metrics_len: 0,
        rng,
        prompt_order,
        recent_rewards: Vec::new(),
        outcome: GrpoOutcome::default(),
        elapsed_s: 0.0,
    };
    let mut progress = Progress::new();
    if let Some(checkpoint) = &checkpointing.resume {
        // `reference` was taken above from the model GRPO started from, as in the first run.
        state = checkpoint.state()?;
        model = checkpoint.load_module("model", model, device)?;
        optim = checkpoint.load_optimizer::<B, CausalLm<B>, _>("optimizer", optim, device)?;
    }
    let (first, elapsed_before) = (state.step + 1, state.elapsed_s);
    let start = Instant::now();
    let save = |step: usize,
                model: &CausalLm<B>,
                optim: &OptimizerAdaptor<AdamW, CausalLm<B>, B>,
                state: &mut GrpoState,
                metrics: Option<&MetricsWriter>| {
        state.step = step;
        state.metrics_len = metrics.map_or(0, MetricsWriter::bytes_written);
        state.elapsed_s = elapsed_before + start.elapsed().as_secs_f64();
        checkpointing.after_step(step, grpo.steps, model, || {
            vec![
                ("state", serde_json::to_vec(&*state).expect("the state serialises")),
                ("model", module_bytes(model)),
                ("optimizer", optimizer_bytes::<B, CausalLm<B>, _>(optim)),
            ]
        })
    };
    for step in first..=grpo.steps {
        let step_start = Instant::now();
        let policy = model.valid();

        // SAMPLE and SCORE, resampling groups without signal (DAPO) when asked.
        let mut batch: Vec<Scored> = Vec::new();
        let mut degenerate = 0usize;
        let mut sampled_groups = 0usize;
        let mut tokens_generated = 0usize;
        let mut failures = 0usize;
        for round in 0..=grpo.max_resample {
            let want = grpo.prompts_per_step - batch.len();
            if want == 0 || (round > 0 && !grpo.dynamic_sampling) {
                break;
            }
            let picked: Vec<usize> = (0..want).map(|_| state.prompt_order.next(&mut state.rng)).collect();
            let tick = Instant::now();
            let ids: Vec<Vec<u32>> = picked.iter().map(|&i| prompts[i].tokens.clone()).collect();
            let config = GenerationConfig {
                max_new_tokens: sampler.max_new_tokens,
                temperature: sampler.temperature,
                top_k: sampler.top_k,
                top_p: sampler.top_p,
                min_p: sampler.min_p,
                n: g,
                stop_token_ids: tokenizer.eos_ids().to_vec(),
                seed: seed.wrapping_mul(1_000_003).wrapping_add((step * 16 + round) as u64),
            };
            let generations = generate(
                &policy,
                &ids,
                &config,
                pad,
                &mut stop_check(tokenizer, &sampler.stop),
                device,
            );
            state.outcome.generate += tick.elapsed();
            tokens_generated += generations.iter().map(|x| x.tokens.len()).sum::<usize>();

            let tick = Instant::now();
            let groups: Vec<Group> = picked
                .iter()
                .enumerate()
                .map(|(j, &i)| {
                    let lengths: Vec<usize> = generations[j * g..(j + 1) * g].iter().map(|x| x.tokens.len()).collect();
                    Group {
                        prompt: prompts[i].text.clone(),
                        completions: generations[j * g..(j + 1) * g]
                            .iter()
                            .map(|x| completion_text(tokenizer, &x.tokens, &sampler.stop))
                            .collect(),
                        reference: prompts[i].answer.clone(),
                        metadata: with_token_counts(&prompts[i].metadata, &lengths),
                    }
                })
                .collect();
            let (scores, absorbed) =
                score_groups(rewards, &groups, grpo.on_error).map_err(|(group, error)| TrainError::Reward {
                    step,
                    prompt: groups[group].prompt.clone(),
                    error: Box::new(error),
                })?;
            state.outcome.reward += tick.elapsed();
            for failure in &absorbed {
                eprintln!(
                    "step {step}: {} (prompt {:?}); on_error = {:?}",
                    failure.error, groups[failure.group].prompt, grpo.on_error
                );
            }
            failures += absorbed.len();
            for (j, (&i, scored)) in picked.iter().zip(scores).enumerate() {
                sampled_groups += 1;
                if scored.skipped {
                    continue;
                }
                let totals: Vec<f32> = scored.total.iter().map(|&r| r as f32).collect();
                let is_degenerate = zero_variance(&totals);
                degenerate += usize::from(is_degenerate);
                if grpo.dynamic_sampling && is_degenerate && round < grpo.max_resample {
                    continue;
                }
                let gens = &generations[j * g..(j + 1) * g];
                batch.push(Scored {
                    prompt: i,
                    completions: gens.iter().map(|x| x.tokens.clone()).collect(),
                    logprobs: gens.iter().map(|x| x.logprobs.clone()).collect(),
                    truncated: gens.iter().map(|x| x.finish == FinishReason::Length).collect(),
                    rewards: scored.total,
                    components: scored.components,
                });
            }
        }
        if batch.is_empty() {
            eprintln!("step {step}: every group was skipped; nothing to learn from");
            save(step, &model, &optim, &mut state, metrics.as_deref())?;
            continue;
        }

        // ADVANTAGES (with the KL folded into the reward when asked).
        let tick = Instant::now();
        let flat: Vec<(usize, usize)> = batch
            .iter()
            .enumerate()
            .flat_map(|(b, s)| (0..s.completions.len()).map(move |c| (b, c)))
            .collect();
        let pairs: Vec<(&[u32], &[u32])> = flat
            .iter()
            .map(|&(b, c)| {
                (
                    prompts[batch[b].prompt].tokens.as_slice(),
                    batch[b].completions[c].as_slice(),
                )
            })
            .collect();
        let token_batch = TokenBatch::new(&pairs, pad);
        let reference_log_probs: Option<Vec<f32>> = reference.as_ref().map(|r| {
            let (lp, _) = completion_log_probs(r, &token_batch, sampler.temperature.max(1e-6), false, device);
            lp.into_data().convert::<f32>().to_vec().unwrap_or_default()
        });
        let mut rewards_flat: Vec<f32> = flat.iter().map(|&(b, c)| batch[b].rewards[c] as f32).collect();
        if grpo.kl_in_reward
            && let Some(ref_lp) = &reference_log_probs
        {
            let width = token_batch.completion_width;
            for (row, &(b, c)) in flat.iter().enumerate() {
                let kl: f32 = batch[b].logprobs[c]
                    .iter()
                    .enumerate()
                    .map(|(t, &lp)| kl_estimate_scalar(lp, ref_lp[row * width + t], grpo.kl_estimator))
                    .sum();
                rewards_flat[row] -= grpo.kl_coef * kl;
            }
        }
        let advantages: Vec<f32> = match grpo.advantage {
            AdvantageKind::Group => group_normalized(&rewards_flat, g, grpo.std_scaling),
            AdvantageKind::Rloo => rloo(&rewards_flat, g),
            AdvantageKind::ReinforcePp => reinforce_pp(&rewards_flat, g, grpo.group_baseline),
        };
        let mut mask = token_batch.completion_mask.clone();
        if grpo.mask_truncated {
            let width = token_batch.completion_width;
            for (row, &(b, c)) in flat.iter().enumerate() {
                if batch[b].truncated[c] {
                    mask[row * width..(row + 1) * width].fill(0.0);
                }
            }
        }

        // LEARN: μ gradient steps against the sampling-time log-probabilities.
        let old: Vec<&[f32]> = flat.iter().map(|&(b, c)| batch[b].logprobs[c].as_slice()).collect();
        let old_log_prob = token_batch.per_token::<B>(&old, device);
        let mask_t: Tensor<B, 2> = Tensor::from_data(
            TensorData::new(mask.clone(), [token_batch.rows, token_batch.completion_width]),
            device,
        );
        let advantages_t: Tensor<B, 1> =
            Tensor::from_data(TensorData::new(advantages.clone(), [advantages.len()]), device);
        let reference_t = reference_log_probs.filter(|_| !grpo.kl_in_reward).map(|lp| {
            Tensor::<B, 2>::from_data(
                TensorData::new(lp, [token_batch.rows, token_batch.completion_width]),
                device,
            )
        });
        let mut clip_frac = 0.0f64;
        let mut kl_value = None;
        let mut entropy_value = None;
        let mut loss_value = 0.0f32;
        let mut grad_norm = 0.0f32;
        for _ in 0..grpo.updates_per_batch.max(1) {
            let (log_prob, entropy) = completion_log_probs(
                &model,
                &token_batch,
                sampler.temperature.max(1e-6),
                grpo.entropy_coef != 0.0,
                device,
            );
            if let Some(h) = &entropy {
                let mean = (h.clone().detach() * mask_t.clone())
                    .sum()
                    .div(mask_t.clone().sum().clamp_min(1.0));
                entropy_value = Some(mean.into_scalar().elem::<f64>());
            }
            let out = policy_loss(
                log_prob,
                old_log_prob.clone(),
                advantages_t.clone(),
                mask_t.clone(),
                reference_t.clone(),
                entropy,
                &loss_config,
            );
            loss_value = out.loss.clone().into_scalar().elem();
            TrainError::check_loss(step, "policy loss", loss_value)?;
            clip_frac = out.clip_frac.into_scalar().elem();
            kl_value = out.kl.map(|k| k.into_scalar().elem::<f64>());
            let mut grads = GradientsParams::from_grads(out.loss.backward(), &model);
            grad_norm = clip_grad_norm(&model, &mut grads, optimizer.max_grad_norm);
            TrainError::check_gradients(step, grad_norm, &model, &grads)?;
            model = optim.step(optimizer.lr, model, grads);
        }
        state.outcome.train += tick.elapsed();
        state.outcome.steps = step;

        // LOG.
        let mean_reward = rewards_flat.iter().map(|&r| f64::from(r)).sum::<f64>() / rewards_flat.len() as f64;
        state.recent_rewards.push(mean_reward);
        let lengths: Vec<f64> = flat
            .iter()
            .map(|&(b, c)| batch[b].completions[c].len() as f64)
            .collect();
        let elapsed = step_start.elapsed().as_secs_f64();
        let mut record = json!({
            "stage": "grpo",
            "step": step,
            "train/reward": mean_reward,
            "train/zero_variance_frac": degenerate as f64 / sampled_groups.max(1) as f64,
            "train/completion_length": lengths.iter().sum::<f64>() / lengths.len() as f64,
            "train/truncated_frac": flat.iter().filter(|&&(b, c)| batch[b].truncated[c]).count() as f64 / flat.len() as f64,
            "train/loss": loss_value,
            "train/clip_frac": clip_frac,
            "train/grad_norm": grad_norm,
            "train/kl": kl_value,
            "train/entropy": entropy_value,
            "train/reward_failures": failures,
            "train/tokens_per_s": tokens_generated as f64 / elapsed.max(1e-9),
            "time/step_s": elapsed,
            "time/generate_s": state.outcome.generate.as_secs_f64(),
            "time/reward_s": state.outcome.reward.as_secs_f64(),
            "time/train_s": state.outcome.train.as_secs_f64(),
            "time/elapsed_s": elapsed_before + start.elapsed().as_secs_f64(),
        });
        let mut components: std::collections::BTreeMap<String, (f64, usize)> = Default::default();
        for s in &batch {
            for (name, values) in &s.components {
                let entry = components.entry(name.clone()).or_default();
                for v in values.iter().filter(|v| v.is_finite()) {
                    entry.0 += v;
                    entry.1 += 1;
                }
            }
        }
        for (name, (sum, count)) in components {
            record[format!("train/reward/{name}")] = json!(if count > 0 { Some(sum / count as f64) } else { None });
        }
        if let Some(m) = metrics.as_deref_mut() {
            m.write(&record)?;
        }
        progress.show(
            &format!(
                "grpo step {step}/{} | reward {mean_reward:.3} | {:.2} s/step",
                grpo.steps, elapsed
            ),
            step == grpo.steps,
        );
        save(step, &model, &optim, &mut state, metrics.as_deref())?;
    }
    progress.finish();
    let GrpoState {
        recent_rewards,
        mut outcome,
        ..
    } = state;
    let tail = (recent_rewards.len() / 10).max(1);
    outcome.final_reward = recent_rewards.iter().rev().take(tail).sum::<f64>() / tail as f64;
    Ok((model, outcome))
}

/// Adds `completion_tokens` (each completion's length in tokens) to a group's metadata, for
/// rewards that count tokens (the `length-penalty` plugin's `unit = "tokens"`).
fn with_token_counts(metadata: &str, lengths: &[usize]) -> String {
    let mut value = match serde_json::from_str::<serde_json::Value>(metadata) {
        Ok(serde_json::Value::Object(map)) => serde_json::Value::Object(map),
        _ => json!({}),
    };
    value["completion_tokens"] = json!(lengths);
    value.to_string()
}
