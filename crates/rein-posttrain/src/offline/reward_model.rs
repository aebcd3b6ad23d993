//! Reward-model training: a sequence classifier with one score, trained on preference pairs so
//! that the preferred completion scores higher — the Bradley–Terry loss of
//! `rein_optim::bradley_terry_loss` (InstructGPT's reward model, TRL's `RewardTrainer`).
//!
//! Each step draws `batch_size` random pairs and scores their `2 · batch_size` sequences (prompt
//! and completion) in one batch, read at each sequence's last token that is not padding.
//! AdamW with linear warm-up then linear decay to 10% of the peak rate, global gradient
//! clipping. Held-out pairwise accuracy (the share of pairs whose chosen completion scores
//! higher) every `eval_every` steps (the run measures it before and after too).

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig, GradientsParams};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use rein_model::lm::SequenceClassifier;
use rein_model::{ReinAutodiffBackend, ReinBackend};
use rein_optim::{bradley_terry_loss, warmup_then_decay};
use rein_recipe::RewardModelSection;
use rein_sampler::SeededRng;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::LmError;
use crate::batch::{floats, mean};
use crate::data::preferences::PreferencePair;
use rein_run::checkpoint::{Checkpoint, learner_sections};
use rein_run::driver::{Snapshot, Step, Trainer};
use rein_run::watchdog::Phases;

/// What a reward-model checkpoint stores besides the model and optimiser.
#[derive(Clone, Serialize, Deserialize)]
struct BradleyTerryState {
    rng: SeededRng,
}

/// Trains a reward model on preference pairs (see the module docs).
pub struct BradleyTerry<'a, B: ReinAutodiffBackend> {
    /// The reward model being trained.
    pub model: SequenceClassifier<B>,
    optim: OptimizerAdaptor<AdamW, SequenceClassifier<B>, B>,
    pairs: &'a [PreferencePair],
    test: &'a [PreferencePair],
    section: &'a RewardModelSection,
    state: BradleyTerryState,
    device: B::Device,
}

/// The scores of a batch of pairs: the chosen sequences' and the rejected ones'.
pub struct PairScores<B: burn::tensor::backend::Backend> {
    /// `[pairs]`.
    pub chosen: Tensor<B, 1>,
    /// `[pairs]`.
    pub rejected: Tensor<B, 1>,
}

/// The reward model's score of each completion of `pairs`, the sequences batched together
/// (chosen ones first).
pub fn pair_scores<B: ReinBackend>(
    model: &SequenceClassifier<B>,
    pairs: &[&PreferencePair],
    device: &B::Device,
) -> PairScores<B> {
    let join = |completion: &[u32], prompt: &[u32]| [prompt, completion].concat();
    let sequences: Vec<Vec<u32>> = (pairs.iter().map(|p| join(&p.chosen, &p.prompt)))
        .chain(pairs.iter().map(|p| join(&p.rejected, &p.prompt)))
        .collect();
    let n = pairs.len();
    let scores = model.scores(&sequences, device).narrow(1, 0, 1).reshape([2 * n]);
    PairScores {
        chosen: scores.clone().narrow(0, 0, n),
        rejected: scores.narrow(0, n, n),
    }
}

/// The share of `pairs` whose chosen completion the model scores higher, scored 32 pairs at a
/// time; `None` without pairs.
pub fn pairwise_accuracy<B: ReinBackend>(
    model: &SequenceClassifier<B>,
    pairs: &[PreferencePair],
    device: &B::Device,
) -> Option<f64> {
    if pairs.is_empty() {
        return None;
    }
    let mut right = 0usize;
    for chunk in pairs.chunks(32) {
        let chunk: Vec<&PreferencePair> = chunk.iter().collect();
        let scores = pair_scores(model, &chunk, device);
        let (chosen, rejected) = (floats(scores.chosen), floats(scores.rejected));
        right += chosen.iter().zip(&rejected).filter(|(c, r)| c > r).count();
    }
    Some(right as f64 / pairs.len() as f64)
}

