//! Direct preference optimisation of a language model on (prompt, chosen, rejected) pairs: the
//! DPO family of `rein_optim::dpo_loss` (DPO, IPO, hinge, robust; the loss and its paper's
//! equation are in rein-optim's `dpo.rs`, a batch of pairs through the model in
//! `preference_batch.rs`), against a frozen reference.
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
use burn::optim::{AdamW, AdamWConfig, GradientsParams};
use burn::tensor::ElementConversion;
use rein_model::ReinAutodiffBackend;
use rein_model::lm::CausalLm;
use rein_optim::{DpoConfig, warmup_then_decay};
use rein_recipe::DpoSection;
use rein_sampler::SeededRng;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::LmError;
use crate::data::preferences::PreferencePair;
use crate::preference_batch::{dpo_batch_loss, pair_batch, pair_metrics, reference_log_probs};
use crate::seeds::{DROPOUT_SALT, generation_seed};
use rein_run::checkpoint::{Checkpoint, learner_sections};
use rein_run::driver::{Snapshot, Step, Trainer};
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
        let (pairs, pad_id, reference, device) = (self.pairs, self.pad_id, &self.reference, &self.device);
        let keep = self.section.precompute_ref;
        super::reference_values(&mut self.state.reference, picked, keep, |missing| {
            reference_log_probs(reference, &pair_batch(pairs, missing, pad_id), device)
        })
    }
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
