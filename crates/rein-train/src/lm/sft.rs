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
use burn::optim::{AdamW, AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::ElementConversion;
use rein_model::ReinAutodiffBackend;
use rein_model::lm::CausalLm;
use rein_optim::clip_grad_norm;
use rein_recipe::SftSection;
use rein_sampler::SeededRng;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::Prompt;
use super::batch::{TokenBatch, completion_log_probs};
use super::grpo::{DROPOUT_SALT, generation_seed};
use crate::TrainError;
use crate::checkpoint::{Checkpoint, learner_sections};
use crate::driver::{Snapshot, Step, Trainer};
use crate::watchdog::Phases;

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
    device: B::Device,
}

impl<'a, B: ReinAutodiffBackend> Sft<'a, B> {
    /// Fine-tunes `model` on the `prompts` that have a target, as `section` says.
    pub fn new(
        model: CausalLm<B>,
        prompts: &'a [Prompt],
        pad_id: u32,
        section: &'a SftSection,
        seed: u64,
        device: &B::Device,
    ) -> Result<Self, TrainError> {
        let examples: Vec<&Prompt> = prompts.iter().filter(|p| p.target.is_some()).collect();
        if examples.is_empty() {
            return Err(TrainError::Unsupported(
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
            device: device.clone(),
        })
    }

    /// Target tokens trained on so far (what `sft/tokens_per_s` counts).
    pub fn tokens_seen(&self) -> usize {
        self.state.tokens_seen
    }
}

impl<B: ReinAutodiffBackend> Trainer for Sft<'_, B> {
    fn total_steps(&self) -> usize {
        self.section.steps
    }

    fn step(&mut self, step: usize, phases: &Phases) -> Result<Step, TrainError> {
        let backward = phases.enter("backward", format!("the loss of {} examples", self.section.batch_size));
        let n = self.examples.len() as u64;
        let picked: Vec<&Prompt> = (0..self.section.batch_size)
            .map(|_| self.examples[self.state.rng.below(n) as usize])
            .collect();
        let pairs: Vec<(&[u32], &[u32])> = picked
            .iter()
            .map(|p| (p.tokens.as_slice(), p.target.as_deref().unwrap_or(&[])))
            .collect();
        let mut batch = TokenBatch::new(&pairs, self.pad_id);
        for (row, prompt) in picked.iter().enumerate() {
            if let Some(trained) = &prompt.target_trained {
                batch.keep_in_loss(row, trained);
            }
        }
        let mask = batch.mask::<B>(&self.device);
        self.model
            .set_dropout_key(generation_seed(self.seed ^ DROPOUT_SALT, step, 0));
        let graph = rein_model::one_graph();
        let (log_prob, _) = completion_log_probs(&self.model, &batch, 1.0, false, &self.device);
        let count = batch.completion_mask.iter().sum::<f32>().max(1.0);
        self.state.tokens_seen += count as usize;
        let loss = (log_prob * mask).sum().neg().div_scalar(count);
        let loss_value: f32 = loss.clone().into_scalar().elem();
        TrainError::check_loss(step, "SFT loss", loss_value)?;
        let mut grads = GradientsParams::from_grads(loss.backward(), &self.model);
        drop((backward, graph));

        let _optimizer = phases.enter("optimizer", "clipping and applying the gradients");
        let grad_norm = clip_grad_norm(&self.model, &mut grads, self.section.max_grad_norm);
        TrainError::check_gradients(step, grad_norm, &self.model, &grads)?;
        let lr = sft_lr(self.section, step);
        self.model = self.optim.step(lr, self.model.clone(), grads);
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

    fn restore(&mut self, checkpoint: &Checkpoint) -> Result<(), TrainError> {
        (self.state, self.model, self.optim) =
            checkpoint.load_learner(self.model.clone(), self.optim.clone(), &self.device)?;
        Ok(())
    }

    fn non_finite_parameter(&self) -> Option<String> {
        rein_optim::non_finite_parameter(&self.model)
    }
}

/// Linear warm-up to `lr`, then linear decay to 10% of it.
fn sft_lr(section: &SftSection, step: usize) -> f64 {
    let warmup = section.warmup_steps.max(1);
    if step <= warmup {
        return section.lr * step as f64 / warmup as f64;
    }
    let progress = (step - warmup) as f64 / (section.steps.saturating_sub(warmup)).max(1) as f64;
    section.lr * (1.0 - 0.9 * progress.min(1.0))
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
