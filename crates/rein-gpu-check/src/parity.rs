//! The parity rows: what rein computes on the device under test against what transformers and
//! PyTorch computed for the same checkpoints (the fixtures of `tests/fixtures/`, written by
//! `gen_checkpoints.py` and `gen_torch_step.py`). The same rows pass on the CPU in the test
//! suite; here they run on whichever backend the binary was asked for.

use std::path::Path;

use anyhow::{Context as _, Result, bail};
use burn::backend::Autodiff;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use rein_core::{Aggregation, KlEstimator, RatioLevel};
use rein_model::lm::{CausalLm, Context, load, save};
use rein_model::{ReinAutodiffBackend, ReinBackend};
use rein_optim::{PolicyLossConfig, clip_grad_norm, policy_loss};
use rein_sampler::{GenerationConfig, generate};
use rein_train::lm::{TokenBatch, completion_log_probs};
use safetensors::SafeTensors;
use serde::Deserialize;

use crate::report::{Kind, Report};

/// The causal-LM fixtures whose logits and greedy continuations transformers wrote.
pub const CHECKPOINTS: [&str; 4] = ["qwen2-gqa", "qwen2-tied", "llama", "llama-bf16-sharded"];

/// Logits within this of transformers' (f32 weights; the bf16 checkpoint is upcast on load).
pub const LOGIT_BOUND: f64 = 1e-4;

/// Runs every parity row on `device`, recording each in `report`; a row that errors or panics
/// is recorded as failed and the others still run.
pub fn run<B: ReinBackend>(fixtures: &Path, device: &B::Device, report: &mut Report) {
    for name in CHECKPOINTS {
        guarded::<B>(report, device, &format!("logits {name}"), Kind::Parity, |report| {
            logits_row::<B>(fixtures, name, device, report)
        });
        guarded::<B>(report, device, &format!("greedy {name}"), Kind::Parity, |report| {
            greedy_row::<B>(fixtures, name, device, report)
        });
    }
    guarded::<B>(
        report,
        device,
        "grpo step (qwen2-gqa) vs PyTorch",
        Kind::Parity,
        |report| grpo_step_rows::<Autodiff<B>>(fixtures, device, report),
    );
}

/// Runs `check`, turning an error or a panic into a failed row named `name`; then waits for
/// the device, so that kernel launches that failed during the check (errors a backend may only
/// report at the next read) are charged to it, as a failed row of their own, and not to the
/// next check.
pub fn guarded<B: Backend>(
    report: &mut Report,
    device: &B::Device,
    name: &str,
    kind: Kind,
    check: impl FnOnce(&mut Report) -> Result<()>,
) {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(report)));
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => report.failed(name, kind, summary(&format!("{e:#}"))),
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            report.failed(name, kind, format!("panicked: {}", summary(message)));
        }
    }
    if let Err(e) = B::sync(device) {
        report.failed(format!("{name}: device errors"), kind, summary(&format!("{e:?}")));
    }
}

/// A backend error in one line: how many kernel launches failed and the first cause.
fn summary(error: &str) -> String {
    let launches = error.matches("Launch(").count();
    let cause = error
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("DriverError") || l.contains("CUDA_ERROR"))
        .or_else(|| error.lines().next())
        .unwrap_or("");
    match launches {
        0 => cause.to_string(),
        n => format!("{n} kernel launches failed: {cause}"),
    }
}

fn model<B: ReinBackend>(fixtures: &Path, name: &str, device: &B::Device) -> Result<CausalLm<B>> {
    let dir = fixtures.join("lm").join(name);
    load::<B>(&dir, device).with_context(|| format!("loading {}", dir.display()))
}

/// A tensor of `<name>.expected.safetensors` as (shape, values).
fn expected(fixtures: &Path, name: &str, tensor: &str) -> Result<(Vec<usize>, Vec<f64>)> {
    let path = fixtures.join("lm").join(format!("{name}.expected.safetensors"));
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let file = SafeTensors::deserialize(&bytes).with_context(|| format!("parsing {}", path.display()))?;
    let view = file
        .tensor(tensor)
        .with_context(|| format!("{} has no `{tensor}`", path.display()))?;
    let values = match view.dtype() {
        safetensors::Dtype::F32 => view
            .data()
            .chunks_exact(4)
            .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect(),
        safetensors::Dtype::I64 => view
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default()) as f64)
            .collect(),
        other => bail!("{}: `{tensor}` is {other:?}, not F32 or I64", path.display()),
    };
    Ok((view.shape().to_vec(), values))
}

