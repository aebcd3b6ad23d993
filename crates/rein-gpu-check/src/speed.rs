//! The speed rows: generation throughput, one GRPO step, and the device's own matmul rate, on
//! the same checkpoint and prompts the PyTorch peer (`gpu_torch.py`) times in the same run.
//! Figures, never gates.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context as _, Result};
use burn::backend::Autodiff;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor, TensorData, TensorPrimitive};
use rein_core::ModelDtype;
use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, load};
use rein_optim::{clip_grad_norm, policy_loss};
use rein_posttrain::{TokenBatch, completion_log_probs};
use rein_sampler::{GenerationConfig, generate};

use crate::report::Report;

/// What the speed rows run on: the checkpoint and prompts the peer wrote.
pub struct SpeedSetup<'a> {
    /// A Hugging Face causal-LM directory (f32 safetensors).
    pub model: &'a Path,
    /// `prompts.json`: a list of token-id lists, as many as the largest batch.
    pub prompts: &'a Path,
    /// Batch sizes of the generation rows.
    pub batches: &'a [usize],
    /// Tokens generated per sequence (no stop token: every row generates all of them).
    pub new_tokens: usize,
    /// Rows of the GRPO step (each a prompt and a `step_tokens` completion).
    pub step_rows: usize,
    /// Completion tokens of each row of the GRPO step.
    pub step_tokens: usize,
}

/// The info row naming how many forward passes generation ran (warm-ups included): a launch
/// profile's count divided by it is launches per generated token.
pub const PASSES_RUN: &str = "forward passes run";
/// The info row naming how many GRPO steps a step row ran (warm-up included).
pub const STEPS_RUN: &str = "steps run";

fn dtype_name(dtype: ModelDtype) -> &'static str {
    match dtype {
        ModelDtype::F32 => "f32",
        ModelDtype::Bf16 => "bf16",
    }
}

fn sync<B: Backend>(device: &B::Device) -> Result<()> {
    B::sync(device).map_err(|e| anyhow::anyhow!("device sync: {e:?}"))
}

/// Waits for the device after an untimed call; launch errors it reports are recorded and left
/// behind, so the timed call starts clean.
fn settle<B: Backend>(device: &B::Device, report: &mut Report, what: &str) {
    if let Err(e) = B::sync(device) {
        let launches = format!("{e:?}").matches("Launch(").count();
        report.info(
            format!("{what}: device errors"),
            format!("{launches} kernel launches failed"),
        );
    }
}

/// Generation tokens/s at each batch size, greedy, every sequence `new_tokens` long, the
/// products in `dtype` (the weights f32).
pub fn generation<B: ReinBackend>(
    setup: &SpeedSetup<'_>,
    dtype: ModelDtype,
    device: &B::Device,
    report: &mut Report,
) -> Result<()> {
    let model = load::<B>(setup.model, device)
        .with_context(|| format!("loading {}", setup.model.display()))?
        .with_dtype(dtype);
    let prompts: Vec<Vec<u32>> = serde_json::from_str(
        &std::fs::read_to_string(setup.prompts).with_context(|| format!("reading {}", setup.prompts.display()))?,
    )
    .with_context(|| format!("parsing {}", setup.prompts.display()))?;
    let config = |tokens| GenerationConfig {
        max_new_tokens: tokens,
        temperature: 0.0,
        ..GenerationConfig::default()
    };
    // Forward passes over the batch, one per generated token (the first also reads the
    // prompt): what a profile's launch count is divided by.
    let mut passes = 4;
    // The first call compiles the kernels; it is not timed.
    let warm = Instant::now();
    generate(&model, &prompts[..1], &config(4), 0, &mut |_, _| false, device);
    settle::<B>(device, report, "generation warm-up");
    report.info(
        "generation warm-up",
        format!("{:.1} s (kernel compilation)", warm.elapsed().as_secs_f64()),
    );
    for &batch in setup.batches {
        let batch = batch.min(prompts.len());
        // Each new shape compiles a few kernels of its own: one short untimed call first.
        generate(&model, &prompts[..batch], &config(2), 0, &mut |_, _| false, device);
        settle::<B>(device, report, &format!("generation warm-up, batch {batch}"));
        let start = Instant::now();
        let out = generate(
            &model,
            &prompts[..batch],
            &config(setup.new_tokens),
            0,
            &mut |_, _| false,
            device,
        );
        settle::<B>(device, report, &format!("generation, batch {batch}"));
        let seconds = start.elapsed().as_secs_f64();
        let tokens: usize = out.iter().map(|g| g.tokens.len()).sum();
        passes += 2 + setup.new_tokens;
        report.speed(
            format!("rein generate {}, batch {batch}", dtype_name(dtype)),
            tokens as f64 / seconds,
            "tok/s",
            format!("{tokens} tokens in {seconds:.2} s, greedy"),
        );
    }
    report.info(
        format!("generate {}: {PASSES_RUN}", dtype_name(dtype)),
        passes.to_string(),
    );
    Ok(())
}

