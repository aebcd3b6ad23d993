//! ADVANTAGES and LEARN: the batch's outcome advantages (with −β·KL folded into the rewards
//! when asked; GiGPO's per-turn ones for multi-turn episodes), then μ gradient steps on the
//! policy loss against the sampling-time log-probabilities. A step's record holds the means of
//! its updates' losses, clip fractions, gradient norms, KLs and entropies.

use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use rein_core::{
    AdvantageKind, Aggregation, DifficultyWeight, LagCorrection, MultiObjectiveAggregation, ObjectiveKind, StdScaling,
};
use rein_model::ReinAutodiffBackend;
use rein_model::lm::Routing;
use rein_optim::{
    Branch, Correction, EntropyCoefficient, GigpoConfig, PolicyLossConfig, PolicyObjective, add_teacher_advantages,
    aggregate, best_of_group, clip_grad_norm, decoupled_normalized, difficulty_weight, full_reverse_kl,
    group_normalized, kl_estimate_scalar, lag_correction, pass_at_k, policy_loss, reinforce_pp, reweight_by_difficulty,
    rloo, tree_step_advantages,
};
use rein_recipe::{GrpoSection, SamplerSection, TeacherKl};
use serde_json::json;

use super::curriculum::{completions_correct, group_accuracy};
use super::sample::{Rollout, Scored};
use super::{Stage, mean};
use crate::LmError;
use crate::batch::{completion_log_probs, completion_logits, completion_outputs};
use crate::online::process_credit::{self, Completion, ProcessCredit};
use crate::online::turn_advantages::{EpisodeTurns, token_advantages};
use crate::seeds::{DROPOUT_SALT, generation_seed};
use crate::token_batch::TokenBatch;
use rein_run::driver::Record;
use rein_run::watchdog::Phases;

/// The policy loss's inputs for a batch, `[rows, width]` each, as values and as tensors.
pub(super) struct LossInputs<B: ReinAutodiffBackend> {
    /// The sampler's log-probabilities of the completion tokens.
    pub(super) sampled_log_prob: Vec<f32>,
    /// One advantage per completion token.
    pub(super) advantages: Vec<f32>,
    /// Which tokens count in the loss.
    pub(super) mask: Vec<f32>,
    /// The PPO ratio's denominator: the sampler's log-probabilities, or with a lag correction
    /// the trainer's own before the batch's first update.
    pub(super) old_log_prob: Tensor<B, 2>,
    pub(super) advantage_tensor: Tensor<B, 2>,
    pub(super) mask_tensor: Tensor<B, 2>,
    /// The reference policy's log-probabilities, for the KL term in the loss.
    pub(super) reference: Option<Tensor<B, 2>>,
    /// The teacher's scaled logits at every completion position and the weight of the full
    /// reverse KL to them in the loss ([`TeacherKl::Full`]).
    pub(super) teacher_logits: Option<(Tensor<B::InnerBackend, 2>, f32)>,
    pub(super) shape: [usize; 2],
}

impl<B: ReinAutodiffBackend> LossInputs<B> {
    pub(super) fn tensor(values: &[f32], shape: [usize; 2], device: &B::Device) -> Tensor<B, 2> {
        Tensor::from_data(TensorData::new(values.to_vec(), shape), device)
    }

    /// Compares the trainer's log-probabilities before the batch's updates with the sampler's
    /// (the `train/mismatch_kl` and correction metrics); with a correction, reweights the
    /// advantages, masks tokens and makes the trainer's log-probabilities the ratio's
    /// denominator.
    pub(super) fn correct(&mut self, trainer: Tensor<B, 2>, correction: &Correction, device: &B::Device) -> Record {
        let values: Vec<f32> = (trainer.clone().detach().into_data().convert::<f32>().to_vec()).unwrap_or_default();
        let corrected = lag_correction(&values, &self.sampled_log_prob, &self.mask, self.shape[1], correction);
        let mut record = Record::new();
        record.insert("train/mismatch_kl".into(), json!(corrected.mismatch_kl));
        if correction.kind == LagCorrection::None {
            return record;
        }
        record.insert("train/correction_masked_frac".into(), json!(corrected.masked_frac));
        record.insert("train/correction_capped_frac".into(), json!(corrected.capped_frac));
        for (a, w) in self.advantages.iter_mut().zip(&corrected.weights) {
            *a *= w;
        }
        for (m, keep) in self.mask.iter_mut().zip(&corrected.keep) {
            *m *= keep;
        }
        self.advantage_tensor = Self::tensor(&self.advantages, self.shape, device);
        self.mask_tensor = Self::tensor(&self.mask, self.shape, device);
        self.old_log_prob = trainer.detach();
        record
    }
}