fn ids<B: ReinBackend>(values: &[f64], shape: [usize; 2], device: &B::Device) -> Tensor<B, 2, Int> {
    let data = TensorData::new(values.iter().map(|&v| v as i64).collect::<Vec<_>>(), shape);
    Tensor::from_data(data, device)
}

/// Full-sequence logits without a cache, flattened; with the fused projections generation uses
/// when `fused`.
fn logits<B: ReinBackend>(model: &CausalLm<B>, tokens: Tensor<B, 2, Int>, fused: bool) -> Result<Vec<f32>> {
    let [batch, seq] = tokens.dims();
    let device = tokens.device();
    let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &device)
        .unsqueeze::<2>()
        .expand([batch, seq]);
    let rope = model.rope(seq, &device);
    let projections = model.fused_projections();
    let ctx = Context {
        rope: &rope,
        positions,
        padding: None,
        sequence_lengths: None,
        fused: fused.then_some(&projections),
    };
    crate::probe::read(model.forward(tokens, &ctx, None)).context("reading the logits back")
}

fn logits_row<B: ReinBackend>(fixtures: &Path, name: &str, device: &B::Device, report: &mut Report) -> Result<()> {
    let m = model::<B>(fixtures, name, device)?;
    let (shape, input) = expected(fixtures, name, "input_ids")?;
    let (_, want) = expected(fixtures, name, "logits")?;
    for fused in [false, true] {
        let got = logits(&m, ids::<B>(&input, [shape[0], shape[1]], device), fused)?;
        if got.len() != want.len() {
            bail!("{} logits, transformers wrote {}", got.len(), want.len());
        }
        let worst = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (f64::from(*g) - w).abs())
            .fold(0.0, |a: f64, d| if d.is_nan() { f64::NAN } else { a.max(d) });
        let label = if fused { "fused" } else { "unfused" };
        report.parity(
            format!("logits {name} ({label})"),
            worst,
            LOGIT_BOUND,
            "",
            format!("max |Δ| vs transformers over {} logits", got.len()),
        );
    }
    Ok(())
}

fn greedy_row<B: ReinBackend>(fixtures: &Path, name: &str, device: &B::Device, report: &mut Report) -> Result<()> {
    let m = model::<B>(fixtures, name, device)?;
    let (shape, padded) = expected(fixtures, name, "padded_input_ids")?;
    let (_, mask) = expected(fixtures, name, "padded_attention_mask")?;
    let (_, greedy) = expected(fixtures, name, "greedy")?;
    let (batch, seq) = (shape[0], shape[1]);
    let new = greedy.len() / batch - seq;
    let prompts: Vec<Vec<u32>> = (0..batch)
        .map(|b| {
            (0..seq)
                .filter(|&j| mask[b * seq + j] != 0.0)
                .map(|j| padded[b * seq + j] as u32)
                .collect()
        })
        .collect();
    let config = GenerationConfig {
        max_new_tokens: new,
        temperature: 0.0,
        ..GenerationConfig::default()
    };
    let out = generate(&m, &prompts, &config, 0, &mut |_, _| false, device);
    let mut differing = 0;
    for (b, g) in out.iter().enumerate() {
        let want: Vec<u32> = greedy[b * (seq + new) + seq..(b + 1) * (seq + new)]
            .iter()
            .map(|&t| t as u32)
            .collect();
        differing += g.tokens.iter().zip(&want).filter(|(a, b)| a != b).count();
        differing += g.tokens.len().abs_diff(want.len());
    }
    report.parity(
        format!("greedy tokens {name}"),
        differing as f64,
        0.0,
        "tokens",
        format!(
            "differing from transformers' greedy, of {} ({batch} left-padded prompts)",
            batch * new
        ),
    );
    Ok(())
}

/// The batch and settings of `torch_grpo_step.json`, with PyTorch's loss and gradient norm.
#[derive(Deserialize)]
struct Step {
    lr: f64,
    betas: (f32, f32),
    eps: f32,
    weight_decay: f32,
    max_grad_norm: f32,
    temperature: f32,
    clip: f32,
    prompts: Vec<Vec<u32>>,
    completions: Vec<Vec<u32>>,
    old_log_prob: Vec<Vec<f32>>,
    advantages: Vec<f32>,
    loss: f64,
    grad_norm: f64,
}

