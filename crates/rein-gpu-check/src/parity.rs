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
use rein_optim::{PolicyLossConfig, PolicyObjective, clip_grad_norm, policy_loss};
use rein_posttrain::{TokenBatch, completion_log_probs};
use rein_sampler::{GenerationConfig, generate};
use safetensors::SafeTensors;
use serde::Deserialize;

use crate::report::{Kind, Report};

/// The causal-LM fixtures whose logits and greedy continuations transformers wrote.
pub const CHECKPOINTS: [&str; 4] = ["qwen2-gqa", "qwen2-tied", "llama", "llama-bf16-sharded"];

/// Logits within this of transformers' (f32 weights; the bf16 checkpoint is upcast on load).
pub const LOGIT_BOUND: f64 = 1e-4;

/// bf16 products (`model.dtype = "bf16"`): logits within this of transformers' with the same
/// linear layers in bf16. Rounding to bf16 amplifies the last bits of f32: the reference moves
/// by up to 3.0–4.5e-3 when its layers' inputs are perturbed by 1e-5 (`gen_bf16_logits.py`).
pub const BF16_LOGIT_BOUND: f64 = 1e-2;

/// The largest `|got − want|` (NaN counts as infinite).
fn worst_abs(got: &[f32], want: &[f64]) -> Result<f64> {
    if got.len() != want.len() {
        bail!("{} logits, transformers wrote {}", got.len(), want.len());
    }
    Ok(got
        .iter()
        .zip(want)
        .map(|(g, w)| (f64::from(*g) - w).abs())
        .fold(0.0, |a: f64, d| if d.is_nan() { f64::INFINITY } else { a.max(d) }))
}

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
    guarded::<B>(
        report,
        device,
        "grpo step with KL and LoRA vs the CPU",
        Kind::Parity,
        |report| lora_kl_step_rows::<B>(fixtures, device, report),
    );
    guarded::<B>(
        report,
        device,
        "multi-turn session vs the CPU",
        Kind::Parity,
        |report| session_rows::<B>(fixtures, device, report),
    );
}

/// Runs `f` on the CPU with rein's CPU kernels, whatever `--generic-ops` chose for the device side.
fn on_cpu_kernels<T>(f: impl FnOnce() -> T) -> T {
    let generic = rein_model::generic_ops();
    rein_model::use_generic_ops(false);
    let out = f();
    rein_model::use_generic_ops(generic);
    out
}

/// What a multi-turn [`rein_sampler::Session`] gave: each turn's tokens and log-probabilities per
/// sequence, and the next-token logits after each append.
#[derive(Default)]
struct SessionTrace {
    tokens: Vec<Vec<u32>>,
    logprobs: Vec<f32>,
    logits: Vec<f32>,
}

/// Three turns of 12 conversations (3 prompts × 4 samples, temperature 0.8, stop tokens) on the
/// tiny Qwen2, environment tokens appended between turns, every third conversation ending
/// after its first turn: the key/value cache kept, grown, trimmed and emptied as tool use does.
fn session_trace<B: ReinBackend>(fixtures: &Path, device: &B::Device) -> Result<SessionTrace> {
    use rein_sampler::{AfterTurn, Session};
    let model = model::<B>(fixtures, "qwen2-gqa", device)?;
    let vocab = model.config().vocab_size as u32;
    let prompts: Vec<Vec<u32>> = (0..3u32)
        .map(|i| (0..3 + 2 * i).map(|j| (i * 37 + j * 11) % vocab).collect())
        .collect();
    let config = GenerationConfig {
        max_new_tokens: 6,
        temperature: 0.8,
        n: 4,
        stop_token_ids: vec![7, 19],
        seed: 5,
        ..GenerationConfig::default()
    };
    let mut session = Session::start(&model, &prompts, &config, 0, device);
    let mut live: Vec<usize> = (0..12).collect();
    let mut trace = SessionTrace::default();
    for turn in 0..3 {
        for out in session.turn(&live, AfterTurn::Keep, &mut |_, _| false) {
            trace.logprobs.extend(&out.logprobs);
            trace.tokens.push(out.tokens);
        }
        let ending: Vec<usize> = live.iter().copied().filter(|&s| turn == 0 && s % 3 == 0).collect();
        session.end(&ending);
        live.retain(|s| !ending.contains(s));
        let additions: Vec<(usize, Vec<u32>)> = live
            .iter()
            .map(|&s| {
                (
                    s,
                    (0..1 + (s + turn) % 4).map(|j| ((s * 7 + j) as u32) % vocab).collect(),
                )
            })
            .collect();
        session.append(&additions);
        for (seq, _) in &additions {
            trace
                .logits
                .extend(session.next_logits(*seq).context("no logits after an append")?);
        }
    }
    session.end(&live);
    Ok(trace)
}

