//! The data-parallel parity rows: SFT and GRPO steps with each batch split across two peers of
//! burn-collective's all-reduce, both on the device under test (`train.devices = 2` on one
//! GPU), against the same steps unsplit.

use std::path::Path;

use anyhow::Result;
use burn::backend::Autodiff;
use rein_model::ReinBackend;

use crate::parity::{guarded, model};
use crate::report::{Kind, Report};

/// Runs both rows on `device`, recording each in `report` (a row that errors or panics is
/// recorded as failed).
pub fn run<B: ReinBackend>(fixtures: &Path, device: &B::Device, report: &mut Report) {
    guarded::<B>(report, device, "sft split across two peers", Kind::Parity, |report| {
        sft_split_rows::<B>(fixtures, device, report)
    });
    guarded::<B>(report, device, "grpo split across two peers", Kind::Parity, |report| {
        grpo_split_rows::<B>(fixtures, device, report)
    });
}

/// Three SFT steps of the tiny Qwen2 with each batch on `devices` (split across them when
/// several): each step's loss and gradient norm.
fn sft_steps<B: ReinBackend>(fixtures: &Path, devices: Vec<B::Device>) -> Result<Vec<(f64, f64)>> {
    use rein_run::driver::Trainer;
    let model = model::<Autodiff<B>>(fixtures, "qwen2-gqa", &devices[0])?;
    let examples: Vec<rein_posttrain::Prompt> = (0..6u32)
        .map(|i| rein_posttrain::Prompt {
            text: String::new(),
            tokens: (0..2 + i % 3).map(|j| (i * 31 + j * 7 + 3) % 500).collect(),
            answer: None,
            target: Some((0..3 + i % 4).map(|j| (i * 13 + j * 17 + 5) % 500).collect()),
            target_trained: None,
            metadata: String::new(),
            source: String::new(),
            images: Default::default(),
            image_files: Default::default(),
        })
        .collect();
    let section = rein_recipe::SftSection {
        steps: 3,
        batch_size: 6,
        lr: 1e-3,
        warmup_steps: 0,
        ..rein_recipe::SftSection::default()
    };
    let mut sft = rein_posttrain::Sft::new(model, &examples, 0, &section, 4, devices)?;
    let phases = rein_run::watchdog::Phases::new(std::time::Duration::ZERO, Default::default());
    let mut steps = Vec::new();
    for step in 1..=3 {
        let record = sft.step(step, &phases)?.record;
        let value = |key: &str| record[key].as_f64().unwrap_or(f64::NAN);
        steps.push((value("sft/loss"), value("sft/grad_norm")));
    }
    Ok(steps)
}

/// SFT with each batch split across two peers of burn-collective's all-reduce, both on this
/// device (`train.devices` on one GPU), against the same steps unsplit: each step's loss and
/// gradient norm. (Not the parameters: AdamW turns the rounding noise of a gradient that is
/// zero in exact arithmetic, such as a key projection's bias, into steps of ±lr.)
fn sft_split_rows<B: ReinBackend>(fixtures: &Path, device: &B::Device, report: &mut Report) -> Result<()> {
    let one = sft_steps::<B>(fixtures, vec![device.clone()])?;
    let two = sft_steps::<B>(fixtures, vec![device.clone(), device.clone()])?;
    let flat = |steps: Vec<(f64, f64)>| steps.into_iter().flat_map(|(loss, norm)| [loss, norm]);
    report.parity(
        "sft split across 2 peers: losses and gradient norms vs unsplit",
        worst_relative(flat(one), flat(two)),
        1e-6,
        "",
        "max |Δ| over 3 steps (relative above 1)",
    );
    Ok(())
}

/// Scores each completion by its index in its group: 0, 1, 2, 0, …
struct ByIndex;

impl rein_core::RewardFn for ByIndex {
    fn name(&self) -> &str {
        "by-index"
    }

    fn score(&mut self, groups: &[rein_core::Group]) -> Result<Vec<rein_core::GroupScores>, rein_core::PluginError> {
        let score = |i: usize| rein_core::CompletionScore {
            score: Some((i % 3) as f64),
            ..rein_core::CompletionScore::default()
        };
        Ok(groups
            .iter()
            .map(|g| (0..g.completions.len()).map(score).collect())
            .collect())
    }
}