impl<'a, B: ReinAutodiffBackend> BradleyTerry<'a, B> {
    /// Trains `model` on `pairs`, measuring accuracy on `test`.
    pub fn new(
        model: SequenceClassifier<B>,
        pairs: &'a [PreferencePair],
        test: &'a [PreferencePair],
        section: &'a RewardModelSection,
        seed: u64,
        device: &B::Device,
    ) -> Result<Self, LmError> {
        if pairs.is_empty() {
            return Err(LmError::Unsupported(
                "reward-model training has no preference pairs (every row was skipped?)".into(),
            ));
        }
        let optim = AdamWConfig::new()
            .with_weight_decay(section.weight_decay)
            .with_epsilon(1e-8)
            .init::<B, SequenceClassifier<B>>();
        Ok(Self {
            model,
            optim,
            pairs,
            test,
            section,
            state: BradleyTerryState {
                rng: SeededRng::new(seed ^ 0xB7),
            },
            device: device.clone(),
        })
    }

    /// Held-out pairwise accuracy of the model as it is.
    pub fn test_accuracy(&self) -> Option<f64> {
        pairwise_accuracy(&self.model.valid(), self.test, &self.device)
    }
}

impl<B: ReinAutodiffBackend> Trainer for BradleyTerry<'_, B> {
    type Error = LmError;

    fn total_steps(&self) -> usize {
        self.section.steps
    }

    fn step(&mut self, step: usize, phases: &Phases) -> Result<Step, LmError> {
        let n = self.pairs.len() as u64;
        let picked: Vec<&PreferencePair> = (0..self.section.batch_size)
            .map(|_| &self.pairs[self.state.rng.below(n) as usize])
            .collect();
        let backward = phases.enter("backward", format!("the loss of {} pairs", picked.len()));
        let graph = rein_model::one_graph();
        let scores = pair_scores(&self.model, &picked, &self.device);
        let margins: Vec<f32> = picked.iter().map(|p| p.margin).collect();
        let margin = Tensor::<B, 1>::from_data(TensorData::new(margins, [picked.len()]), &self.device);
        let (chosen, rejected) = (
            floats(scores.chosen.clone().inner()),
            floats(scores.rejected.clone().inner()),
        );
        let loss = bradley_terry_loss(
            scores.chosen,
            scores.rejected,
            margin,
            self.section.center_rewards_coefficient,
        );
        let loss_value: f32 = loss.clone().into_scalar().elem();
        rein_run::RunError::check_loss(step, "reward-model loss", loss_value)?;
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

        let gaps: Vec<f32> = chosen.iter().zip(&rejected).map(|(c, r)| c - r).collect();
        let accuracy = gaps.iter().filter(|&&g| g > 0.0).count() as f64 / gaps.len() as f64;
        let mut record = json!({
            "step": step,
            "rm/loss": loss_value,
            "rm/accuracy": accuracy,
            "rm/margin": mean(&gaps),
            "rm/chosen": mean(&chosen),
            "rm/rejected": mean(&rejected),
            "rm/lr": lr,
            "rm/grad_norm": grad_norm,
        });
        let every = self.section.eval_every;
        if every > 0 && step.is_multiple_of(every) {
            let _eval = phases.enter("eval", "held-out pairwise accuracy");
            record["eval/pairwise_accuracy"] = self.test_accuracy().into();
        }
        Ok(Step {
            record: record.as_object().cloned().unwrap_or_default(),
            done: false,
            progress: format!(
                "reward-model step {step}/{} | loss {loss_value:.3} | accuracy {:.0}%",
                self.section.steps,
                100.0 * accuracy
            ),
        })
    }

    fn snapshot(&self) -> Snapshot {
        let (model, optim, state) = (self.model.clone(), self.optim.clone(), self.state.clone());
        Box::new(move || learner_sections::<B, SequenceClassifier<B>, _, _>(&state, &model, &optim))
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
