//! Kahneman–Tversky optimisation of a language model on completions labelled desirable or
//! undesirable, one at a time (the loss and its paper's equations are in rein-optim's `kto.rs`),
//! against a frozen reference, as TRL's `KTOTrainer` does.
//!
//! Each step draws `batch_size` distinct examples and runs the policy over their completions in
//! one batch, summing each completion's token log-probabilities. KTO's reference point is
//! estimated on the batch's mismatched pairs, as TRL builds them: example `i`'s prompt with
//! example `i − 1`'s completion (the first with the last's), through the policy without a
//! gradient and through the reference. The reference is the policy as KTO started (with LoRA, the
//! same frozen base weights); its log-probability of an example is computed the first time the
//! example is drawn and kept (`precompute_ref`, checkpointed), or on every batch; the mismatched
//! pairs change from batch to batch, so theirs are always computed. AdamW with linear warm-up
//! then linear decay to 10% of the peak rate, global gradient clipping.

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig, GradientsParams};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use rein_model::lm::CausalLm;
use rein_model::{ReinAutodiffBackend, ReinBackend};
use rein_optim::{KtoConfig, KtoLoss, KtoLossKind, kto_loss, kto_reference_point, warmup_then_decay};
use rein_recipe::KtoSection;
use rein_sampler::SeededRng;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::LmError;
use crate::batch::{floats, mean};
use crate::data::labelled::LabelledCompletion;
use crate::preference_batch::sequence_log_probs;
use crate::seeds::{DROPOUT_SALT, generation_seed};
use crate::token_batch::TokenBatch;
use rein_run::checkpoint::{Checkpoint, learner_sections};
use rein_run::driver::{Record, Snapshot, Step, Trainer};
use rein_run::watchdog::Phases;

/// What a KTO checkpoint stores besides the model and optimiser.
#[derive(Clone, Serialize, Deserialize)]
struct KtoState {
    rng: SeededRng,
    /// The reference's log-probability of each example's completion, once computed.
    reference: Vec<Option<f32>>,
    tokens_seen: usize,
}

/// KTO on labelled completions (see the module docs).
pub struct Kto<'a, B: ReinAutodiffBackend> {
    /// The policy being trained.
    pub model: CausalLm<B>,
    reference: CausalLm<B::InnerBackend>,
    optim: OptimizerAdaptor<AdamW, CausalLm<B>, B>,
    examples: &'a [LabelledCompletion],
    pad_id: u32,
    section: &'a KtoSection,
    state: KtoState,
    seed: u64,
    device: B::Device,
}

/// The examples `picked` as one batch, in order.
pub fn labelled_batch(examples: &[LabelledCompletion], picked: &[usize], pad_id: u32) -> TokenBatch {
    let rows: Vec<(&[u32], &[u32])> = (picked.iter())
        .map(|&i| (examples[i].prompt.as_slice(), examples[i].completion.as_slice()))
        .collect();
    TokenBatch::new(&rows, pad_id)
}

/// The mismatched pairs of the examples `picked` that KTO's reference point is estimated on:
/// row `i` is example `picked[i]`'s prompt with example `picked[i − 1]`'s completion, row 0 with
/// the last one's (TRL's `(x_1, y_n), (x_2, y_1), …, (x_n, y_{n−1})`).
pub fn mismatched_batch(examples: &[LabelledCompletion], picked: &[usize], pad_id: u32) -> TokenBatch {
    let n = picked.len();
    let rows: Vec<(&[u32], &[u32])> = (0..n)
        .map(|i| {
            let (prompt, completion) = (&examples[picked[i]], &examples[picked[(i + n - 1) % n]]);
            (prompt.prompt.as_slice(), completion.completion.as_slice())
        })
        .collect();
    TokenBatch::new(&rows, pad_id)
}

/// The reference point `z₀` of a batch: the mean log-ratio of its mismatched pairs
/// ([`mismatched_batch`]) between `policy` (no gradient) and the reference's
/// log-probabilities of them, clamped at 0.
pub fn reference_point<B: ReinBackend>(
    policy: &CausalLm<B>,
    mismatched: &TokenBatch,
    reference: &[f32],
    device: &B::Device,
) -> f32 {
    let policy = floats(sequence_log_probs(policy, mismatched, device));
    kto_reference_point(&policy, reference)
}

/// The KTO-family loss of `batch` ([`labelled_batch`]) under `model`, given the reference's
/// log-probability of each completion and the batch's reference point; with the policy's
/// log-probabilities, for the metrics.
pub fn kto_batch_loss<B: ReinBackend>(
    model: &CausalLm<B>,
    batch: &TokenBatch,
    desirable: &[bool],
    reference: &[f32],
    kl: f32,
    config: &KtoConfig,
    device: &B::Device,
) -> (KtoLoss<B>, Tensor<B, 1>) {
    let policy = sequence_log_probs(model, batch, device);
    let reference = Tensor::<B, 1>::from_data(TensorData::new(reference.to_vec(), [reference.len()]), device);
    (kto_loss(policy.clone(), reference, desirable, kl, config), policy)
}