/// A multi-turn session on the device against the same session on the CPU: the same tokens,
/// their log-probabilities and the logits after each append within 1e-4.
fn session_rows<B: ReinBackend>(fixtures: &Path, device: &B::Device, report: &mut Report) -> Result<()> {
    let ours = session_trace::<B>(fixtures, device)?;
    let cpu = on_cpu_kernels(|| session_trace::<rein_model::Cpu>(fixtures, &Default::default()))?;
    let total: usize = cpu.tokens.iter().map(Vec::len).sum();
    let differing: usize = ours
        .tokens
        .iter()
        .zip(&cpu.tokens)
        .map(|(a, b)| a.iter().zip(b).filter(|(x, y)| x != y).count() + a.len().abs_diff(b.len()))
        .sum::<usize>()
        + ours.tokens.len().abs_diff(cpu.tokens.len());
    report.parity(
        "session tokens vs the CPU",
        differing as f64,
        0.0,
        "tokens",
        format!("differing, of {total} sampled over 3 turns of 12 conversations"),
    );
    let worst = |a: &[f32], b: &[f32]| {
        if a.len() != b.len() {
            return f64::INFINITY;
        }
        a.iter()
            .zip(b)
            .map(|(x, y)| f64::from((x - y).abs()))
            .fold(0.0, |m: f64, d| if d.is_nan() { f64::INFINITY } else { m.max(d) })
    };
    report.parity(
        "session log-probs and logits vs the CPU",
        worst(&ours.logprobs, &cpu.logprobs).max(worst(&ours.logits, &cpu.logits)),
        1e-4,
        "",
        format!(
            "max |Δ| over {} sampled log-probs and {} logits after appends",
            cpu.logprobs.len(),
            cpu.logits.len()
        ),
    );
    Ok(())
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

pub(crate) fn model<B: ReinBackend>(fixtures: &Path, name: &str, device: &B::Device) -> Result<CausalLm<B>> {
    let dir = fixtures.join("lm").join(name);
    load::<B>(&dir, device).with_context(|| format!("loading {}", dir.display()))
}

/// A tensor of `<name>.expected.safetensors` as (shape, values).
fn expected(fixtures: &Path, name: &str, tensor: &str) -> Result<(Vec<usize>, Vec<f64>)> {
    fixture_tensor(fixtures, &format!("{name}.expected"), tensor)
}

/// A tensor of the fixture `lm/<file>.safetensors` as (shape, values).
fn fixture_tensor(fixtures: &Path, file: &str, tensor: &str) -> Result<(Vec<usize>, Vec<f64>)> {
    let path = fixtures.join("lm").join(format!("{file}.safetensors"));
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
        sequences: None,
        fused: fused.then_some(&projections),
        routing: None,
    };
    crate::probe::read(model.forward(tokens, &ctx, None)).context("reading the logits back")
}

