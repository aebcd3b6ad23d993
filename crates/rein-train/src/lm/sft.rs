//! Supervised fine-tuning: cross-entropy on the target completion, prompt tokens masked.
//!
//! ```text
//! L = − Σ_i Σ_t m_it log π_θ(y_it | x_i, y_i,<t) / Σ_i Σ_t m_it
//! ```

use std::time::Instant;

use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::ElementConversion;
use rein_model::AutodiffBackend;
use rein_model::lm::CausalLm;
use rein_optim::clip_grad_norm;
use rein_sampler::SeededRng;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::Prompt;
use super::batch::{TokenBatch, completion_log_probs};
use crate::MetricsWriter;
use crate::checkpoint::{Checkpointing, module_bytes, optimizer_bytes};
use crate::ppo::TrainError;
use crate::progress::Progress;
use rein_recipe::SftSection;

/// What an SFT checkpoint stores besides the model and optimiser.
#[derive(Serialize, Deserialize)]
struct SftState {
    step: usize,
    metrics_len: u64,
    rng: SeededRng,
    tokens_seen: usize,
    elapsed_s: f64,
}

/// Fine-tunes `model` on the prompts' targets for `section.steps` steps of `section.batch_size`
/// random examples; logs `sft/*` metrics; checkpoints and resumes as `checkpointing` says.
#[allow(clippy::too_many_arguments)]
pub fn train_sft<B: AutodiffBackend>(
    mut model: CausalLm<B>,
    prompts: &[Prompt],
    pad_id: u32,
    section: &SftSection,
    seed: u64,
    mut metrics: Option<&mut MetricsWriter>,
    checkpointing: &Checkpointing,
    device: &B::Device,
) -> Result<CausalLm<B>, TrainError> {
    let with_target: Vec<&Prompt> = prompts.iter().filter(|p| p.target.is_some()).collect();
    if with_target.is_empty() {
        return Err(TrainError::Unsupported {
            plugin: String::new(),
            message: "SFT needs examples with a target completion".into(),
        });
    }
    let mut optim = AdamWConfig::new()
        .with_weight_decay(section.weight_decay)
        .with_epsilon(1e-8)
        .init::<B, CausalLm<B>>();
    let mut rng = SeededRng::new(seed ^ 0x5F7);
    let mut progress = Progress::new();
    let mut tokens_seen = 0usize;
    let mut first = 1;
    let mut elapsed_before = 0.0;
    if let Some(checkpoint) = &checkpointing.resume {
        let state: SftState = checkpoint.state()?;
        model = checkpoint.load_module("model", model, device)?;
        optim = checkpoint.load_optimizer::<B, CausalLm<B>, _>("optimizer", optim, device)?;
        (rng, tokens_seen, first, elapsed_before) = (state.rng, state.tokens_seen, state.step + 1, state.elapsed_s);
    }
    let start = Instant::now();
    for step in first..=section.steps {
        let picked: Vec<&Prompt> = (0..section.batch_size)
            .map(|_| with_target[rng.below(with_target.len() as u64) as usize])
            .collect();
        let pairs: Vec<(&[u32], &[u32])> = picked
            .iter()
            .map(|p| (p.tokens.as_slice(), p.target.as_deref().unwrap_or(&[])))
            .collect();
        let batch = TokenBatch::new(&pairs, pad_id);
        let mask = batch.mask::<B>(device);
        let (log_prob, _) = completion_log_probs(&model, &batch, 1.0, false, device);
        let count = batch.completion_mask.iter().sum::<f32>().max(1.0);
        tokens_seen += count as usize;
        let loss = (log_prob * mask).sum().neg().div_scalar(count);
        let loss_value: f32 = loss.clone().into_scalar().elem();
        TrainError::check_loss(step, "SFT loss", loss_value)?;
        let mut grads = GradientsParams::from_grads(loss.backward(), &model);
        let grad_norm = clip_grad_norm(&model, &mut grads, section.max_grad_norm);
        TrainError::check_gradients(step, grad_norm, &model, &grads)?;
        let lr = sft_lr(section, step);
        model = optim.step(lr, model, grads);
        let elapsed = elapsed_before + start.elapsed().as_secs_f64();
        if let Some(m) = metrics.as_deref_mut() {
            m.write(&json!({
                "stage": "sft",
                "step": step,
                "sft/loss": loss_value,
                "sft/lr": lr,
                "sft/grad_norm": grad_norm,
                "sft/tokens_per_s": tokens_seen as f64 / elapsed.max(1e-9),
                "time/elapsed_s": elapsed,
            }))?;
        }
        progress.show(
            &format!(
                "sft step {step}/{} | loss {loss_value:.3} | {:.0} tokens/s",
                section.steps,
                tokens_seen as f64 / elapsed.max(1e-9)
            ),
            step == section.steps,
        );
        checkpointing.after_step(step, section.steps, &model, || {
            let state = SftState {
                step,
                metrics_len: metrics.as_deref().map_or(0, MetricsWriter::bytes_written),
                rng: rng.clone(),
                tokens_seen,
                elapsed_s: elapsed,
            };
            vec![
                ("state", serde_json::to_vec(&state).expect("the state serialises")),
                ("model", module_bytes(&model)),
                ("optimizer", optimizer_bytes::<B, CausalLm<B>, _>(&optim)),
            ]
        })?;
    }
    progress.finish();
    Ok(model)
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
