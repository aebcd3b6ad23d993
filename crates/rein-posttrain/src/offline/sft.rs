//! Supervised fine-tuning: cross-entropy on the target completion, prompt tokens masked (and
//! the tool results of a multi-turn trace).
//!
//! ```text
//! L = − Σ_i Σ_t m_it log π_θ(y_it | x_i, y_i,<t) / Σ_i Σ_t m_it
//! ```
//!
//! Each step draws `batch_size` random examples that have a target; AdamW with linear warm-up
//! then linear decay to 10% of the peak rate, global gradient clipping.

use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig, GradientsParams};
use burn::tensor::{ElementConversion, Tensor};
use rein_model::ReinAutodiffBackend;
use rein_model::lm::CausalLm;
use rein_optim::warmup_then_decay;
use rein_recipe::SftSection;
use rein_sampler::SeededRng;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::LmError;
use crate::Prompt;
use crate::batch::completion_log_probs;
use crate::data_parallel;
use crate::seeds::{DROPOUT_SALT, generation_seed};
use crate::token_batch::TokenBatch;
use rein_run::checkpoint::{Checkpoint, learner_sections};
use rein_run::driver::{Snapshot, Step, Trainer};
use rein_run::watchdog::Phases;

/// What an SFT checkpoint stores besides the model and optimiser.
#[derive(Clone, Serialize, Deserialize)]
struct SftState {
    rng: SeededRng,
    tokens_seen: usize,
}

/// Supervised fine-tuning of a language model on the examples' target completions.
pub struct Sft<'a, B: ReinAutodiffBackend> {
    /// The model being trained.
    pub model: CausalLm<B>,
    optim: OptimizerAdaptor<AdamW, CausalLm<B>, B>,
    examples: Vec<&'a Prompt>,
    pad_id: u32,
    section: &'a SftSection,
    state: SftState,
    seed: u64,
    /// Where each shard of a batch runs (`train.devices`); the model lives on the first.
    devices: Vec<B::Device>,
}

impl<'a, B: ReinAutodiffBackend> Sft<'a, B> {
    /// Fine-tunes `model` on the `prompts` that have a target, as `section` says, each batch
    /// split across `devices` (one device: no split; the model lives on the first).
    pub fn new(
        model: CausalLm<B>,
        prompts: &'a [Prompt],
        pad_id: u32,
        section: &'a SftSection,
        seed: u64,
        devices: Vec<B::Device>,
    ) -> Result<Self, LmError> {
        if devices.is_empty() || devices.len() > section.batch_size {
            return Err(LmError::Unsupported(format!(
                "train.devices = {} must be between 1 and the SFT batch size ({})",
                devices.len(),
                section.batch_size
            )));
        }
        let examples: Vec<&Prompt> = prompts.iter().filter(|p| p.target.is_some()).collect();
        if examples.is_empty() {
            return Err(LmError::Unsupported(
                "SFT needs examples with a target completion".into(),
            ));
        }
        let optim = AdamWConfig::new()
            .with_weight_decay(section.weight_decay)
            .with_epsilon(1e-8)
            .init::<B, CausalLm<B>>();
        Ok(Self {
            model,
            optim,
            examples,
            pad_id,
            section,
            state: SftState {
                rng: SeededRng::new(seed ^ 0x5F7),
                tokens_seen: 0,
            },
            seed,
            devices,
        })
    }

    /// Target tokens trained on so far (what `sft/tokens_per_s` counts).
    pub fn tokens_seen(&self) -> usize {
        self.state.tokens_seen
    }
}

