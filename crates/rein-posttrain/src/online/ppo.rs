//! ADVANTAGES and LEARN for PPO with a critic on a language model (InstructGPT; TRL's
//! `PPOTrainer`, OpenRLHF): the step's completions were sampled and scored as GRPO's. Then
//!
//! 1. one pass without gradients: the reference policy's log-probabilities (for the KL
//!    penalty), the critic's values `V_old` and, with a lag correction, the trainer's own
//!    log-probabilities (the ratio's denominator);
//! 2. token rewards (the score on the last token, `−β·KL` on every token), GAE over each
//!    completion's tokens, returns `R = A + V_old`, whitened advantages
//!    ([`rein_optim::token_rewards`], [`rein_optim::token_gae`], [`rein_optim::masked_whiten`]);
//! 3. `update_epochs` passes over the completions in `num_minibatches` shuffled minibatches,
//!    each one gradient step on `L = L_clip + c_v · L_value`
//!    ([`rein_optim::policy_loss`], [`rein_optim::masked_value_loss`]) for the policy and the critic,
//!    each with its own AdamW and gradient clipping (OpenRLHF's actor and critic); during
//!    `critic_warmup_steps` only the critic steps.

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, GradientsParams, Optimizer};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use rein_model::ReinAutodiffBackend;
use rein_optim::{
    LinearSchedule, PolicyLossConfig, PolicyObjective, TokenAdvantages, clip_grad_norm, explained_variance,
    kl_estimate_scalar, lag_correction, masked_value_loss, masked_whiten, policy_loss, token_gae, token_rewards,
};
use rein_recipe::{LmPpoSection, OptimizerSection, SamplerSection};
use serde_json::json;

use super::sample::{Rollout, Scored};
use super::{Stage, adamw, lr_schedule, mean};
use crate::LmError;
use crate::batch::completion_log_probs;
use crate::online::critic::Critic;
use crate::seeds::{DROPOUT_SALT, generation_seed};
use crate::token_batch::{TokenBatch, select_rows};
use rein_run::driver::Record;
use rein_run::watchdog::Phases;

/// PPO's update: the critic, its optimiser and PPO's own settings.
pub struct PpoCritic<B: ReinAutodiffBackend> {
    pub(super) critic: Critic<B>,
    pub(super) optim: OptimizerAdaptor<AdamW, Critic<B>, B>,
    lr: LinearSchedule,
    pub(super) settings: LmPpoSection,
}

impl<B: ReinAutodiffBackend> PpoCritic<B> {
    /// `critic` trained with `[optimizer]`'s AdamW at `settings.critic_lr` (default the
    /// policy's learning rate, on the same schedule).
    pub fn new(critic: Critic<B>, settings: &LmPpoSection, optimizer: &OptimizerSection) -> Self {
        let optim = adamw(optimizer).init::<B, Critic<B>>();
        let lr = lr_schedule(optimizer, settings.critic_lr.unwrap_or(optimizer.lr), settings.steps);
        Self {
            critic,
            optim,
            lr,
            settings: settings.clone(),
        }
    }
}

/// A batch's per-token inputs to PPO's losses, `[rows, width]` each.
struct TokenTargets {
    /// The ratio's denominator.
    old_log_prob: Vec<f32>,
    /// The reference's log-probabilities, when the KL is in the loss.
    reference: Option<Vec<f32>>,
    /// Whitened (when asked) and corrected advantages.
    advantages: Vec<f32>,
    /// The critic's targets.
    returns: Vec<f32>,
    /// The critic's values when the batch was collected.
    old_values: Vec<f32>,
    /// Which tokens count.
    mask: Vec<f32>,
}

/// What one minibatch step measured.
struct MinibatchStats {
    loss: f32,
    policy_loss: f64,
    value_loss: f64,
    clip_frac: f64,
    value_clip_frac: f64,
    entropy: Option<f64>,
    grad_norm: f32,
    critic_grad_norm: f32,
}