/// What one update measured.
pub(super) struct UpdateStats {
    pub(super) loss: f32,
    pub(super) clip_frac: f64,
    pub(super) grad_norm: f32,
    pub(super) kl: Option<f64>,
    pub(super) entropy: Option<f64>,
    /// The adaptive entropy coefficient this update applied.
    pub(super) entropy_coef: Option<f64>,
    /// The full reverse KL to the teacher, per completion token.
    pub(super) teacher_kl: Option<f64>,
    /// A mixture of experts: the share of tokens the trainer's router chose other experts for
    /// than the sampler's.
    pub(super) router_mismatch: Option<f64>,
    /// A mixture of experts: the load-balancing loss (before its coefficient).
    pub(super) aux_loss: Option<f64>,
}

/// An update's loss: the policy loss's settings, and whether the token entropies are computed
/// (the bonus and the top-entropy mask use them, the adaptive coefficient measures them).
pub(super) struct UpdateLoss {
    pub(super) config: PolicyLossConfig,
    pub(super) entropy_wanted: bool,
}

/// A mixture of experts' part of an update ([`Stage::experts_term`]).
pub(super) struct ExpertsTerm<B: ReinAutodiffBackend> {
    /// The load-balancing loss times its coefficient, when that is not 0.
    pub(super) loss: Option<Tensor<B, 1>>,
    /// The load-balancing loss.
    pub(super) aux_loss: f64,
    /// Tokens routed otherwise than the sampler routed them, as a share of those it routed.
    pub(super) mismatch: Option<f64>,
}

impl UpdateStats {
    /// The record entries of a step's updates: each quantity's mean over them.
    fn means(updates: &[UpdateStats]) -> Record {
        let n = updates.len();
        let mean_f32 = |x: fn(&UpdateStats) -> f32| updates.iter().map(x).reduce(|a, b| a + b).map(|s| s / n as f32);
        let mean_f64 = |x: fn(&UpdateStats) -> Option<f64>| {
            (updates.iter().map(x))
                .reduce(|a, b| Some(a? + b?))
                .flatten()
                .map(|s| s / n as f64)
        };
        let mut record = json!({
            "train/loss": mean_f32(|u| u.loss),
            "train/clip_frac": mean_f64(|u| Some(u.clip_frac)),
            "train/grad_norm": mean_f32(|u| u.grad_norm),
            "train/kl": mean_f64(|u| u.kl),
            "train/entropy": mean_f64(|u| u.entropy),
            "moe/router_mismatch": mean_f64(|u| u.router_mismatch),
            "moe/aux_loss": mean_f64(|u| u.aux_loss),
        })
        .as_object()
        .cloned()
        .unwrap_or_default();
        // Only runs with the adaptive coefficient have it.
        if let Some(coef) = mean_f64(|u| u.entropy_coef) {
            record.insert("train/entropy_coef".into(), json!(coef));
        }
        record
    }
}

/// Masks out every token of the truncated completions (`mask_truncated`).
fn mask_truncated(mask: &mut [f32], flat: &[(&Rollout, f64)], width: usize) {
    for (row, (rollout, _)) in flat.iter().enumerate() {
        if rollout.truncated {
            mask[row * width..(row + 1) * width].fill(0.0);
        }
    }
}