fn logits_row<B: ReinBackend>(fixtures: &Path, name: &str, device: &B::Device, report: &mut Report) -> Result<()> {
    use rein_core::ModelDtype;
    let (shape, input) = expected(fixtures, name, "input_ids")?;
    let loaded = model::<B>(fixtures, name, device)?;
    for (dtype, file, bound, against) in [
        (ModelDtype::F32, "expected", LOGIT_BOUND, "transformers"),
        (
            ModelDtype::Bf16,
            "bf16",
            BF16_LOGIT_BOUND,
            "transformers' bf16 linear layers",
        ),
    ] {
        if dtype == ModelDtype::Bf16 && !B::supports_dtype(device, burn::tensor::DType::BF16) {
            // wgpu's shaders (WGSL) have no bf16; CUDA has.
            report.info(format!("logits {name} (bf16)"), "not run: this device has no bf16");
            continue;
        }
        let m = loaded.clone().with_dtype(dtype);
        let (_, want) = fixture_tensor(fixtures, &format!("{name}.{file}"), "logits")?;
        for fused in [false, true] {
            let got = logits(&m, ids::<B>(&input, [shape[0], shape[1]], device), fused)?;
            let worst = worst_abs(&got, &want)?;
            let label = match (dtype, fused) {
                (ModelDtype::F32, false) => "unfused",
                (ModelDtype::F32, true) => "fused",
                (ModelDtype::Bf16, false) => "bf16, unfused",
                (ModelDtype::Bf16, true) => "bf16, fused",
            };
            report.parity(
                format!("logits {name} ({label})"),
                worst,
                bound,
                "",
                format!("max |Δ| vs {against} over {} logits", got.len()),
            );
        }
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
        objective: PolicyObjective::Clip,
        clip_low: clip,
        clip_high: clip,
        dual_clip: None,
        aggregation: Aggregation::SeqMeanTokenMean,
        max_completion_len,
        kl_coef: 0.0,
        kl_estimator: KlEstimator::K3,
        kl_importance_weighted: false,
        entropy_coef: 0.0,
        top_entropy_quantile: 1.0,
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

/// What one GRPO step with a KL term on a LoRA model gives: the loss, the gradient norm, each
/// adapter tensor's gradient (in the model's visiting order) and every tensor after AdamW.
struct LoraKlStep {
    loss: f64,
    grad_norm: f64,
    grads: Vec<Vec<f32>>,
    after: rein_model::safetensors_file::Tensors,
}

/// The GRPO step of [`lora_kl_step_rows`] on backend `A`: PEFT's adapter (`lora/adapter-all`,
/// every projection of both layers, rsLoRA) on its base, the KL reference the base without
/// it, `β = 0.04` with the k3 estimator, advantages ±1, AdamW at 1e-4.
fn lora_kl_step<A: ReinAutodiffBackend>(fixtures: &Path, device: &A::Device) -> Result<LoraKlStep> {
    use burn::module::{ModuleVisitor, Param};
    use burn::tensor::backend::AutodiffBackend;

    let dir = fixtures.join("lora");
    let base =
        || load::<A>(&dir.join("base"), device).with_context(|| format!("loading {}", dir.join("base").display()));
    let model = rein_model::lm::peft::load_adapter(base()?, &dir.join("adapter-all"), device)
        .with_context(|| format!("loading {}", dir.join("adapter-all").display()))?;
    let reference = base()?;
    let pairs: [(&[u32], &[u32]); 3] = [
        (&[1, 5, 9], &[3, 7, 2, 60, 11]),
        (&[4, 4, 8, 15], &[16, 23, 42]),
        (&[2, 30], &[9, 9, 41, 5, 17, 8]),
    ];
    let batch = TokenBatch::new(&pairs, 0);
    let (log_prob, _) = completion_log_probs(&model, &batch, 1.0, false, device);
    let (ref_log_prob, _) = completion_log_probs(&reference, &batch, 1.0, false, device);
    // The policy sampled these completions a little before this step: old = current − 0.05·row.
    let old = log_prob.clone().detach() - Tensor::<A, 1>::from_floats([0.0, 0.05, -0.05], device).unsqueeze_dim(1);
    let advantages = Tensor::<A, 2>::from_data(TensorData::new(vec![1.0f32, -1.0, 0.5], [3, 1]), device);
    let config = PolicyLossConfig {
        kl_coef: 0.04,
        ..token_clipped_loss(0.2, batch.completion_width)
    };
    let out = policy_loss(
        log_prob,
        old,
        advantages,
        batch.mask::<A>(device),
        Some(ref_log_prob.detach()),
        None,
        &config,
    );
    let loss: f64 = out.loss.clone().into_scalar().elem();
    let mut grads = GradientsParams::from_grads(out.loss.backward(), &model);
    let grad_norm: f64 = clip_grad_norm(&model, &mut grads, 1.0).elem();

    struct Collect<'a> {
        grads: &'a GradientsParams,
        values: Vec<Vec<f32>>,
    }
    impl<A: AutodiffBackend> ModuleVisitor<A> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<A, D>>) {
            if let Some(grad) = self.grads.get::<A::InnerBackend, D>(param.id) {
                self.values
                    .push(crate::probe::read(grad).unwrap_or_else(|_| vec![f32::NAN]));
            }
        }
    }
    let mut collect = Collect {
        grads: &grads,
        values: Vec::new(),
    };
    burn::module::Module::visit(&model, &mut collect);
    let grads_seen = collect.values;
    let mut optimizer = AdamWConfig::new().init::<A, CausalLm<A>>();
    let model = optimizer.step(1e-4, model, grads);
    Ok(LoraKlStep {
        loss,
        grad_norm,
        grads: grads_seen,
        after: rein_model::safetensors_file::module_tensors(&model),
    })
}

