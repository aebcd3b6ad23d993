//! The policy loss of a batch split across devices (`train.devices > 1`). Each device computes
//! the loss of a contiguous share of the batch's rows on its own copy of the policy, weighted so
//! that the shares add up to the whole batch's loss ([`share_weight`]: a token-mean share by
//! its counted tokens, a sequence-mean share by its rows), and burn-collective's all-reduce
//! sums their gradients ([`data_parallel::gradients`]): the one-device gradient, up to the order
//! of the additions. The update's logged means (clip fraction, KL, entropy) are each share's
//! mean weighted by its counted tokens.
//!
//! Before the batch's first update, the trainer's log-probabilities of the whole batch are
//! computed once without gradients on the first device: the sampler–trainer mismatch and its
//! correction read every row before any share's loss does (IcePop changes which tokens count,
//! and with them the token-mean's denominator).

use std::ops::Range;
use std::sync::Mutex;

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::{ElementConversion, Tensor};
use rein_core::Aggregation;
use rein_model::ReinAutodiffBackend;
use rein_optim::{Counted, policy_loss, share_weight};

use super::Stage;
use super::learn::{LossInputs, UpdateLoss, UpdateStats, token_mean};
use crate::LmError;
use crate::batch::completion_log_probs;
use crate::data_parallel;
use crate::token_batch::TokenBatch;
use rein_run::driver::Record;
use rein_run::watchdog::Phases;

/// What one share measured, each a mean over its counted tokens already weighted by its share
/// of the batch's counted tokens (the token-mean [`share_weight`]), so that the shares' values
/// add up to the batch's mean.
#[derive(Clone, Copy)]
struct Measured {
    clip_frac: f64,
    kl: Option<f64>,
    entropy: Option<f64>,
}

impl<B: ReinAutodiffBackend> Stage<'_, B> {
    /// The policy loss's gradients with the batch's rows split across the first `shares`
    /// devices, and what the update measured (its gradient norm is filled in after clipping).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn split_gradients(
        &self,
        loss: &UpdateLoss,
        step: usize,
        update: usize,
        shares: usize,
        tokens: &TokenBatch,
        inputs: &mut LossInputs<B>,
        mismatch: &mut Record,
        phases: &Phases,
    ) -> Result<(GradientsParams, UpdateStats), LmError> {
        let temperature = self.ctx.sampler.temperature.max(1e-6);
        if update == 0 {
            let _forward = phases.enter("forward", "the trainer's log-probabilities before the batch's updates");
            let (trainer, _) = completion_log_probs(&self.model.valid(), tokens, temperature, false, &self.device);
            *mismatch = inputs.correct(Tensor::from_inner(trainer), &self.correction(), &self.device);
        }
        let _backward = phases.enter(
            "backward",
            format!("the policy loss of {} completions on {shares} devices", tokens.rows),
        );
        let width = inputs.shape[1];
        let values =
            |t: &Tensor<B, 2>| -> Vec<f32> { t.clone().into_data().convert::<f32>().to_vec().unwrap_or_default() };
        let (old, reference) = (values(&inputs.old_log_prob), inputs.reference.as_ref().map(values));
        let (mask, advantages) = (&inputs.mask, &inputs.advantages);
        let counted = |rows: &Range<usize>| Counted {
            rows: rows.len(),
            tokens: mask[rows.start * width..rows.end * width].iter().sum(),
        };
        let whole = counted(&(0..tokens.rows));
        let ranges: Vec<Range<usize>> = data_parallel::row_shares(tokens.rows, shares).collect();
        let batches: Vec<TokenBatch> = (ranges.iter())
            .map(|rows| tokens.select_rows(&rows.clone().collect::<Vec<_>>()))
            .collect();
        let (config, entropy_wanted) = (&loss.config, loss.entropy_wanted);
        let measured = Mutex::new(vec![None; shares]);
        let (grads, losses) = data_parallel::gradients(&self.model, &self.devices[..shares], |s, model, device| {
            let rows = &ranges[s];
            let cells = rows.start * width..rows.end * width;
            let tensor = |v: &[f32]| LossInputs::<B>::tensor(&v[cells.clone()], [rows.len(), width], device);
            let share_mask = tensor(mask);
            let (log_prob, entropy) = completion_log_probs(model, &batches[s], temperature, entropy_wanted, device);
            let share = counted(rows);
            let token_share = f64::from(share_weight(Aggregation::TokenMean, share, whole));
            let entropy_mean = (entropy.as_ref()).map(|h| {
                token_mean(h.clone().detach(), share_mask.clone())
                    .into_scalar()
                    .elem::<f64>()
                    * token_share
            });
            let out = policy_loss(
                log_prob,
                tensor(&old),
                tensor(advantages),
                share_mask,
                reference.as_deref().map(tensor),
                entropy,
                config,
            );
            measured.lock().unwrap_or_else(|e| e.into_inner())[s] = Some(Measured {
                clip_frac: out.clip_frac.into_scalar().elem::<f64>() * token_share,
                kl: out.kl.map(|k| k.into_scalar().elem::<f64>() * token_share),
                entropy: entropy_mean,
            });
            out.loss.mul_scalar(share_weight(config.aggregation, share, whole))
        })?;
        let loss = losses.iter().sum::<f64>() as f32;
        rein_run::RunError::check_loss(step, "policy loss", loss)?;
        let measured: Vec<Measured> = (measured.into_inner().unwrap_or_else(|e| e.into_inner()))
            .into_iter()
            .flatten()
            .collect();
        let stats = UpdateStats {
            loss,
            clip_frac: measured.iter().map(|m| m.clip_frac).sum(),
            grad_norm: 0.0,
            kl: measured.iter().map(|m| m.kl).sum(),
            entropy: measured.iter().map(|m| m.entropy).sum(),
            entropy_coef: None,
            teacher_kl: None,
            router_mismatch: None,
            aux_loss: None,
        };
        Ok((grads, stats))
    }
}