impl<B: ReinAutodiffBackend> Stage<'_, B> {
    /// ADVANTAGES and LEARN: the outcome advantages of the batch (with −β·KL folded into the
    /// rewards when asked), then μ gradient steps. Returns the record's training entries.
    pub(super) fn learn(
        &mut self,
        grpo: &GrpoSection,
        step: usize,
        batch: &[Scored],
        phases: &Phases,
    ) -> Result<Record, LmError> {
        let temperature = self.ctx.sampler.temperature.max(1e-6);
        let flat: Vec<(&Rollout, f64)> = (batch.iter())
            .flat_map(|s| s.rollouts.iter().zip(s.rewards.iter().copied()))
            .collect();
        let tokens = self.token_batch(&flat, grpo.router_replay);
        let width = tokens.completion_width;
        let reference_log_probs: Option<Vec<f32>> = self.reference.as_ref().map(|r| {
            let _phase = phases.enter("reference", "the reference policy's log-probabilities");
            let (lp, _) = completion_log_probs(r, &tokens, temperature, false, &self.device);
            lp.into_data().convert::<f32>().to_vec().unwrap_or_default()
        });
        let mut rewards: Vec<f32> = flat.iter().map(|&(_, reward)| reward as f32).collect();
        let old: Vec<&[f32]> = flat.iter().map(|(r, _)| r.logprobs.as_slice()).collect();
        let kl_in_reward = match &reference_log_probs {
            Some(reference) if grpo.kl_in_reward => Some(fold_kl_into_rewards(
                grpo,
                &mut rewards,
                &old,
                reference,
                &tokens.completion_mask,
                width,
            )),
            _ => None,
        };
        let implicit = self.implicit_rewards(step, batch, &flat, &tokens, phases)?;
        let token_rewards = implicit
            .as_ref()
            .map(|(rewards, weight, _)| (rewards.as_slice(), *weight));
        let (mut advantages, process_steps) = self.advantages(
            grpo,
            batch,
            &flat,
            &rewards,
            token_rewards,
            &tokens.completion_mask,
            width,
        );
        let difficulty = grpo
            .difficulty_weight
            .map(|w| self.reweight_by_difficulty(batch, &mut advantages, width, &w));
        let mut mask = tokens.completion_mask.clone();
        if grpo.mask_truncated {
            mask_truncated(&mut mask, &flat, width);
        }
        let sampled_log_prob = tokens.per_token_values(&old);
        let (mut teacher_kl, teacher_logits) =
            self.teacher_term(&tokens, temperature, &mut advantages, &sampled_log_prob, &mask, phases);
        let shape = [tokens.rows, width];
        let reference = reference_log_probs.filter(|_| !grpo.kl_in_reward);
        let mut inputs = LossInputs::<B> {
            old_log_prob: LossInputs::tensor(&sampled_log_prob, shape, &self.device),
            advantage_tensor: LossInputs::tensor(&advantages, shape, &self.device),
            mask_tensor: LossInputs::tensor(&mask, shape, &self.device),
            reference: reference.map(|lp| Tensor::from_data(TensorData::new(lp, shape), &self.device)),
            teacher_logits,
            sampled_log_prob,
            advantages,
            mask,
            shape,
        };
        let mut mismatch = Record::new();
        let updates = (0..grpo.updates_per_batch.max(1))
            .map(|update| self.update(grpo, step, update, &tokens, &mut inputs, &mut mismatch, phases))
            .collect::<Result<Vec<_>, _>>()?;
        let mut record = UpdateStats::means(&updates);
        record.extend(mismatch);
        let full_kl: Vec<f64> = updates.iter().filter_map(|u| u.teacher_kl).collect();
        if !full_kl.is_empty() {
            teacher_kl = Some(mean(&full_kl));
        }
        if let Some(kl) = teacher_kl {
            record.insert("train/teacher_kl".into(), json!(kl));
        }
        if let Some(weight) = difficulty {
            record.insert("train/difficulty_weight".into(), json!(weight));
        }
        if let Some(steps) = process_steps {
            record.insert("train/step_scores".into(), json!(steps));
        }
        if let Some((_, _, implicit)) = implicit {
            record.extend(implicit);
        }
        self.log_batch(step, &flat, &rewards, kl_in_reward, &mut record);
        Ok(record)
    }

    /// On-policy distillation's term, when the run has a teacher: with the sampled KL each
    /// token's advantage gains `coef · (log π_teacher − log π_student)` and the mean KL comes
    /// back; with the full KL, the teacher's logits and the term's weight, for the loss.
    #[allow(clippy::type_complexity)]
    fn teacher_term(
        &self,
        tokens: &TokenBatch,
        temperature: f32,
        advantages: &mut [f32],
        sampled_log_prob: &[f32],
        mask: &[f32],
        phases: &Phases,
    ) -> (Option<f64>, Option<(Tensor<B::InnerBackend, 2>, f32)>) {
        let Some((teacher, coef, kl)) = &self.teacher else {
            return (None, None);
        };
        let _phase = phases.enter("teacher", "the teacher's log-probabilities");
        match kl {
            TeacherKl::Sampled => {
                let (lp, _) = completion_log_probs(teacher, tokens, temperature, false, &self.device);
                let lp: Vec<f32> = lp.into_data().convert::<f32>().to_vec().unwrap_or_default();
                let kl = add_teacher_advantages(advantages, &lp, sampled_log_prob, mask, *coef);
                (Some(kl), None)
            }
            TeacherKl::Full => {
                let logits = completion_logits(teacher, tokens, temperature, &self.device).logits;
                (None, Some((logits, *coef)))
            }
        }
    }

    /// The batch's prompts and completions as one token batch; multi-turn episodes train only
    /// on the tokens the model sampled; a mixture of experts replays the sampler's routing when
    /// `replay_routes`.
    pub(super) fn token_batch(&self, flat: &[(&Rollout, f64)], replay_routes: bool) -> TokenBatch {
        let pairs: Vec<(&[u32], &[u32])> = (flat.iter())
            .map(|(r, _)| (r.opening.as_slice(), r.tokens.as_slice()))
            .collect();
        let mut tokens = TokenBatch::new(&pairs, self.pad);
        for (row, (rollout, _)) in flat.iter().enumerate() {
            if let Some(trained) = &rollout.trained {
                tokens.keep_in_loss(row, trained);
            }
        }
        if flat.iter().any(|(r, _)| r.routes.is_some()) {
            tokens.routes = flat.iter().map(|(r, _)| r.routes.clone()).collect();
            tokens.replay_routes = replay_routes;
        }
        tokens.images = flat.iter().map(|(r, _)| r.images.clone()).collect();
        tokens
    }

    /// Scales each completion's advantages by its group's difficulty
    /// ([`rein_optim::reweight_by_difficulty`]), a group's accuracy being the share of its
    /// completions the accuracy reward counts correct (as the held-out evaluation counts them);
    /// returns the mean weight of a correct answer over the batch's groups.
    fn reweight_by_difficulty(
        &self,
        batch: &[Scored],
        advantages: &mut [f32],
        width: usize,
        w: &DifficultyWeight,
    ) -> f64 {
        let reward = self.ctx.rewards[self.ctx.accuracy_reward].reward.name();
        let mut rows = advantages.chunks_mut(width);
        let weights: Vec<f64> = (batch.iter())
            .map(|scored| {
                let accuracy = group_accuracy(&scored.components, scored.rollouts.len(), reward);
                for row in rows.by_ref().take(scored.rollouts.len()) {
                    reweight_by_difficulty(row, accuracy, w);
                }
                difficulty_weight(accuracy, w)
            })
            .collect();
        mean(&weights)
    }

    /// GDPO's inputs: each `[[reward]]`'s scores with its weight, and the text environment's
    /// rewards (weight 1, as they are summed) when it gave any; NaN where one did not apply.
    fn reward_columns(&self, batch: &[Scored]) -> (Vec<Vec<f64>>, Vec<f64>) {
        let (mut columns, mut weights) = (Vec::new(), Vec::new());
        for weighted in self.ctx.rewards.iter() {
            let name = weighted.reward.name();
            let column = batch.iter().flat_map(|scored| match scored.components.get(name) {
                Some(values) => values.clone(),
                None => vec![f64::NAN; scored.rollouts.len()],
            });
            columns.push(column.collect());
            weights.push(weighted.weight);
        }
        let rollouts = || batch.iter().flat_map(|scored| &scored.rollouts);
        // With no column at all, one of NaNs: no reward applies, every advantage is 0.
        if columns.is_empty() || rollouts().any(|r| r.env_reward.is_some()) {
            columns.push(
                rollouts()
                    .map(|r| r.env_reward.as_ref().map_or(f64::NAN, |(v, _)| *v))
                    .collect(),
            );
            weights.push(1.0);
        }
        (columns, weights)
    }

    /// The implicit PRM's token rewards `[rows, width]` for the batch, with their weight and the
    /// record entries of its step, when the run trains one: it learns from the completions'
    /// outcome labels, the accuracy reward's verdicts ([`completions_correct`]).
    fn implicit_rewards(
        &mut self,
        step: usize,
        batch: &[Scored],
        flat: &[(&Rollout, f64)],
        tokens: &TokenBatch,
        phases: &Phases,
    ) -> Result<Option<(Vec<f32>, f32, Record)>, LmError> {
        let Some(prm) = self.implicit_prm.as_mut() else {
            return Ok(None);
        };
        let reward = self.ctx.rewards[self.ctx.accuracy_reward].reward.name();
        let correct: Vec<bool> = (batch.iter())
            .flat_map(|scored| completions_correct(&scored.components, scored.rollouts.len(), reward))
            .collect();
        let lengths: Vec<usize> = flat.iter().map(|(rollout, _)| rollout.tokens.len()).collect();
        let (rewards, record) = prm.rewards(step, tokens, &lengths, &correct, phases, &self.device)?;
        Ok(Some((rewards, prm.weight(), record)))
    }

    /// ADVANTAGES: one per completion token, `[rows, width]`; with the process advantage, also
    /// the mean number of step scores a completion got. `token_rewards`: the implicit PRM's,
    /// with their weight, a source of the process advantage.
    #[allow(clippy::too_many_arguments)]
    fn advantages(
        &self,
        grpo: &GrpoSection,
        batch: &[Scored],
        flat: &[(&Rollout, f64)],
        rewards: &[f32],
        token_rewards: Option<(&[f32], f32)>,
        mask: &[f32],
        width: usize,
    ) -> (Vec<f32>, Option<f64>) {
        let g = self.ctx.sampler.n;
        let per_sequence = |advantages: Vec<f32>| -> Vec<f32> {
            (advantages.into_iter())
                .flat_map(|a| std::iter::repeat_n(a, width))
                .collect()
        };
        let mut step_scores = None;
        let mut advantages = match grpo.advantage {
            AdvantageKind::Group if grpo.multi_objective_aggregation == MultiObjectiveAggregation::NormalizeThenSum => {
                let (columns, weights) = self.reward_columns(batch);
                per_sequence(decoupled_normalized(&columns, &weights, g))
            }
            AdvantageKind::Group => per_sequence(group_normalized(rewards, g, grpo.std_scaling)),
            AdvantageKind::Rloo => per_sequence(rloo(rewards, g)),
            AdvantageKind::GrpoPassk => per_sequence(best_of_group(rewards, g, grpo.std_scaling == StdScaling::Group)),
            AdvantageKind::PassAtK => {
                let reward = self.ctx.rewards[self.ctx.accuracy_reward].reward.name();
                let correct: Vec<bool> = (batch.iter())
                    .flat_map(|scored| completions_correct(&scored.components, scored.rollouts.len(), reward))
                    .collect();
                per_sequence(pass_at_k(&correct, g, grpo.pass_k()))
            }
            AdvantageKind::ReinforcePp => per_sequence(reinforce_pp(rewards, g, grpo.group_baseline)),
            AdvantageKind::Gigpo => {
                let config = GigpoConfig {
                    gamma: grpo.step_gamma,
                    step_weight: grpo.step_advantage_weight,
                    scale_by_std: grpo.std_scaling != StdScaling::None,
                };
                let episodes: Vec<EpisodeTurns> = (flat.iter().zip(rewards))
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
            AdvantageKind::Process => {
                let steps = batch.iter().flat_map(|scored| scored.steps.iter());
                let completions: Vec<Completion> = (flat.iter().zip(steps).zip(rewards))
                    .map(|(((rollout, _), steps), &outcome)| Completion {
                        rollout,
                        steps,
                        outcome,
                    })
                    .collect();
                let credit = ProcessCredit {
                    gamma: grpo.process_gamma(),
                    step_weight: grpo.process_step_weight(),
                    outcome_weight: grpo.process_outcome_weight(),
                };
                let (advantages, steps) =
                    process_credit::advantages(&completions, token_rewards, self.ctx.tokenizer, mask, width, g, credit);
                step_scores = Some(steps);
                advantages
            }
        };
        if let Some(tree) = self.ctx.rollout.tree {
            add_tree_steps(
                &mut advantages,
                flat,
                rewards,
                g,
                grpo.std_scaling,
                tree.step_weight,
                width,
            );
        }
        (advantages, step_scores)
    }

    /// LEARN: update `update` of step `step`, one gradient step on the policy loss. The first
    /// update also measures (and, when asked, corrects) the sampler–trainer mismatch. With
    /// `train.devices > 1` the batch's rows are split across the devices ([`Self::split_gradients`]).
    #[allow(clippy::too_many_arguments)]
    fn update(
        &mut self,
        grpo: &GrpoSection,
        step: usize,
        update: usize,
        tokens: &TokenBatch,
        inputs: &mut LossInputs<B>,
        mismatch: &mut Record,
        phases: &Phases,
    ) -> Result<UpdateStats, LmError> {
        self.model
            .set_dropout_key(generation_seed(self.ctx.seed ^ DROPOUT_SALT, step, update));
        let shares = self.devices.len().min(tokens.rows);
        let mut config = policy_loss_config(grpo, self.ctx.sampler);
        let adaptive = grpo.adaptive_entropy.map(|control| {
            let state =
                (self.state.entropy_coef).get_or_insert_with(|| EntropyCoefficient::new(grpo.entropy_coef.into()));
            (control, state.applied(&control))
        });
        if let Some((_, applied)) = adaptive {
            config.entropy_coef = applied as f32;
        }
        let loss = UpdateLoss {
            entropy_wanted: config.entropy_coef != 0.0 || config.top_entropy_quantile < 1.0 || adaptive.is_some(),
            config,
        };
        let (mut grads, mut stats) = match shares {
            0 | 1 => self.gradients(grpo, &loss, step, update, tokens, inputs, mismatch, phases)?,
            _ => self.split_gradients(&loss, step, update, shares, tokens, inputs, mismatch, phases)?,
        };
        if let (Some((control, applied)), Some(entropy)) = (adaptive, stats.entropy) {
            stats.entropy_coef = Some(applied);
            if let Some(state) = self.state.entropy_coef.as_mut() {
                state.observe(entropy, &control);
            }
        }
        let _optimizer = phases.enter("optimizer", "clipping and applying the gradients");
        stats.grad_norm = clip_grad_norm(&self.model, &mut grads, self.ctx.optimizer.max_grad_norm);
        rein_run::RunError::check_gradients(step, stats.grad_norm, || {
            rein_optim::non_finite_gradient(&self.model, &grads)
        })?;
        self.model = self.optim.step(self.lr.at(step), self.model.clone(), grads);
        Ok(stats)
    }

    /// The policy loss's gradients on one device, and what the update measured (its gradient
    /// norm is filled in after clipping).
    #[allow(clippy::too_many_arguments)]
    fn gradients(
        &self,
        grpo: &GrpoSection,
        loss: &UpdateLoss,
        step: usize,
        update: usize,
        tokens: &TokenBatch,
        inputs: &mut LossInputs<B>,
        mismatch: &mut Record,
        phases: &Phases,
    ) -> Result<(GradientsParams, UpdateStats), LmError> {
        let temperature = self.ctx.sampler.temperature.max(1e-6);
        let graph = rein_model::one_graph();
        let rows = inputs.shape[0];
        let forward = phases.enter("forward", format!("the policy loss of {rows} completions"));
        let (config, entropy_wanted) = (&loss.config, loss.entropy_wanted);
        // With the full reverse KL to a teacher, one forward pass gives the vocabulary-wide
        // logits, and the sampled tokens' log-probabilities from them.
        let (log_prob, entropy, teacher_term, routing) = match &inputs.teacher_logits {
            None => {
                let out = completion_outputs(&self.model, tokens, temperature, entropy_wanted, None, &self.device);
                (out.log_prob, out.entropy, None, out.routing)
            }
            Some((teacher, coef)) => {
                let student = completion_logits(&self.model, tokens, temperature, &self.device);
                let (log_prob, entropy) = student.log_probs(entropy_wanted);
                let kl = full_reverse_kl(student.logits.clone(), Tensor::from_inner(teacher.clone()));
                (log_prob, entropy, Some((student.per_token(kl), *coef)), None)
            }
        };
        let experts = (routing.as_ref())
            .map(|r| self.experts_term(step, r, grpo.router_aux_loss_coef))
            .transpose()?;
        if update == 0 {
            *mismatch = inputs.correct(log_prob.clone(), &self.correction(), &self.device);
        }
        let (mask, advantages) = (&inputs.mask_tensor, &inputs.advantage_tensor);
        let entropy_value =
            (entropy.as_ref()).map(|h| token_mean(h.clone().detach(), mask.clone()).into_scalar().elem());
        let out = policy_loss(
            log_prob,
            inputs.old_log_prob.clone(),
            advantages.clone(),
            mask.clone(),
            inputs.reference.clone(),
            entropy,
            config,
        );
        // The full reverse KL's mean over the batch's counted tokens, as TRL reduces it.
        let teacher_kl = teacher_term.map(|(kl, coef)| {
            let kl = token_mean(kl, mask.clone());
            (kl.clone().mul_scalar(coef), kl.detach().into_scalar().elem::<f64>())
        });
        let (total, teacher_kl) = match teacher_kl {
            Some((term, kl)) => (out.loss.clone() + term, Some(kl)),
            None => (out.loss.clone(), None),
        };
        let total = match experts.as_ref().and_then(|e| e.loss.clone()) {
            Some(aux) => total + aux,
            None => total,
        };
        let loss: f32 = total.clone().into_scalar().elem();
        rein_run::RunError::check_loss(step, "policy loss", loss)?;
        drop(forward);
        let backward = phases.enter("backward", "the policy loss's gradients");
        let grads = GradientsParams::from_grads(total.backward(), &self.model);
        drop((backward, graph));
        let stats = UpdateStats {
            loss,
            clip_frac: out.clip_frac.into_scalar().elem::<f64>(),
            grad_norm: 0.0,
            kl: out.kl.map(|k| k.into_scalar().elem::<f64>()),
            entropy: entropy_value,
            entropy_coef: None,
            teacher_kl,
            router_mismatch: experts.as_ref().and_then(|e| e.mismatch),
            aux_loss: experts.as_ref().map(|e| e.aux_loss),
        };
        Ok((grads, stats))
    }

    /// A mixture of experts' part of the update: the load-balancing loss (times its
    /// coefficient, when it is not 0), its value, and the share of tokens routed otherwise than
    /// the sampler routed them; a router that gave a non-finite probability stops the run,
    /// naming its layer. `coef` is the recipe's coefficient (default: the model config's).
    pub(super) fn experts_term(
        &self,
        step: usize,
        routing: &Routing<B>,
        coef: Option<f64>,
    ) -> Result<ExpertsTerm<B>, LmError> {
        if let Some(layer) = routing.non_finite_layer() {
            return Err(rein_run::RunError::NonFinite {
                step,
                what: format!("the router probabilities of layer {layer} (model.layers.{layer}.mlp.gate)"),
                value: f32::NAN,
            }
            .into());
        }
        let coef = coef.or(self.model.config().router_aux_loss_coef).unwrap_or(0.0);
        let aux = routing.load_balancing_loss();
        let aux_loss = aux
            .as_ref()
            .map_or(0.0, |a| a.clone().detach().into_scalar().elem::<f64>());
        let (differing, compared) = routing.disagreement();
        Ok(ExpertsTerm {
            loss: aux.filter(|_| coef != 0.0).map(|a| a.mul_scalar(coef)),
            aux_loss,
            mismatch: (compared > 0).then(|| differing as f64 / compared as f64),
        })
    }

    /// The sampler–trainer mismatch correction the recipe asks for.
    pub(super) fn correction(&self) -> Correction {
        let rollout = self.ctx.rollout;
        Correction {
            kind: rollout.correction,
            level: rollout.correction_level,
            tis_cap: rollout.tis_cap,
            icepop_bounds: rollout.icepop_bounds,
        }
    }

    /// The batch's policy-lag, KL-in-reward, reward, length and truncation entries of the
    /// step's record.
    pub(super) fn log_batch(
        &mut self,
        step: usize,
        flat: &[(&Rollout, f64)],
        rewards: &[f32],
        kl_in_reward: Option<(f64, f64)>,
        record: &mut Record,
    ) {
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
    }
}

