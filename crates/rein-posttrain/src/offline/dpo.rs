//! Direct preference optimisation of a language model on (prompt, chosen, rejected) pairs: the
//! DPO family of `rein_optim::dpo_loss` (DPO, IPO, hinge, robust), against a frozen reference.
//!
//! Each step draws `batch_size` random pairs and runs the policy over their `2 · batch_size`
//! completions in one batch (chosen rows, then rejected rows), summing each completion's token
//! log-probabilities. The reference is the policy as DPO started (with LoRA, the same frozen
//! base weights: no second copy); its log-probabilities of a pair are computed the first time
//! the pair is drawn and kept (`precompute_ref`, checkpointed), or on every batch. `sft_weight`
//! adds the chosen completions' negative log-likelihood (RPO). AdamW with
//! linear warm-up then linear decay to 10% of the peak rate, global gradient clipping.

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use rein_model::lm::CausalLm;
use rein_model::{ReinAutodiffBackend, ReinBackend};
use rein_optim::{DpoConfig, DpoLoss, clip_grad_norm, dpo_loss, warmup_then_decay};
use rein_recipe::DpoSection;
use rein_sampler::SeededRng;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::LmError;
use crate::batch::{TokenBatch, completion_log_probs, floats, mean};
use crate::data::preferences::PreferencePair;
use crate::seeds::{DROPOUT_SALT, generation_seed};
use rein_run::checkpoint::{Checkpoint, learner_sections};
use rein_run::driver::{Record, Snapshot, Step, Trainer};
use rein_run::watchdog::Phases;

/// What a DPO checkpoint stores besides the model and optimiser.
#[derive(Clone, Serialize, Deserialize)]
struct DpoState {
    rng: SeededRng,
    /// The reference's log-probabilities of each pair's (chosen, rejected), once computed.
    reference: Vec<Option<[f32; 2]>>,
    tokens_seen: usize,
}

/// The DPO family on preference pairs (see the module docs).
pub struct Dpo<'a, B: ReinAutodiffBackend> {
    /// The policy being trained.
    pub model: CausalLm<B>,
    reference: CausalLm<B::InnerBackend>,
    optim: OptimizerAdaptor<AdamW, CausalLm<B>, B>,
    pairs: &'a [PreferencePair],
    pad_id: u32,
    section: &'a DpoSection,
    state: DpoState,
    seed: u64,
    device: B::Device,
}

/// The log-probabilities of each completion of a batch of pairs, summed over its tokens.
pub struct PairLogProbs<B: burn::tensor::backend::Backend> {
    /// The chosen completions', `[pairs]`.
    pub chosen: Tensor<B, 1>,
    /// The rejected completions', `[pairs]`.
    pub rejected: Tensor<B, 1>,
}

impl<'a, B: ReinAutodiffBackend> Dpo<'a, B> {
    /// DPO from `model`, which is also the frozen reference.
    pub fn new(
        model: CausalLm<B>,
        pairs: &'a [PreferencePair],
        pad_id: u32,
        section: &'a DpoSection,
        seed: u64,
        device: &B::Device,
    ) -> Result<Self, LmError> {
        if pairs.is_empty() {
            return Err(LmError::Unsupported(
                "DPO has no preference pairs to train on (every row was skipped?)".into(),
            ));
        }
        let optim = AdamWConfig::new()
            .with_weight_decay(section.weight_decay)
            .with_epsilon(1e-8)
            .init::<B, CausalLm<B>>();
        Ok(Self {
            reference: model.valid(),
            model,
            optim,
            pairs,
            pad_id,
            section,
            state: DpoState {
                rng: SeededRng::new(seed ^ 0xD90),
                reference: vec![None; pairs.len()],
                tokens_seen: 0,
            },
            seed,
            device: device.clone(),
        })
    }

