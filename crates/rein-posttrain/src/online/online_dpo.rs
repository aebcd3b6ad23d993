//! LEARN for online DPO (iterative DPO as WebThinker trains; TRL's `OnlineDPOTrainer`): the
//! step's groups were sampled from the current policy and scored like GRPO's; each group gives
//! one pair, its best-rewarded completion against its worst, and one DPO update
//! (`rein_optim::dpo_loss`) on those pairs against the frozen starting policy. A group whose
//! best and worst rewards are equal prefers nothing: it is skipped and counted
//! (`dpo/ties`).

use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::ElementConversion;
use rein_model::ReinAutodiffBackend;
use rein_optim::{DpoConfig, clip_grad_norm};
use serde_json::json;

use super::Stage;
use super::sample::Scored;
use crate::LmError;
use crate::data::preferences::PreferencePair;
use crate::preference_batch::{dpo_batch_loss, pair_batch, pair_metrics, reference_log_probs};
use crate::seeds::{DROPOUT_SALT, generation_seed};
use rein_run::driver::Record;
use rein_run::watchdog::Phases;

/// Each group's best and worst completion as a pair, and how many groups tied.
fn best_against_worst(batch: &[Scored]) -> (Vec<PreferencePair>, usize) {
    let mut ties = 0;
    let mut pairs = Vec::with_capacity(batch.len());
    for group in batch {
        let order = |a: &usize, b: &usize| group.rewards[*a].total_cmp(&group.rewards[*b]);
        let indices = 0..group.rewards.len();
        // The first of equal bests and the first of equal worsts: deterministic.
        let best = indices.clone().rev().max_by(order);
        let worst = indices.min_by(order);
        let (Some(best), Some(worst)) = (best, worst) else {
            continue;
        };
        if group.rewards[best] <= group.rewards[worst] {
            ties += 1;
            continue;
        }
        let (chosen, rejected) = (&group.rollouts[best], &group.rollouts[worst]);
        pairs.push(PreferencePair {
            prompt: chosen.opening.clone(),
            chosen: chosen.tokens.clone(),
            rejected: rejected.tokens.clone(),
            margin: 0.0,
        });
    }
    (pairs, ties)
}

impl<B: ReinAutodiffBackend> Stage<'_, B> {
    /// One DPO update on the best-against-worst pairs of the step's groups (none when every
    /// group tied).
    pub(super) fn learn_preferences(
        &mut self,
        step: usize,
        batch: &[Scored],
        config: &DpoConfig,
        phases: &Phases,
    ) -> Result<Record, LmError> {
        let (pairs, ties) = best_against_worst(batch);
        let rewards: Vec<f64> = batch.iter().flat_map(|g| g.rewards.iter().copied()).collect();
        let mean_reward = rewards.iter().sum::<f64>() / rewards.len().max(1) as f64;
        self.state.rewards.push(mean_reward);
        let mut record = Record::new();
        record.insert("train/reward".into(), json!(mean_reward));
        record.insert("dpo/pairs".into(), json!(pairs.len()));
        record.insert("dpo/ties".into(), json!(ties));
        if pairs.is_empty() {
            eprintln!("step {step}: every group's completions scored the same; nothing to prefer");
            return Ok(record);
        }
        let picked: Vec<usize> = (0..pairs.len()).collect();
        let tokens = pair_batch(&pairs, &picked, self.pad);
        let reference = {
            let _phase = phases.enter("reference", "the reference's log-probabilities");
            let model = self.reference.as_ref().expect("online DPO keeps its reference");
            reference_log_probs(model, &tokens, &self.device)
        };
        let backward = phases.enter("backward", format!("the DPO loss of {} pairs", pairs.len()));
        self.model
            .set_dropout_key(generation_seed(self.ctx.seed ^ DROPOUT_SALT, step, 0));
        let graph = rein_model::one_graph();
        let (out, policy) = dpo_batch_loss(&self.model, &tokens, &reference, config, &self.device);
        record.extend(pair_metrics(&out, &policy));
        let loss: f32 = out.loss.clone().into_scalar().elem();
        rein_run::RunError::check_loss(step, "online DPO loss", loss)?;
        let mut grads = GradientsParams::from_grads(out.loss.backward(), &self.model);
        drop(graph);
        drop(backward);
        let _optimizer = phases.enter("optimizer", "clipping and applying the gradients");
        let grad_norm = clip_grad_norm(&self.model, &mut grads, self.ctx.optimizer.max_grad_norm);
        rein_run::RunError::check_gradients(step, grad_norm, || rein_optim::non_finite_gradient(&self.model, &grads))?;
        let lr = self.lr.at(step);
        self.model = self.optim.step(lr, self.model.clone(), grads);

        record.insert("dpo/loss".into(), json!(loss));
        record.insert("train/grad_norm".into(), json!(grad_norm));
        record.insert("train/learning_rate".into(), json!(lr));
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::sample::Rollout;
    use super::*;

    fn group(rewards: &[f64]) -> Scored {
        let rollout = |i: usize| Rollout {
            opening: vec![1, 2],
            tokens: vec![10 + i as u32],
            logprobs: vec![0.0],
            trained: None,
            truncated: false,
            text: String::new(),
            env_reward: None,
            turns: Vec::new(),
            version: 0,
            routes: None,
            certainty: Vec::new(),
            char_ends: Default::default(),
            images: Default::default(),
            branch: None,
        };
        Scored {
            prompt: 0,
            rollouts: (0..rewards.len()).map(rollout).collect(),
            rewards: rewards.to_vec(),
            components: BTreeMap::new(),
            steps: vec![Vec::new(); rewards.len()],
        }
    }

    #[test]
    fn each_group_pairs_its_best_against_its_worst_and_ties_are_skipped() {
        let batch = [
            group(&[0.0, 1.0, 0.5, 1.0]),
            group(&[0.2, 0.2, 0.2]),
            group(&[0.3, -1.0]),
        ];
        let (pairs, ties) = best_against_worst(&batch);
        assert_eq!(ties, 1);
        assert_eq!(pairs.len(), 2);
        // The first of the equal bests (completion 1), the worst (completion 0).
        assert_eq!(
            (pairs[0].chosen.as_slice(), pairs[0].rejected.as_slice()),
            (&[11][..], &[10][..])
        );
        assert_eq!(
            (pairs[1].chosen.as_slice(), pairs[1].rejected.as_slice()),
            (&[10][..], &[11][..])
        );
        assert_eq!(pairs[0].prompt, vec![1, 2]);
    }
}