/// The KL in the reward: `r_i − β Σ_t KL_t` for each completion, over the tokens the
/// model sampled (`mask`), from their sampled log-probabilities and the reference's (both
/// `[rows, width]`). Returns the mean KL per token and the mean penalty per completion, for
/// the log.
fn fold_kl_into_rewards(
    grpo: &GrpoSection,
    rewards: &mut [f32],
    sampled: &[&[f32]],
    reference: &[f32],
    mask: &[f32],
    width: usize,
) -> (f64, f64) {
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

/// The GRPO family's policy loss as the recipe sets it: ratios by token or sequence, the
/// objective (clipped, CISPO or SAPO) with its settings and the share of tokens it is taken on,
/// the aggregation, the KL in the loss (unless folded into the
/// reward), the entropy bonus.
fn policy_loss_config(grpo: &GrpoSection, sampler: &SamplerSection) -> PolicyLossConfig {
    let objective = match grpo.objective {
        ObjectiveKind::Clip => PolicyObjective::Clip,
        ObjectiveKind::Cispo => PolicyObjective::Cispo {
            max_weight: grpo.cispo_max_weight(),
        },
        ObjectiveKind::Sapo => PolicyObjective::Sapo {
            temperature_pos: grpo.sapo_temperature_pos(),
            temperature_neg: grpo.sapo_temperature_neg(),
        },
    };
    PolicyLossConfig {
        level: grpo.ratio_level,
        objective,
        clip_low: grpo.clip_low,
        clip_high: grpo.clip_high,
        dual_clip: grpo.dual_clip,
        aggregation: grpo.aggregation,
        max_completion_len: sampler.max_new_tokens,
        kl_coef: if grpo.kl_in_reward { 0.0 } else { grpo.kl_coef },
        kl_estimator: grpo.kl_estimator,
        kl_importance_weighted: grpo.kl_importance_weighted,
        entropy_coef: grpo.entropy_coef,
        top_entropy_quantile: grpo.top_entropy_quantile,
    }
}

/// The mean of `values` over the tokens where `mask` is 1 (`[rows, width]` → `[1]`): the
/// token-mean [`aggregate`], as the logged entropy and the teacher KL are reduced.
pub(super) fn token_mean<B: burn::tensor::backend::Backend>(values: Tensor<B, 2>, mask: Tensor<B, 2>) -> Tensor<B, 1> {
    aggregate(values, mask, Aggregation::TokenMean, 0)
}

/// A tree rollout's step credit ([`tree_step_advantages`]) added, `weight` times, to each
/// token's advantage (`[rows, width]`; groups of `g` leaves, each leaf's branch recorded).
fn add_tree_steps(
    advantages: &mut [f32],
    flat: &[(&Rollout, f64)],
    rewards: &[f32],
    g: usize,
    scaling: StdScaling,
    weight: f32,
    width: usize,
) {
    let branches: Vec<Option<Branch>> = flat.iter().map(|(r, _)| r.branch).collect();
    let lengths: Vec<usize> = flat.iter().map(|(r, _)| r.tokens.len().min(width)).collect();
    let steps = tree_step_advantages(rewards, g, &branches, &lengths, scaling);
    for (row, steps) in advantages.chunks_mut(width).zip(steps) {
        for (a, s) in row.iter_mut().zip(steps) {
            *a += weight * s;
        }
    }
}