/// One GRPO step (log-probabilities, clipped loss, backward, clipping, AdamW) on `step_rows`
/// prompt + completion rows of the speed checkpoint, its products in `dtype` (bf16: mixed
/// precision, the weights and AdamW's state `f32`): the median of three after one untimed.
pub fn grpo_step<B: ReinBackend>(
    setup: &SpeedSetup<'_>,
    dtype: ModelDtype,
    device: &B::Device,
    report: &mut Report,
) -> Result<()> {
    type A<B> = Autodiff<B>;
    let mut model = load::<A<B>>(setup.model, device)
        .with_context(|| format!("loading {}", setup.model.display()))?
        .with_dtype(dtype);
    let prompts: Vec<Vec<u32>> = serde_json::from_str(&std::fs::read_to_string(setup.prompts)?)?;
    let vocab = model.config().vocab_size as u32;
    let completions: Vec<Vec<u32>> = (0..setup.step_rows)
        .map(|r| {
            (0..setup.step_tokens)
                .map(|j| ((r * 7919 + j * 104_729) as u32) % vocab)
                .collect()
        })
        .collect();
    let pairs: Vec<(&[u32], &[u32])> = prompts
        .iter()
        .zip(&completions)
        .map(|(p, c)| (p.as_slice(), c.as_slice()))
        .collect();
    let batch = TokenBatch::new(&pairs, 0);
    let config = crate::parity::token_clipped_loss(0.2, batch.completion_width);
    let advantages: Vec<f32> = (0..batch.rows).map(|r| if r % 2 == 0 { 1.0 } else { -1.0 }).collect();
    let mut optimizer = AdamWConfig::new().init::<A<B>, CausalLm<A<B>>>();
    // Each round's phases, timed to a device sync after each (the syncs cost a little, so the
    // whole step is timed separately, without them).
    let mut steps = Vec::new();
    let mut phases = [Vec::new(), Vec::new(), Vec::new()];
    let rounds = 7;
    for round in 0..rounds {
        let timed_phases = round >= 4;
        let start = Instant::now();
        let mut mark = Instant::now();
        let mut phase = |i: usize| -> Result<()> {
            if timed_phases {
                sync::<B>(device)?;
                phases[i].push(mark.elapsed().as_secs_f64());
                mark = Instant::now();
            }
            Ok(())
        };
        let (log_prob, _) = completion_log_probs(&model, &batch, 1.0, false, device);
        let old = log_prob.clone().detach();
        let adv = Tensor::<A<B>, 2>::from_data(TensorData::new(advantages.clone(), [batch.rows, 1]), device);
        let out = policy_loss(log_prob, old, adv, batch.mask::<A<B>>(device), None, None, &config);
        phase(0)?;
        let mut grads = GradientsParams::from_grads(out.loss.backward(), &model);
        phase(1)?;
        clip_grad_norm(&model, &mut grads, 1.0);
        model = optimizer.step(1e-6, model, grads);
        sync::<B>(device)?;
        phase(2)?;
        let seconds = start.elapsed().as_secs_f64();
        if round == 0 {
            report.info("grpo step warm-up", format!("{seconds:.1} s (kernel compilation)"));
        } else if !timed_phases {
            steps.push(seconds);
        }
    }
    let title = format!(
        "rein grpo step {}, {} rows × {}+{}",
        match dtype {
            ModelDtype::F32 => "f32",
            ModelDtype::Bf16 => "bf16 mixed",
        },
        batch.rows,
        prompts[0].len(),
        setup.step_tokens
    );
    report.info(format!("{title}: {STEPS_RUN}"), rounds.to_string());
    report.speed(
        title.clone(),
        median(&mut steps) * 1e3,
        "ms",
        "median of 3: log-probs, clipped loss, backward, clip, AdamW",
    );
    for (name, times) in ["forward and loss", "backward", "clip and AdamW"]
        .iter()
        .zip(&mut phases)
    {
        report.speed(
            format!("{title}: {name}"),
            median(times) * 1e3,
            "ms",
            "median of 3, synced after each phase",
        );
    }
    Ok(())
}

fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// The device's `n × n` matmul rate through burn's own product, for backend `B` (its float type).
pub fn matmul_rate<B: Backend>(label: &str, n: usize, device: &B::Device, report: &mut Report) -> Result<()> {
    product_rate::<B>(&format!("burn matmul {label}"), n, device, report, |a, b| a.matmul(b))
}

/// The `n × n` rate of rein's product ([`rein_model::LinearKernels::matmul`], as
/// [`rein_model::cuda_matmul`] chooses on CUDA), for backend `B` (its float type).
pub fn rein_matmul_rate<B: ReinBackend>(label: &str, n: usize, device: &B::Device, report: &mut Report) -> Result<()> {
    let label = format!("rein matmul {label} ({:?})", rein_model::cuda_matmul());
    product_rate::<B>(&label, n, device, report, |a, b| {
        Tensor::from_primitive(TensorPrimitive::Float(B::matmul(
            a.into_primitive().tensor(),
            b.into_primitive().tensor(),
        )))
    })
}

fn product_rate<B: Backend>(
    label: &str,
    n: usize,
    device: &B::Device,
    report: &mut Report,
    product: impl Fn(Tensor<B, 2>, Tensor<B, 2>) -> Tensor<B, 2>,
) -> Result<()> {
    let a = Tensor::<B, 2>::random([n, n], Distribution::Normal(0.0, 1.0), device);
    let b = Tensor::<B, 2>::random([n, n], Distribution::Normal(0.0, 1.0), device);
    let _ = product(a.clone(), b.clone());
    sync::<B>(device)?;
    let reps = 10;
    let start = Instant::now();
    for _ in 0..reps {
        let _ = product(a.clone(), b.clone());
    }
    sync::<B>(device)?;
    let seconds = start.elapsed().as_secs_f64() / f64::from(reps);
    report.speed(
        format!("{label} {n}³"),
        2.0 * (n as f64).powi(3) / seconds / 1e12,
        "TFLOP/s",
        format!("{:.2} ms per product", seconds * 1e3),
    );
    Ok(())
}