impl<B: ReinAutodiffBackend> Stage<'_, B> {
    /// PPO with a critic on the step's completions (see the module docs), `learner` the critic
    /// and its optimiser. Returns the record's training entries.
    pub(super) fn learn_ppo(
        &mut self,
        learner: &mut PpoCritic<B>,
        step: usize,
        batch: &[Scored],
        phases: &Phases,
    ) -> Result<Record, LmError> {
        let flat: Vec<(&Rollout, f64)> = (batch.iter())
            .flat_map(|s| s.rollouts.iter().zip(s.rewards.iter().copied()))
            .collect();
        // A mixture of experts replays the sampler's routing, as the GRPO family does by default.
        let tokens = self.token_batch(&flat, true);
        let scores: Vec<f32> = flat.iter().map(|&(_, reward)| reward as f32).collect();
        let mut record = Record::new();
        let (targets, kl) = self.token_targets(learner, &flat, &tokens, &scores, &mut record, phases)?;
        let (epochs, minibatches) = (learner.settings.update_epochs, learner.settings.num_minibatches);
        let rows = tokens.rows;
        let minibatch_rows = rows.div_ceil(minibatches.max(1));
        let mut stats = Vec::new();
        for epoch in 0..epochs {
            let mut order: Vec<usize> = (0..rows).collect();
            self.state.rng.shuffle(&mut order);
            for (i, chunk) in order.chunks(minibatch_rows).enumerate() {
                let update = epoch * minibatches + i;
                stats.push(self.minibatch(
                    learner,
                    step,
                    update,
                    &tokens.select_rows(chunk),
                    &targets,
                    chunk,
                    phases,
                )?);
            }
        }
        let n = stats.len().max(1) as f64;
        let mean_of = |f: fn(&MinibatchStats) -> f64| stats.iter().map(f).sum::<f64>() / n;
        record.insert("train/loss".into(), json!(mean_of(|s| f64::from(s.loss))));
        record.insert("train/policy_loss".into(), json!(mean_of(|s| s.policy_loss)));
        record.insert("train/value_loss".into(), json!(mean_of(|s| s.value_loss)));
        record.insert("train/clip_frac".into(), json!(mean_of(|s| s.clip_frac)));
        record.insert("train/value_clip_frac".into(), json!(mean_of(|s| s.value_clip_frac)));
        record.insert("train/grad_norm".into(), json!(mean_of(|s| f64::from(s.grad_norm))));
        record.insert(
            "train/critic_grad_norm".into(),
            json!(mean_of(|s| f64::from(s.critic_grad_norm))),
        );
        if stats.iter().all(|s| s.entropy.is_some()) {
            record.insert(
                "train/entropy".into(),
                json!(mean_of(|s| s.entropy.unwrap_or_default())),
            );
        }
        let counted = |values: &[f32]| -> Vec<f32> {
            (values.iter().zip(&targets.mask))
                .filter(|(_, m)| **m > 0.0)
                .map(|(&v, _)| v)
                .collect()
        };
        let (returns, values) = (counted(&targets.returns), counted(&targets.old_values));
        let mean_f32 = |x: &[f32]| mean(&x.iter().map(|&v| f64::from(v)).collect::<Vec<_>>());
        record.insert("train/values_mean".into(), json!(mean_f32(&values)));
        record.insert("train/returns_mean".into(), json!(mean_f32(&returns)));
        record.insert(
            "train/explained_variance".into(),
            json!(explained_variance(&values, &returns)),
        );
        record.insert("train/critic_learning_rate".into(), json!(learner.lr.at(step)));
        self.log_batch(step, &flat, &scores, kl, &mut record);
        Ok(record)
    }

    /// Step 1 and 2 of the module docs: the no-gradient pass, token rewards, GAE and
    /// whitening. Returns the targets and, with the KL in the reward, the mean KL per token and
    /// the mean penalty per completion.
    fn token_targets(
        &self,
        learner: &PpoCritic<B>,
        flat: &[(&Rollout, f64)],
        tokens: &TokenBatch,
        scores: &[f32],
        record: &mut Record,
        phases: &Phases,
    ) -> Result<(TokenTargets, Option<(f64, f64)>), LmError> {
        let settings = &learner.settings;
        let temperature = self.ctx.sampler.temperature.max(1e-6);
        let width = tokens.completion_width;
        let floats =
            |t: Tensor<B::InnerBackend, 2>| -> Vec<f32> { t.into_data().convert::<f32>().to_vec().unwrap_or_default() };
        let reference: Option<Vec<f32>> = self.reference.as_ref().map(|r| {
            let _phase = phases.enter("reference", "the reference policy's log-probabilities");
            floats(completion_log_probs(r, tokens, temperature, false, &self.device).0)
        });
        let (policy, critic) = (self.model.valid(), learner.critic.valid());
        let sampled: Vec<&[f32]> = flat.iter().map(|(r, _)| r.logprobs.as_slice()).collect();
        let sampled = tokens.per_token_values(&sampled);
        let mut mask = tokens.completion_mask.clone();
        let (old_values, trainer) = {
            let _phase = phases.enter("values", format!("the critic's values of {} completions", tokens.rows));
            match self.ctx.rollout.correction {
                rein_core::LagCorrection::None => (floats(critic.values(&policy, tokens, &self.device)), None),
                _ => {
                    let out = critic.evaluate(&policy, tokens, temperature, false, &self.device);
                    let values = out.values.expect("evaluate returns values");
                    (floats(values), Some(floats(out.log_prob)))
                }
            }
        };
        // The token rewards, with the KL of the ratio's denominator to the reference.
        let mut old_log_prob = trainer.clone().unwrap_or_else(|| sampled.clone());
        let kl: Vec<f32> = match &reference {
            Some(reference) => (old_log_prob.iter().zip(reference).zip(&mask))
                .map(|((&lp, &r), &m)| {
                    if m > 0.0 {
                        kl_estimate_scalar(lp, r, settings.kl_estimator)
                    } else {
                        0.0
                    }
                })
                .collect(),
            None => vec![0.0; mask.len()],
        };
        let kl_coef = if settings.kl_in_reward { settings.kl_coef } else { 0.0 };
        let mut rewards = token_rewards(scores, &kl, &mask, width, kl_coef);
        if settings.whiten_rewards {
            rewards = masked_whiten(&rewards, &mask, false);
        }
        let TokenAdvantages {
            mut advantages,
            returns,
        } = token_gae(&rewards, &old_values, &mask, width, settings.gamma, settings.gae_lambda);
        if settings.norm_adv {
            advantages = masked_whiten(&advantages, &mask, true);
        }
        if let Some(trainer) = &trainer {
            let corrected = lag_correction(trainer, &sampled, &mask, width, &self.correction());
            record.insert("train/mismatch_kl".into(), json!(corrected.mismatch_kl));
            record.insert("train/correction_masked_frac".into(), json!(corrected.masked_frac));
            record.insert("train/correction_capped_frac".into(), json!(corrected.capped_frac));
            advantages.iter_mut().zip(&corrected.weights).for_each(|(a, w)| *a *= w);
            mask.iter_mut().zip(&corrected.keep).for_each(|(m, k)| *m *= k);
            old_log_prob = trainer.clone();
        }
        let kl_logged = reference.is_some().then(|| {
            let tokens = tokens.completion_mask.iter().filter(|&&m| m > 0.0).count().max(1);
            let total: f64 = kl.iter().map(|&k| f64::from(k)).sum();
            (
                total / tokens as f64,
                f64::from(kl_coef) * total / scores.len().max(1) as f64,
            )
        });
        Ok((
            TokenTargets {
                old_log_prob,
                reference: reference.filter(|_| !settings.kl_in_reward),
                advantages,
                returns,
                old_values,
                mask,
            },
            kl_logged,
        ))
    }

    /// One gradient step of the policy and the critic on the minibatch `tokens`, the batch's
    /// rows `rows`.
    #[allow(clippy::too_many_arguments)]
    fn minibatch(
        &mut self,
        learner: &mut PpoCritic<B>,
        step: usize,
        update: usize,
        tokens: &TokenBatch,
        targets: &TokenTargets,
        rows: &[usize],
        phases: &Phases,
    ) -> Result<MinibatchStats, LmError> {
        let settings = &learner.settings;
        let width = tokens.completion_width;
        let shape = [rows.len(), width];
        let tensor = |values: &[f32]| -> Tensor<B, 2> {
            Tensor::from_data(TensorData::new(select_rows(values, rows, width), shape), &self.device)
        };
        self.model
            .set_dropout_key(generation_seed(self.ctx.seed ^ DROPOUT_SALT, step, update));
        let graph = rein_model::one_graph();
        let forward = phases.enter("forward", format!("the PPO losses of {} completions", rows.len()));
        let temperature = self.ctx.sampler.temperature.max(1e-6);
        let entropy_wanted = settings.ent_coef != 0.0;
        let out = learner
            .critic
            .evaluate(&self.model, tokens, temperature, entropy_wanted, &self.device);
        let mask = tensor(&targets.mask);
        let counted = mask.clone().sum().clamp_min(1.0);
        let masked_mean = |x: Tensor<B, 2>| (x * mask.clone()).sum().div(counted.clone());
        let entropy = out
            .entropy
            .as_ref()
            .map(|h| masked_mean(h.clone().detach()).into_scalar().elem::<f64>());
        let policy = policy_loss(
            out.log_prob,
            tensor(&targets.old_log_prob),
            tensor(&targets.advantages),
            mask.clone(),
            targets.reference.as_deref().map(tensor),
            out.entropy,
            &policy_loss_config(settings, self.ctx.sampler),
        );
        let values = out.values.expect("evaluate returns values");
        let old_values = tensor(&targets.old_values);
        let clip = settings.clip_vloss.then_some(settings.value_clip);
        let returns = tensor(&targets.returns);
        let value_loss = masked_value_loss(values.clone(), old_values.clone(), returns, mask.clone(), clip);
        let moved = (values.detach() - old_values)
            .abs()
            .greater_elem(settings.value_clip)
            .float();
        let value_clip_frac = masked_mean(moved).into_scalar().elem::<f64>();
        let total = policy.loss.clone() + value_loss.clone().mul_scalar(settings.vf_coef);
        let loss: f32 = total.clone().into_scalar().elem();
        rein_run::RunError::check_loss(step, "PPO loss", loss)?;
        drop(forward);
        let backward = phases.enter("backward", "the PPO losses' gradients");
        let mut grads = total.backward();
        let mut policy_grads = GradientsParams::from_module(&mut grads, &self.model);
        let mut critic_grads = GradientsParams::from_module(&mut grads, &learner.critic);
        drop((backward, graph));
        let _optimizer = phases.enter(
            "optimizer",
            "clipping and applying the policy's and the critic's gradients",
        );
        let max_norm = self.ctx.optimizer.max_grad_norm;
        let grad_norm = clip_grad_norm(&self.model, &mut policy_grads, max_norm);
        rein_run::RunError::check_gradients(step, grad_norm, || {
            rein_optim::non_finite_gradient(&self.model, &policy_grads)
        })?;
        let critic_grad_norm = clip_grad_norm(&learner.critic, &mut critic_grads, max_norm);
        rein_run::RunError::check_gradients(step, critic_grad_norm, || {
            rein_optim::non_finite_gradient(&learner.critic, &critic_grads)
        })?;
        if step > settings.critic_warmup_steps {
            self.model = self.optim.step(self.lr.at(step), self.model.clone(), policy_grads);
        }
        learner.critic = (learner.optim).step(learner.lr.at(step), learner.critic.clone(), critic_grads);
        Ok(MinibatchStats {
            loss,
            policy_loss: policy.loss.into_scalar().elem::<f64>(),
            value_loss: value_loss.into_scalar().elem::<f64>(),
            clip_frac: policy.clip_frac.into_scalar().elem::<f64>(),
            value_clip_frac,
            entropy,
            grad_norm,
            critic_grad_norm,
        })
    }
}

/// PPO's clipped policy loss as the recipe sets it: one clip range both ways, token ratios, the
/// aggregation, the KL in the loss (unless folded into the reward), the entropy bonus.
fn policy_loss_config(settings: &LmPpoSection, sampler: &SamplerSection) -> PolicyLossConfig {
    PolicyLossConfig {
        level: rein_core::RatioLevel::Token,
        objective: PolicyObjective::Clip,
        clip_low: settings.clip_coef,
        clip_high: settings.clip_coef,
        dual_clip: None,
        aggregation: settings.aggregation,
        max_completion_len: sampler.max_new_tokens,
        kl_coef: if settings.kl_in_reward { 0.0 } else { settings.kl_coef },
        kl_estimator: settings.kl_estimator,
        kl_importance_weighted: false,
        entropy_coef: settings.ent_coef,
        top_entropy_quantile: 1.0,
    }
}