impl<'a, B: ReinAutodiffBackend> Kto<'a, B> {
    /// KTO from `model`, which is also the frozen reference.
    pub fn new(
        model: CausalLm<B>,
        examples: &'a [LabelledCompletion],
        pad_id: u32,
        section: &'a KtoSection,
        seed: u64,
        device: &B::Device,
    ) -> Result<Self, LmError> {
        if examples.is_empty() {
            return Err(LmError::Unsupported(
                "KTO has no labelled completions to train on (every row was skipped?)".into(),
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
            examples,
            pad_id,
            section,
            state: KtoState {
                rng: SeededRng::new(seed ^ 0x470),
                reference: vec![None; examples.len()],
                tokens_seen: 0,
            },
            seed,
            device: device.clone(),
        })
    }

    fn config(&self) -> KtoConfig {
        KtoConfig {
            kind: self.section.loss_type,
            beta: self.section.beta,
            desirable_weight: self.section.desirable_weight,
            undesirable_weight: self.section.undesirable_weight,
        }
    }

    /// `batch_size` examples, distinct while the data has that many.
    fn draw(&mut self) -> Vec<usize> {
        let n = self.examples.len();
        let mut picked: Vec<usize> = Vec::with_capacity(self.section.batch_size);
        while picked.len() < self.section.batch_size {
            let i = self.state.rng.below(n as u64) as usize;
            if n < self.section.batch_size || !picked.contains(&i) {
                picked.push(i);
            }
        }
        picked
    }

    /// The reference's log-probabilities of the examples `picked`: kept ones reused (with
    /// `precompute_ref`), the others computed in one batch.
    fn reference_log_probs(&mut self, picked: &[usize]) -> Vec<f32> {
        let (examples, pad_id, reference, device) = (self.examples, self.pad_id, &self.reference, &self.device);
        let keep = self.section.precompute_ref;
        super::reference_values(&mut self.state.reference, picked, keep, |missing| {
            floats(sequence_log_probs(
                reference,
                &labelled_batch(examples, missing, pad_id),
                device,
            ))
        })
    }
}

impl<B: ReinAutodiffBackend> Trainer for Kto<'_, B> {
    type Error = LmError;

    fn total_steps(&self) -> usize {
        self.section.steps
    }

    fn step(&mut self, step: usize, phases: &Phases) -> Result<Step, LmError> {
        let picked = self.draw();
        let (reference, kl) = {
            let _phase = phases.enter(
                "reference",
                "the reference's log-probabilities and KTO's reference point",
            );
            let reference = self.reference_log_probs(&picked);
            let kl = match self.section.loss_type {
                KtoLossKind::Kto => {
                    let mismatched = mismatched_batch(self.examples, &picked, self.pad_id);
                    let theirs = floats(sequence_log_probs(&self.reference, &mismatched, &self.device));
                    reference_point(&self.model.valid(), &mismatched, &theirs, &self.device)
                }
                KtoLossKind::ApoZeroUnpaired => 0.0,
            };
            (reference, kl)
        };
        let backward = phases.enter("backward", format!("the loss of {} completions", picked.len()));
        let batch = labelled_batch(self.examples, &picked, self.pad_id);
        self.state.tokens_seen += batch.completion_mask.iter().sum::<f32>() as usize;
        self.model
            .set_dropout_key(generation_seed(self.seed ^ DROPOUT_SALT, step, 0));
        let graph = rein_model::one_graph();
        let desirable: Vec<bool> = picked.iter().map(|&i| self.examples[i].desirable).collect();
        let config = self.config();
        let (out, policy) = kto_batch_loss(&self.model, &batch, &desirable, &reference, kl, &config, &self.device);
        let mut record = kto_metrics(&out, &floats(policy.inner()), &desirable);
        let loss_value: f32 = out.loss.clone().into_scalar().elem();
        rein_run::RunError::check_loss(step, "KTO loss", loss_value)?;
        let grads = GradientsParams::from_grads(out.loss.backward(), &self.model);
        drop(graph);
        drop(backward);

        let _optimizer = phases.enter("optimizer", "clipping and applying the gradients");
        let lr = warmup_then_decay(self.section.lr, self.section.warmup_steps, self.section.steps, step);
        let grad_norm;
        (self.model, grad_norm) = super::clipped_step(
            self.model.clone(),
            &mut self.optim,
            grads,
            (step, lr),
            self.section.max_grad_norm,
        )?;

        let extra = json!({
            "step": step,
            "kto/loss": loss_value,
            "kto/lr": lr,
            "kto/grad_norm": grad_norm,
            "kto/tokens_seen": self.state.tokens_seen,
        });
        record.extend(extra.as_object().cloned().unwrap_or_default());
        Ok(Step {
            record,
            done: false,
            progress: format!(
                "kto step {step}/{} | loss {loss_value:.3} | kl {kl:.3}",
                self.section.steps
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

/// A KTO step's batch means, TRL's metrics under rein's names: the reference point
/// (`kto/kl`), the implicit rewards `β r` of the desirable and undesirable completions
/// (`kto/rewards_chosen`, `kto/rewards_rejected`) and their difference (`kto/reward_margin`),
/// and the policy's log-probabilities (`kto/logps_chosen`, `kto/logps_rejected`); a label the
/// batch lacks has no entry.
fn kto_metrics<B: burn::tensor::backend::Backend>(out: &KtoLoss<B>, policy: &[f32], desirable: &[bool]) -> Record {
    let rewards = floats(out.rewards.clone());
    let split = |values: &[f32], label: bool| -> Vec<f32> {
        (values.iter().zip(desirable))
            .filter(|(_, d)| **d == label)
            .map(|(v, _)| *v)
            .collect()
    };
    let mut record = Record::new();
    record.insert("kto/kl".into(), json!(out.kl));
    let (chosen, rejected) = (split(&rewards, true), split(&rewards, false));
    for (name, values) in [
        ("kto/rewards_chosen", &chosen),
        ("kto/rewards_rejected", &rejected),
        ("kto/logps_chosen", &split(policy, true)),
        ("kto/logps_rejected", &split(policy, false)),
    ] {
        if !values.is_empty() {
            record.insert(name.into(), json!(mean(values)));
        }
    }
    if !chosen.is_empty() && !rejected.is_empty() {
        record.insert("kto/reward_margin".into(), json!(mean(&chosen) - mean(&rejected)));
    }
    record
}
