//! PRIME's implicit process reward model, trained inside the online stage (`[implicit_prm]`;
//! Cui et al. 2025; verl's `recipe/prime`, `prime_dp_rm.py`): a causal LM `π_φ` beside the
//! policy, with a frozen reference `π_ref` (both start as the SFT model unless the recipe names
//! one). Each step, on the batch's completions and their outcome labels (the accuracy reward's
//! verdicts):
//!
//! - it **learns**: one AdamW step on `L = mean_i BCE(σ(β Σ_t q_it), acc_i)`, where
//!   `q_t = log π_φ(y_t) − log π_ref(y_t)` ([`rein_optim::implicit_prm_loss`]);
//! - it **rewards** each completion token with `β q_t` (or their λ-returns), normalised by the
//!   batch's largest absolute return ([`rein_optim::implicit_token_rewards`],
//!   [`rein_optim::batch_normalized`]), a source of the process advantage beside the outcome.
//!
//! `update` orders the two as verl's `model.update` does: `before` learns, then rewards with a
//! second forward pass; `after` rewards with the forward pass it learns from (the model before
//! the update); `none` only rewards. The log-probabilities are the model's own, at temperature
//! 1, as verl computes them.

use burn::module::{AutodiffModule, Module};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, GradientsParams};
use burn::tensor::{ElementConversion, Tensor};
use rein_model::ReinAutodiffBackend;
use rein_model::lm::CausalLm;
use rein_optim::{batch_normalized, implicit_prm_loss, implicit_token_rewards};
use rein_recipe::{ImplicitPrmSection, ImplicitPrmUpdate, OptimizerSection};
use rein_run::driver::Record;
use rein_run::watchdog::Phases;
use serde_json::json;

use super::adamw;
use super::critic::Trainable;
use crate::LmError;
use crate::batch::completion_log_probs;
use crate::offline::clipped_step;
use crate::token_batch::TokenBatch;

/// The implicit PRM, its reference and its optimiser (see the module docs).
pub struct ImplicitPrm<B: ReinAutodiffBackend> {
    pub(super) model: CausalLm<B>,
    reference: CausalLm<B::InnerBackend>,
    pub(super) optim: OptimizerAdaptor<AdamW, CausalLm<B>, B>,
    settings: ImplicitPrmSection,
}

/// What one learning step measured.
struct Learned {
    loss: f32,
    grad_norm: f32,
    /// The share of completions whose implicit reward `β Σ q` (before the step) has the sign of
    /// their label: positive for the right ones, negative for the wrong.
    accuracy: f64,
}

impl<B: ReinAutodiffBackend> ImplicitPrm<B> {
    /// An implicit PRM starting from `start` (LoRA adapters merged, every weight trainable),
    /// which is also its frozen reference; AdamW with `[optimizer]`'s betas, ε and weight decay
    /// at `settings.lr`.
    pub fn new(start: CausalLm<B>, settings: &ImplicitPrmSection, optimizer: &OptimizerSection) -> Self {
        let model = start.merged().map(&mut Trainable);
        Self {
            reference: model.valid(),
            optim: adamw(optimizer).init::<B, CausalLm<B>>(),
            model,
            settings: settings.clone(),
        }
    }

    /// The weight of its token rewards in the process advantage.
    pub(super) fn weight(&self) -> f32 {
        self.settings.weight
    }

    /// The token rewards `[rows, width]` of `tokens`' completions (`lengths[i]` tokens each),
    /// whose outcome labels are `correct`; learns from them before or after rewarding as
    /// `update` says. Returns the rewards and the step's `implicit_prm/*` record entries.
    pub(super) fn rewards(
        &mut self,
        step: usize,
        tokens: &TokenBatch,
        lengths: &[usize],
        correct: &[bool],
        phases: &Phases,
        device: &B::Device,
    ) -> Result<(Vec<f32>, Record), LmError> {
        let _phase = phases.enter("implicit_prm", "the implicit PRM's update and token rewards");
        let labels: Vec<f32> = correct.iter().map(|&right| f32::from(u8::from(right))).collect();
        let (reference, _) = completion_log_probs(&self.reference, tokens, 1.0, false, device);
        let mut record = Record::new();
        let log_ratios = match self.settings.update {
            ImplicitPrmUpdate::None => self.log_ratios(tokens, reference),
            ImplicitPrmUpdate::After => {
                let (log_ratios, learned) = self.learn(step, tokens, reference, &labels)?;
                learned.record(&mut record);
                log_ratios
            }
            ImplicitPrmUpdate::Before => {
                let (_, learned) = self.learn(step, tokens, reference.clone(), &labels)?;
                learned.record(&mut record);
                self.log_ratios(tokens, reference)
            }
        };
        let width = tokens.completion_width;
        let beta = self.settings.beta as f32;
        let outcomes = self.settings.use_outcome.then_some(labels.as_slice());
        let raw = implicit_token_rewards(&log_ratios, lengths, width, beta, self.settings.lambda, outcomes);
        let rewards = batch_normalized(&raw, width);
        // Each completion's sum, averaged over the batch.
        let per_completion = |values: &[f32]| {
            let sums = values.chunks(width).map(|row| f64::from(row.iter().sum::<f32>()));
            sums.sum::<f64>() / tokens.rows.max(1) as f64
        };
        record.insert("implicit_prm/reward".into(), json!(per_completion(&rewards)));
        record.insert("implicit_prm/raw_reward".into(), json!(per_completion(&log_ratios)));
        Ok((rewards, record))
    }