    /// The reference's summed log-probabilities of the pairs `picked`: kept ones reused (with
    /// `precompute_ref`), the others computed in one batch.
    fn reference_log_probs(&mut self, picked: &[usize]) -> Vec<[f32; 2]> {
        let keep = self.section.precompute_ref;
        let missing: Vec<usize> = match keep {
            true => {
                let mut missing: Vec<usize> = (picked.iter().copied())
                    .filter(|&i| self.state.reference[i].is_none())
                    .collect();
                missing.sort_unstable();
                missing.dedup();
                missing
            }
            false => picked.to_vec(),
        };
        let mut fresh = Vec::with_capacity(missing.len());
        if !missing.is_empty() {
            let batch = pair_batch(self.pairs, &missing, self.pad_id);
            fresh = reference_log_probs(&self.reference, &batch, &self.device);
        }
        match keep {
            true => {
                for (&i, values) in missing.iter().zip(fresh) {
                    self.state.reference[i] = Some(values);
                }
                (picked.iter())
                    .map(|&i| self.state.reference[i].expect("computed above"))
                    .collect()
            }
            false => fresh,
        }
    }
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
    let (log_prob, _) = completion_log_probs(model, batch, 1.0, false, device);
    let pairs = batch.rows / 2;
    let sums = (log_prob * batch.mask::<B>(device)).sum_dim(1).reshape([batch.rows]);
    PairLogProbs {
        chosen: sums.clone().narrow(0, 0, pairs),
        rejected: sums.narrow(0, pairs, pairs),
    }
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

impl<B: ReinAutodiffBackend> Trainer for Dpo<'_, B> {
    type Error = LmError;

    fn total_steps(&self) -> usize {
        self.section.steps
    }

    fn step(&mut self, step: usize, phases: &Phases) -> Result<Step, LmError> {
        let n = self.pairs.len() as u64;
        let picked: Vec<usize> = (0..self.section.batch_size)
            .map(|_| self.state.rng.below(n) as usize)
            .collect();
        let reference = {
            let _phase = phases.enter("reference", "the reference's log-probabilities");
            self.reference_log_probs(&picked)
        };
        let backward = phases.enter("backward", format!("the loss of {} pairs", picked.len()));
        let batch = pair_batch(self.pairs, &picked, self.pad_id);
        self.state.tokens_seen += batch.completion_mask.iter().sum::<f32>() as usize;
        self.model
            .set_dropout_key(generation_seed(self.seed ^ DROPOUT_SALT, step, 0));
        let graph = rein_model::one_graph();
        let config = DpoConfig {
            kind: self.section.loss_type,
            beta: self.section.beta,
            label_smoothing: self.section.label_smoothing,
            sft_weight: self.section.sft_weight,
        };
        let (out, policy) = dpo_batch_loss(&self.model, &batch, &reference, &config, &self.device);
        let mut record = pair_metrics(&out, &policy);
        let loss_value: f32 = out.loss.clone().into_scalar().elem();
        rein_run::RunError::check_loss(step, "DPO loss", loss_value)?;
        let mut grads = GradientsParams::from_grads(out.loss.backward(), &self.model);
        drop(graph);
        drop(backward);

        let _optimizer = phases.enter("optimizer", "clipping and applying the gradients");
        let grad_norm = clip_grad_norm(&self.model, &mut grads, self.section.max_grad_norm);
        rein_run::RunError::check_gradients(step, grad_norm, || rein_optim::non_finite_gradient(&self.model, &grads))?;
        let lr = warmup_then_decay(self.section.lr, self.section.warmup_steps, self.section.steps, step);
        self.model = self.optim.step(lr, self.model.clone(), grads);

        let (margin, accuracy) = (
            record["dpo/reward_margin"].as_f64(),
            record["dpo/reward_accuracy"].as_f64(),
        );
        let extra = json!({
            "step": step,
            "dpo/loss": loss_value,
            "dpo/lr": lr,
            "dpo/grad_norm": grad_norm,
            "dpo/tokens_seen": self.state.tokens_seen,
        });
        record.extend(extra.as_object().cloned().unwrap_or_default());
        Ok(Step {
            record,
            done: false,
            progress: format!(
                "dpo step {step}/{} | loss {loss_value:.3} | margin {:.3} | accuracy {:.0}%",
                self.section.steps,
                margin.unwrap_or(f64::NAN),
                100.0 * accuracy.unwrap_or(f64::NAN)
            ),
        })
    }

    fn snapshot(&self) -> Snapshot {
        let (model, optim, state) = (self.model.clone(), self.optim.clone(), self.state.clone());
        Box::new(move || learner_sections::<B, CausalLm<B>, _, _>(&state, &model, &optim))
    }

    fn restore(&mut self, checkpoint: &Checkpoint) -> Result<(), LmError> {
        (self.state, self.model, self.optim) =
            checkpoint.load_learner(self.model.clone(), self.optim.clone(), &self.device)?;
        Ok(())
    }

    fn non_finite_parameter(&self) -> Option<String> {
        rein_optim::non_finite_parameter(&self.model)
    }
}