impl<B: ReinAutodiffBackend> Trainer for Sft<'_, B> {
    type Error = LmError;

    fn total_steps(&self) -> usize {
        self.section.steps
    }

    fn step(&mut self, step: usize, phases: &Phases) -> Result<Step, LmError> {
        let backward = phases.enter("backward", format!("the loss of {} examples", self.section.batch_size));
        let n = self.examples.len() as u64;
        let picked: Vec<&Prompt> = (0..self.section.batch_size)
            .map(|_| self.examples[self.state.rng.below(n) as usize])
            .collect();
        let pairs: Vec<(&[u32], &[u32])> = picked
            .iter()
            .map(|p| (p.tokens.as_slice(), p.target.as_deref().unwrap_or(&[])))
            .collect();
        let trained: Vec<Option<&[bool]>> = picked.iter().map(|p| p.target_trained.as_deref()).collect();
        // One share of the rows per device (the whole batch on one device).
        let shards: Vec<TokenBatch> = data_parallel::row_shares(pairs.len(), self.devices.len())
            .map(|rows| {
                let mut batch = sft_batch(&pairs[rows.clone()], &trained[rows.clone()], self.pad_id);
                batch.images = picked[rows].iter().map(|p| p.images.clone()).collect();
                batch
            })
            .collect();
        self.model
            .set_dropout_key(generation_seed(self.seed ^ DROPOUT_SALT, step, 0));
        let count = (shards.iter())
            .map(|shard| shard.completion_mask.iter().sum::<f32>())
            .sum::<f32>()
            .max(1.0);
        self.state.tokens_seen += count as usize;
        let (loss_value, grads) = if let [batch] = shards.as_slice() {
            let graph = rein_model::one_graph();
            let loss = sft_loss(&self.model, batch, count, &self.devices[0]);
            let loss_value: f32 = loss.clone().into_scalar().elem();
            rein_run::RunError::check_loss(step, "SFT loss", loss_value)?;
            let grads = GradientsParams::from_grads(loss.backward(), &self.model);
            drop(graph);
            (loss_value, grads)
        } else {
            // Each device the loss of its share of the rows, over the whole batch's token count.
            let (grads, values) = data_parallel::gradients(&self.model, &self.devices, |s, model, device| {
                sft_loss(model, &shards[s], count, device)
            })?;
            let loss_value = values.iter().sum::<f64>() as f32;
            rein_run::RunError::check_loss(step, "SFT loss", loss_value)?;
            (loss_value, grads)
        };
        drop(backward);

        let _optimizer = phases.enter("optimizer", "clipping and applying the gradients");
        let lr = sft_lr(self.section, step);
        let grad_norm;
        (self.model, grad_norm) = super::clipped_step(
            self.model.clone(),
            &mut self.optim,
            grads,
            (step, lr),
            self.section.max_grad_norm,
        )?;
        let tokens_per_s = self.state.tokens_seen as f64 / phases.elapsed().as_secs_f64().max(1e-9);
        let record = json!({
            "step": step,
            "sft/loss": loss_value,
            "sft/lr": lr,
            "sft/grad_norm": grad_norm,
            "sft/tokens_per_s": tokens_per_s,
        });
        Ok(Step {
            record: record.as_object().cloned().unwrap_or_default(),
            done: false,
            progress: format!(
                "sft step {step}/{} | loss {loss_value:.3} | {tokens_per_s:.0} tokens/s",
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
            checkpoint.load_learner(self.model.clone(), self.optim.clone(), &self.devices[0])?;
        Ok(())
    }

    fn non_finite_parameter(&self) -> Option<String> {
        rein_optim::non_finite_parameter(&self.model)
    }
}

/// The rows of `pairs` as a batch, each row's loss mask narrowed to `trained` where given, each
/// row packed with its own copy of its prompt.
fn sft_batch(pairs: &[(&[u32], &[u32])], trained: &[Option<&[bool]>], pad_id: u32) -> TokenBatch {
    let mut batch = TokenBatch::new(pairs, pad_id);
    // Rows one by one: an SFT batch repeats a prompt only when its data repeats a row, and a
    // repeated row computed once saves next to nothing but rounds its gradient differently (it
    // is summed where the copies' were not), which an SFT run from scratch can amplify into
    // another model (the main job's seed 1 from step 16 on).
    batch.share_prompts = false;
    for (row, trained) in trained.iter().enumerate() {
        if let Some(trained) = trained {
            batch.keep_in_loss(row, trained);
        }
    }
    batch
}

/// `− Σ_rows Σ_t m_t log π(y_t | …) / count`: the SFT loss of `batch`'s rows over `count` target
/// tokens (the whole batch's, when `batch` is one device's share).
fn sft_loss<B: ReinAutodiffBackend>(
    model: &CausalLm<B>,
    batch: &TokenBatch,
    count: f32,
    device: &B::Device,
) -> Tensor<B, 1> {
    let (log_prob, _) = completion_log_probs(model, batch, 1.0, false, device);
    (log_prob * batch.mask::<B>(device)).sum().neg().div_scalar(count)
}

/// SFT's learning rate at `step` ([`rein_optim::warmup_then_decay`]).
fn sft_lr(section: &SftSection, step: usize) -> f64 {
    warmup_then_decay(section.lr, section.warmup_steps, section.steps, step)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learning_rate_warms_up_then_decays_to_a_tenth() {
        let s = SftSection {
            steps: 110,
            warmup_steps: 10,
            lr: 1.0,
            ..SftSection::default()
        };
        assert_eq!(sft_lr(&s, 5), 0.5);
        assert_eq!(sft_lr(&s, 10), 1.0);
        assert!((sft_lr(&s, 110) - 0.1).abs() < 1e-12);
    }
}
