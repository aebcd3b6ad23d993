//! Process-reward-model training: a token classifier with two labels, trained on step-labelled
//! rows so that at each step's last token it predicts whether the step is right — the
//! cross entropy of `rein_optim::step_label_loss` (Uesato et al. 2022, Lightman et al. 2023;
//! TRL's `PRMTrainer`).
//!
//! Each step draws `batch_size` random rows and runs them in one batch, right-padded; only the
//! labelled tokens go through the head. AdamW with linear warm-up then linear decay to 10% of
//! the peak rate, global gradient clipping. Held-out step accuracy (the share of held-out steps
//! whose label the model predicts) every `eval_every` steps (the run measures it before and
//! after too).

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig, GradientsParams};
use burn::tensor::{ElementConversion, Tensor};
use rein_model::lm::TokenClassifier;
use rein_model::{ReinAutodiffBackend, ReinBackend};
use rein_optim::{step_label_accuracy, step_label_loss, warmup_then_decay};
use rein_recipe::ProcessRewardModelSection;
use rein_sampler::SeededRng;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::LmError;
use crate::batch::floats;
use crate::data::stepwise::StepLabelled;
use rein_run::checkpoint::{Checkpoint, learner_sections};
use rein_run::driver::{Snapshot, Step, Trainer};
use rein_run::watchdog::Phases;

/// What a process-reward-model checkpoint stores besides the model and optimiser.
#[derive(Clone, Serialize, Deserialize)]
struct PrmState {
    rng: SeededRng,
}

/// Trains a process reward model on step-labelled rows (see the module docs).
pub struct PrmTraining<'a, B: ReinAutodiffBackend> {
    /// The token classifier being trained.
    pub model: TokenClassifier<B>,
    optim: OptimizerAdaptor<AdamW, TokenClassifier<B>, B>,
    rows: &'a [StepLabelled],
    test: &'a [StepLabelled],
    section: &'a ProcessRewardModelSection,
    state: PrmState,
    device: B::Device,
}

/// The logits at the labelled tokens of `rows`, `[labels, 2]`, the rows batched together, with
/// their labels in the same order.
pub fn step_logits<B: ReinBackend>(
    model: &TokenClassifier<B>,
    rows: &[&StepLabelled],
    device: &B::Device,
) -> (Tensor<B, 2>, Vec<usize>) {
    let sequences: Vec<&[u32]> = rows.iter().map(|r| r.ids.as_slice()).collect();
    let at: Vec<(usize, usize)> = (rows.iter().enumerate())
        .flat_map(|(i, r)| r.at.iter().map(move |&p| (i, p)))
        .collect();
    let labels = rows.iter().flat_map(|r| r.labels.iter().copied()).collect();
    (model.logits_at(&sequences, &at, device), labels)
}

/// The share of the labelled steps of `rows` that the model predicts, 32 rows at a time;
/// `None` without rows.
pub fn step_accuracy<B: ReinBackend>(
    model: &TokenClassifier<B>,
    rows: &[StepLabelled],
    device: &B::Device,
) -> Option<f64> {
    let (mut right, mut total) = (0.0, 0usize);
    for chunk in rows.chunks(32) {
        let chunk: Vec<&StepLabelled> = chunk.iter().collect();
        let (logits, labels) = step_logits(model, &chunk, device);
        let width = model.labels().len();
        if let Some(accuracy) = step_label_accuracy(&floats(logits.flatten(0, 1)), width, &labels) {
            right += accuracy * labels.len() as f64;
            total += labels.len();
        }
    }
    (total > 0).then(|| right / total as f64)
}

impl<'a, B: ReinAutodiffBackend> PrmTraining<'a, B> {
    /// Trains `model` on `rows`, measuring step accuracy on `test`.
    pub fn new(
        model: TokenClassifier<B>,
        rows: &'a [StepLabelled],
        test: &'a [StepLabelled],
        section: &'a ProcessRewardModelSection,
        seed: u64,
        device: &B::Device,
    ) -> Result<Self, LmError> {
        if rows.is_empty() {
            return Err(LmError::Unsupported(
                "process-reward-model training has no step-labelled rows (every row was skipped?)".into(),
            ));
        }
        let optim = AdamWConfig::new()
            .with_weight_decay(section.weight_decay)
            .with_epsilon(1e-8)
            .init::<B, TokenClassifier<B>>();
        Ok(Self {
            model,
            optim,
            rows,
            test,
            section,
            state: PrmState {
                rng: SeededRng::new(seed ^ 0x9A3),
            },
            device: device.clone(),
        })
    }

    /// Held-out step accuracy of the model as it is.
    pub fn test_accuracy(&self) -> Option<f64> {
        step_accuracy(&self.model.valid(), self.test, &self.device)
    }
}

impl<B: ReinAutodiffBackend> Trainer for PrmTraining<'_, B> {
    type Error = LmError;

    fn total_steps(&self) -> usize {
        self.section.steps
    }

    fn step(&mut self, step: usize, phases: &Phases) -> Result<Step, LmError> {
        let n = self.rows.len() as u64;
        let picked: Vec<&StepLabelled> = (0..self.section.batch_size)
            .map(|_| &self.rows[self.state.rng.below(n) as usize])
            .collect();
        let backward = phases.enter("backward", format!("the loss of {} rows", picked.len()));
        let graph = rein_model::one_graph();
        let (logits, labels) = step_logits(&self.model, &picked, &self.device);
        let width = self.model.labels().len();
        let accuracy =
            step_label_accuracy(&floats(logits.clone().inner().flatten(0, 1)), width, &labels).unwrap_or(0.0);
        let loss = step_label_loss(logits, &labels);
        let loss_value: f32 = loss.clone().into_scalar().elem();
        rein_run::RunError::check_loss(step, "process-reward-model loss", loss_value)?;
        let grads = GradientsParams::from_grads(loss.backward(), &self.model);
        drop(graph);
        drop(backward);

        let optimizer = phases.enter("optimizer", "clipping and applying the gradients");
        let lr = warmup_then_decay(self.section.lr, self.section.warmup_steps, self.section.steps, step);
        let grad_norm;
        (self.model, grad_norm) = super::clipped_step(
            self.model.clone(),
            &mut self.optim,
            grads,
            (step, lr),
            self.section.max_grad_norm,
        )?;
        drop(optimizer);

        let right = labels.iter().filter(|&&l| l == 1).count() as f64 / labels.len() as f64;
        let mut record = json!({
            "step": step,
            "prm/loss": loss_value,
            "prm/accuracy": accuracy,
            "prm/steps": labels.len(),
            "prm/right_share": right,
            "prm/lr": lr,
            "prm/grad_norm": grad_norm,
        });
        let every = self.section.eval_every;
        if every > 0 && step.is_multiple_of(every) {
            let _eval = phases.enter("eval", "held-out step accuracy");
            record["eval/step_accuracy"] = self.test_accuracy().into();
        }
        Ok(Step {
            record: record.as_object().cloned().unwrap_or_default(),
            done: false,
            progress: format!(
                "process-reward-model step {step}/{} | loss {loss_value:.3} | step accuracy {:.0}%",
                self.section.steps,
                100.0 * accuracy
            ),
        })
    }

    fn snapshot(&self) -> Snapshot {
        let (model, optim, state) = (self.model.clone(), self.optim.clone(), self.state.clone());
        Box::new(move || learner_sections::<B, TokenClassifier<B>, _, _>(&state, &model, &optim))
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