    /// `q = log π_φ − log π_ref` on each completion token, `[rows, width]`, 0 at padding, with
    /// no gradient.
    fn log_ratios(&self, tokens: &TokenBatch, reference: Tensor<B::InnerBackend, 2>) -> Vec<f32> {
        let device = reference.device();
        let (log_probs, _) = completion_log_probs(&self.model.valid(), tokens, 1.0, false, &device);
        let q = (log_probs - reference) * tokens.mask::<B::InnerBackend>(&device);
        q.into_data().convert::<f32>().to_vec().unwrap_or_default()
    }

    /// One AdamW step on the implicit PRM's loss; returns `q` of the forward pass it learned
    /// from (before the step) and what it measured.
    fn learn(
        &mut self,
        step: usize,
        tokens: &TokenBatch,
        reference: Tensor<B::InnerBackend, 2>,
        labels: &[f32],
    ) -> Result<(Vec<f32>, Learned), LmError> {
        let device = reference.device();
        let (log_probs, _) = completion_log_probs(&self.model, tokens, 1.0, false, &device);
        let q = (log_probs - Tensor::from_inner(reference)) * tokens.mask::<B>(&device);
        let sums = q.clone().sum_dim(1).squeeze_dim::<1>(1);
        let beta = self.settings.beta as f32;
        let loss = implicit_prm_loss(sums.clone(), labels, beta);
        let loss_value: f32 = loss.clone().into_scalar().elem();
        let sums: Vec<f32> = sums.into_data().convert::<f32>().to_vec().unwrap_or_default();
        let agree = (sums.iter().zip(labels)).filter(|&(&sum, &label)| (sum > 0.0) == (label > 0.5));
        let accuracy = agree.count() as f64 / labels.len().max(1) as f64;
        let log_ratios: Vec<f32> = q.clone().into_data().convert::<f32>().to_vec().unwrap_or_default();
        let mut grads = loss.backward();
        let grads = GradientsParams::from_module(&mut grads, &self.model);
        let lr = (step, self.settings.lr);
        let (model, grad_norm) = clipped_step(
            self.model.clone(),
            &mut self.optim,
            grads,
            lr,
            self.settings.max_grad_norm,
        )?;
        self.model = model;
        let learned = Learned {
            loss: loss_value,
            grad_norm,
            accuracy,
        };
        Ok((log_ratios, learned))
    }
}

impl Learned {
    fn record(&self, record: &mut Record) {
        record.insert("implicit_prm/loss".into(), json!(self.loss));
        record.insert("implicit_prm/grad_norm".into(), json!(self.grad_norm));
        record.insert("implicit_prm/accuracy".into(), json!(self.accuracy));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::online::tiny_policy;

    /// Learning only from outcome labels, the implicit PRM comes to reward the right
    /// completions' tokens above the wrong ones' — the sign of its loss and of its log-ratios —
    /// while its reference stays the model it started from.
    #[test]
    fn it_learns_to_reward_the_right_completions() {
        let policy = tiny_policy();
        let settings = ImplicitPrmSection {
            lr: 1e-2,
            ..ImplicitPrmSection::default()
        };
        let optimizer = OptimizerSection {
            weight_decay: 0.0,
            ..OptimizerSection::default()
        };
        let mut prm = ImplicitPrm::new(policy.clone(), &settings, &optimizer);
        let pairs: [(&[u32], &[u32]); 4] = [
            (&[1, 2], &[3, 4, 5]),
            (&[1, 2], &[6, 7]),
            (&[9], &[3, 4]),
            (&[9], &[7, 8, 6]),
        ];
        let tokens = TokenBatch::new(&pairs, 0);
        let lengths = [3, 2, 2, 3];
        let correct = [true, false, true, false];
        let phases = Phases::new(Default::default(), Default::default());
        let device = Default::default();
        let mut first_loss = None;
        let mut last = Record::new();
        for step in 1..=30 {
            let (rewards, record) = prm
                .rewards(step, &tokens, &lengths, &correct, &phases, &device)
                .unwrap();
            assert_eq!(rewards.len(), 4 * tokens.completion_width);
            first_loss.get_or_insert(record["implicit_prm/loss"].as_f64().unwrap());
            last = record;
        }
        assert_eq!(last["implicit_prm/accuracy"].as_f64(), Some(1.0), "{last:?}");
        assert!(
            last["implicit_prm/loss"].as_f64().unwrap() < first_loss.unwrap() * 0.8,
            "{last:?}"
        );
        let (reference, _) = completion_log_probs(&prm.reference, &tokens, 1.0, false, &device);
        let (start, _) = completion_log_probs(&policy.valid(), &tokens, 1.0, false, &device);
        assert_eq!(reference.to_data(), start.to_data(), "the reference is frozen");
        let q = prm.log_ratios(&tokens, reference);
        let sums: Vec<f32> = q.chunks(tokens.completion_width).map(|row| row.iter().sum()).collect();
        assert!(
            sums[0] > 0.0 && sums[2] > 0.0 && sums[1] < 0.0 && sums[3] < 0.0,
            "{sums:?}"
        );
    }
}