fn f32s(view: &safetensors::tensor::TensorView<'_>) -> Vec<f32> {
    view.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// GRPO's loss as the fixtures compute it: token-level clipped ratios at `±clip`, averaged per
/// sequence then over the batch, no KL and no entropy term.
pub fn token_clipped_loss(clip: f32, max_completion_len: usize) -> PolicyLossConfig {
    PolicyLossConfig {
        level: RatioLevel::Token,
        clip_low: clip,
        clip_high: clip,
        dual_clip: None,
        aggregation: Aggregation::SeqMeanTokenMean,
        max_completion_len,
        kl_coef: 0.0,
        kl_estimator: KlEstimator::K3,
        kl_importance_weighted: false,
        entropy_coef: 0.0,
    }
}

/// One GRPO step of the tiny Qwen2 — forward, the clipped policy loss, backward, gradient
/// clipping and AdamW — against PyTorch's (the test suite's `one_grpo_step_matches_pytorch`).
fn grpo_step_rows<B: ReinAutodiffBackend>(fixtures: &Path, device: &B::Device, report: &mut Report) -> Result<()> {
    let path = fixtures.join("torch_grpo_step.json");
    let step: Step =
        serde_json::from_str(&std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?)
            .with_context(|| format!("parsing {}", path.display()))?;
    let model = model::<B>(fixtures, "qwen2-gqa", device)?;
    let pairs: Vec<(&[u32], &[u32])> = (step.prompts.iter().zip(&step.completions))
        .map(|(p, c)| (p.as_slice(), c.as_slice()))
        .collect();
    let batch = TokenBatch::new(&pairs, 0);
    let (log_prob, _) = completion_log_probs(&model, &batch, step.temperature, false, device);
    let old: Vec<&[f32]> = step.old_log_prob.iter().map(Vec::as_slice).collect();
    let advantages = Tensor::<B, 2>::from_data(TensorData::new(step.advantages.clone(), [batch.rows, 1]), device);
    let config = token_clipped_loss(step.clip, batch.completion_width);
    let old = Tensor::<B, 2>::from_data(
        TensorData::new(batch.per_token_values(&old), [batch.rows, batch.completion_width]),
        device,
    );
    let out = policy_loss(log_prob, old, advantages, batch.mask::<B>(device), None, None, &config);
    let loss: f64 = out.loss.clone().into_scalar().elem();
    report.parity(
        "grpo step: loss vs PyTorch",
        (loss - step.loss).abs(),
        1e-6,
        "",
        format!("rein {loss:.9} vs {:.9}", step.loss),
    );
    let mut grads = GradientsParams::from_grads(out.loss.backward(), &model);
    let norm: f64 = clip_grad_norm(&model, &mut grads, step.max_grad_norm).elem();
    report.parity(
        "grpo step: gradient norm (relative)",
        (norm - step.grad_norm).abs() / step.grad_norm,
        1e-4,
        "",
        format!("rein {norm:.7} vs {:.7}", step.grad_norm),
    );
    let mut optimizer = AdamWConfig::new()
        .with_beta_1(step.betas.0)
        .with_beta_2(step.betas.1)
        .with_epsilon(step.eps)
        .with_weight_decay(step.weight_decay)
        .init::<B, CausalLm<B>>();
    let model = optimizer.step(step.lr, model, grads);

    let dir = std::env::temp_dir().join(format!("rein-gpu-check-step-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    save(&model, &dir).with_context(|| format!("saving the stepped model to {}", dir.display()))?;
    let ours = std::fs::read(dir.join("model.safetensors"))?;
    let _ = std::fs::remove_dir_all(&dir);
    let ours = SafeTensors::deserialize(&ours)?;
    let theirs = std::fs::read(fixtures.join("torch_grpo_step.safetensors"))?;
    let theirs = SafeTensors::deserialize(&theirs)?;
    let (mut worst, mut worst_name, mut compared) = (0.0f64, String::new(), 0);
    for (name, view) in theirs.tensors() {
        let expected = f32s(&view);
        let got = f32s(&ours.tensor(&name).with_context(|| format!("rein saved no `{name}`"))?);
        if got.len() != expected.len() {
            bail!("`{name}`: {} values, PyTorch has {}", got.len(), expected.len());
        }
        for (g, e) in got.iter().zip(&expected) {
            let d = f64::from((g - e).abs());
            if d > worst || d.is_nan() {
                worst = if d.is_nan() { f64::INFINITY } else { d };
                worst_name.clone_from(&name);
            }
        }
        compared += expected.len();
    }
    report.parity(
        "grpo step: AdamW parameters vs PyTorch",
        worst,
        1e-4,
        "",
        format!("max |Δ| over {compared} parameters (worst in {worst_name})"),
    );
    Ok(())
}