/// The largest `|got − want|` over every value of every tensor of `want` (NaN counts as
/// infinite); a tensor `got` lacks is an error naming it.
fn worst_tensor_difference(
    got: &rein_model::safetensors_file::Tensors,
    want: &rein_model::safetensors_file::Tensors,
) -> Result<f64> {
    let mut worst = 0.0f64;
    for (name, (_, want)) in want {
        let got = &got.get(name).with_context(|| format!("no `{name}` to compare"))?.1;
        if got.len() != want.len() {
            bail!("`{name}`: {} values against {}", got.len(), want.len());
        }
        for (g, w) in got.iter().zip(want) {
            let d = f64::from((g - w).abs());
            worst = if d.is_nan() { f64::INFINITY } else { worst.max(d) };
        }
    }
    Ok(worst)
}

/// The largest `‖x − y‖ / ‖y‖` over paired tensors.
fn worst_relative<'a>(pairs: impl Iterator<Item = (&'a [f32], &'a [f32])>) -> f64 {
    pairs
        .map(|(x, y)| {
            let (mut diff, mut norm) = (0.0f64, 0.0f64);
            for (a, b) in x.iter().zip(y) {
                diff += (f64::from(*a) - f64::from(*b)).powi(2);
                norm += f64::from(*b).powi(2);
            }
            let relative = diff.sqrt() / norm.sqrt().max(1e-30);
            if relative.is_nan() || x.len() != y.len() {
                f64::INFINITY
            } else {
                relative
            }
        })
        .fold(0.0, f64::max)
}

/// A GRPO step with the KL term on a LoRA model (reference: the base without the adapter) on
/// the device against the same step on the CPU, with rein's CPU kernels, in this process: the
/// loss, every adapter gradient, and every tensor after AdamW. On the CPU with `--generic-ops`,
/// this compares burn's generic ops (the path CUDA takes) with rein's kernels.
fn lora_kl_step_rows<B: ReinBackend>(fixtures: &Path, device: &B::Device, report: &mut Report) -> Result<()> {
    let ours = lora_kl_step::<Autodiff<B>>(fixtures, device)?;
    let cpu = on_cpu_kernels(|| lora_kl_step::<Autodiff<rein_model::Cpu>>(fixtures, &Default::default()))?;
    report.parity(
        "grpo+kl+lora step: loss vs the CPU",
        (ours.loss - cpu.loss).abs(),
        1e-6,
        "",
        format!("{:.9} vs {:.9}", ours.loss, cpu.loss),
    );
    if ours.grads.len() != cpu.grads.len() {
        bail!(
            "{} adapter gradients on the device, {} on the CPU",
            ours.grads.len(),
            cpu.grads.len()
        );
    }
    report.parity(
        "grpo+kl+lora step: gradients vs the CPU",
        worst_relative(
            ours.grads
                .iter()
                .map(Vec::as_slice)
                .zip(cpu.grads.iter().map(Vec::as_slice)),
        ),
        1e-4,
        "",
        format!(
            "worst ‖Δ‖/‖g‖ over {} adapter tensors; norm {:.7} vs {:.7}",
            cpu.grads.len(),
            ours.grad_norm,
            cpu.grad_norm
        ),
    );
    let worst = worst_tensor_difference(&ours.after, &cpu.after)?;
    report.parity(
        "grpo+kl+lora step: AdamW parameters vs the CPU",
        worst,
        1e-5,
        "",
        format!("max |Δ| over {} tensors (lr 1e-4)", cpu.after.len()),
    );
    Ok(())
}