/// One GRPO step of the tiny Qwen2 (2 prompts × 4 sampled completions; two updates, so the
/// second's ratios move; the KL to the reference; a TIS correction) with each update on
/// `devices` (split across them when several): its loss, gradient norm, KL and clip fraction.
fn grpo_step_record<B: ReinBackend>(fixtures: &Path, devices: Vec<B::Device>) -> Result<[f64; 4]> {
    use rein_run::driver::Trainer;
    let model = model::<Autodiff<B>>(fixtures, "qwen2-gqa", &devices[0])?;
    let tokenizer = rein_model::lm::LmTokenizer::load(&fixtures.join("lm/qwen2-gqa"), &model.config().eos_ids())?;
    let prompts = (["one plus one", "two"].iter())
        .map(|&text| {
            Ok(rein_posttrain::Prompt {
                text: text.into(),
                tokens: tokenizer.encode(text)?,
                answer: None,
                target: None,
                target_trained: None,
                metadata: String::new(),
                source: String::new(),
                images: Default::default(),
                image_files: Default::default(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut rewards = [rein_posttrain::WeightedReward {
        reward: Box::new(ByIndex),
        weight: 1.0,
        isolate: false,
    }];
    let grpo = rein_recipe::GrpoSection {
        steps: 1,
        prompts_per_step: 2,
        updates_per_batch: 2,
        kl_coef: 0.1,
        correction: rein_core::LagCorrection::Tis,
        ..Default::default()
    };
    let sampler = rein_recipe::SamplerSection {
        temperature: 1.0,
        max_new_tokens: 6,
        n: 4,
        ..Default::default()
    };
    let optimizer = rein_recipe::OptimizerSection {
        lr: 2e-2,
        weight_decay: 0.0,
        ..Default::default()
    };
    let ctx = rein_posttrain::OnlineContext {
        tokenizer: &tokenizer,
        prompts: &prompts,
        rewards: &mut rewards,
        signals: &[],
        accuracy_reward: 0,
        curriculum: None,
        rollout: grpo.rollout(),
        sampler: &sampler,
        optimizer: &optimizer,
        seed: 7,
        agent: None,
    };
    let first = devices[0].clone();
    let mut algorithm = rein_posttrain::OnlineTrainer::new(model, ctx, rein_posttrain::Update::Grpo(&grpo), &first)?
        .with_devices(devices)?;
    let phases = rein_run::watchdog::Phases::new(std::time::Duration::ZERO, Default::default());
    let record = algorithm.step(1, &phases)?.record;
    Ok(["train/loss", "train/grad_norm", "train/kl", "train/clip_frac"]
        .map(|key| record.get(key).and_then(serde_json::Value::as_f64).unwrap_or(f64::NAN)))
}

/// A GRPO step with each update's batch split across two peers of burn-collective's
/// all-reduce, both on this device, against the same step unsplit: its logged means.
fn grpo_split_rows<B: ReinBackend>(fixtures: &Path, device: &B::Device, report: &mut Report) -> Result<()> {
    let one = grpo_step_record::<B>(fixtures, vec![device.clone()])?;
    let two = grpo_step_record::<B>(fixtures, vec![device.clone(), device.clone()])?;
    report.parity(
        "grpo split across 2 peers: loss, gradient norm, KL, clip fraction vs unsplit",
        worst_relative(one, two),
        1e-6,
        "",
        "max |Δ| of the step's means over 2 updates (relative above 1)",
    );
    Ok(())
}

/// The largest `|a − b| / max(|a|, 1)` over the pairs (NaN counts as infinite).
fn worst_relative(one: impl IntoIterator<Item = f64>, other: impl IntoIterator<Item = f64>) -> f64 {
    (one.into_iter().zip(other))
        .map(|(a, b)| (a - b).abs() / a.abs().max(1.0))
        .fold(0.0, |m: f64, d| if d.is_nan() { f64::INFINITY } else { m.max(d) })
}
