//! A batch of preference pairs through a causal LM — the part of DPO that offline DPO
//! (`offline/dpo.rs`, pairs from a dataset) and online DPO (`online/online_dpo.rs`, pairs from
//! the policy's own scored samples) share: the pairs as rows (chosen, then rejected), each
//! completion's summed log-probability under the policy and the reference, the DPO-family loss
//! on them (`rein_optim::dpo_loss`, where the paper's equation is) and the step's metrics.

use burn::tensor::{Tensor, TensorData};
use rein_model::lm::CausalLm;
use rein_model::{ReinAutodiffBackend, ReinBackend};
use rein_optim::{DpoConfig, DpoLoss, dpo_loss};
use serde_json::json;

use crate::batch::{completion_log_probs, floats, mean};
use crate::data::preferences::PreferencePair;
use crate::token_batch::TokenBatch;
use rein_run::driver::Record;

/// The log-probabilities of each completion of a batch of pairs, summed over its tokens.
pub struct PairLogProbs<B: burn::tensor::backend::Backend> {
    /// The chosen completions', `[pairs]`.
    pub chosen: Tensor<B, 1>,
    /// The rejected completions', `[pairs]`.
    pub rejected: Tensor<B, 1>,
}

/// The pairs `picked` as one batch: each pair's chosen completion in the first half of the
/// rows, its rejected one in the second.
pub fn pair_batch(pairs: &[PreferencePair], picked: &[usize], pad_id: u32) -> TokenBatch {
    let chosen = picked
        .iter()
        .map(|&i| (pairs[i].prompt.as_slice(), pairs[i].chosen.as_slice()));
    let rejected = picked
        .iter()
        .map(|&i| (pairs[i].prompt.as_slice(), pairs[i].rejected.as_slice()));
    let rows: Vec<(&[u32], &[u32])> = chosen.chain(rejected).collect();
    TokenBatch::new(&rows, pad_id)
}

/// The reference's summed log-probabilities of each pair of `batch` ([`pair_batch`]), as
/// `[chosen, rejected]`.
pub fn reference_log_probs<B: ReinBackend>(
    reference: &CausalLm<B>,
    batch: &TokenBatch,
    device: &B::Device,
) -> Vec<[f32; 2]> {
    let sums = summed_log_probs(reference, batch, device);
    let (chosen, rejected) = (floats(sums.chosen), floats(sums.rejected));
    (chosen.into_iter().zip(rejected)).map(|(c, r)| [c, r]).collect()
}

/// The DPO-family loss of `batch` ([`pair_batch`]) under `model`, given the reference's summed
/// log-probabilities of each pair; with the policy's, for the metrics.
pub fn dpo_batch_loss<B: ReinBackend>(
    model: &CausalLm<B>,
    batch: &TokenBatch,
    reference: &[[f32; 2]],
    config: &DpoConfig,
    device: &B::Device,
) -> (DpoLoss<B>, PairLogProbs<B>) {
    let policy = summed_log_probs(model, batch, device);
    let column = |k: usize| {
        let values: Vec<f32> = reference.iter().map(|r| r[k]).collect();
        Tensor::<B, 1>::from_data(TensorData::new(values, [reference.len()]), device)
    };
    let out = dpo_loss(
        policy.chosen.clone(),
        policy.rejected.clone(),
        column(0),
        column(1),
        token_counts(batch, device),
        config,
    );
    (out, policy)
}

/// Each completion's log-probability under `model`, `Σ_t log π(y_t | x, y_<t)`, split into the
/// batch's chosen and rejected halves ([`pair_batch`]).
fn summed_log_probs<B: ReinBackend>(model: &CausalLm<B>, batch: &TokenBatch, device: &B::Device) -> PairLogProbs<B> {
    let pairs = batch.rows / 2;
    let sums = sequence_log_probs(model, batch, device);
    PairLogProbs {
        chosen: sums.clone().narrow(0, 0, pairs),
        rejected: sums.narrow(0, pairs, pairs),
    }
}

/// Each row's completion log-probability under `model`, `Σ_t log π(y_t | x, y_<t)`, `[rows]`.
pub(crate) fn sequence_log_probs<B: ReinBackend>(
    model: &CausalLm<B>,
    batch: &TokenBatch,
    device: &B::Device,
) -> Tensor<B, 1> {
    let (log_prob, _) = completion_log_probs(model, batch, 1.0, false, device);
    (log_prob * batch.mask::<B>(device)).sum_dim(1).reshape([batch.rows])
}

/// Each completion's token count, chosen half then rejected half.
fn token_counts<B: ReinBackend>(batch: &TokenBatch, device: &B::Device) -> [Tensor<B, 1>; 2] {
    let c = batch.completion_width;
    let counts: Vec<f32> = (batch.completion_mask.chunks(c)).map(|row| row.iter().sum()).collect();
    let pairs = batch.rows / 2;
    let tensor = |values: &[f32]| Tensor::from_data(TensorData::new(values.to_vec(), [values.len()]), device);
    [tensor(&counts[..pairs]), tensor(&counts[pairs..])]
}

/// A DPO step's batch means, for its record: the implicit rewards of the chosen and rejected
/// completions (`dpo/rewards_chosen`, `dpo/rewards_rejected`), the share of pairs whose chosen
/// completion has the larger one (`dpo/reward_accuracy`), their margin (`dpo/reward_margin`),
/// and the policy's log-probabilities (`dpo/logps_chosen`, `dpo/logps_rejected`).
pub(crate) fn pair_metrics<B: ReinAutodiffBackend>(out: &DpoLoss<B>, policy: &PairLogProbs<B>) -> Record {
    let values = |t: &Tensor<B, 1>| floats(t.clone().inner());
    let (chosen, rejected) = (values(&out.chosen_rewards), values(&out.rejected_rewards));
    let margins: Vec<f32> = chosen.iter().zip(&rejected).map(|(c, r)| c - r).collect();
    let accuracy = margins.iter().filter(|&&m| m > 0.0).count() as f64 / margins.len().max(1) as f64;
    let record = json!({
        "dpo/rewards_chosen": mean(&chosen),
        "dpo/rewards_rejected": mean(&rejected),
        "dpo/reward_accuracy": accuracy,
        "dpo/reward_margin": mean(&margins),
        "dpo/logps_chosen": mean(&values(&policy.chosen)),
        "dpo/logps_rejected": mean(&values(&policy.rejected)),
    });
    record.as_object().cloned().unwrap_or_default()
}
