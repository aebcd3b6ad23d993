//! `cargo xtask bench grpo`'s long shared prompt: every prompt opens with the same 1,024-token
//! few-shot prefix (worked two-digit sums) before its own question, 8 completions of 128 tokens
//! each, on the random ~3M-parameter Qwen2 (its positions extended to 2,048). Where the prompt
//! is most of each row, computing it once per group is most of the saving:
//! - sampling: one prefill per prompt, its keys and values shared by the group's 8 sequences,
//!   against one prefill per sequence (the prompt repeated 8 times, `n = 1`);
//! - training: the forward and backward passes of the step's batch with each group's prompt
//!   packed once ([`TokenBatch::share_prompts`]) against every row with its own copy, here and
//!   on the default recipe's shapes (short prompts, 8 × 8 completions of 32 tokens), where it
//!   must not cost;
//! - the whole GRPO step against TRL's `GRPOTrainer` on the same checkpoint and prompts (TRL
//!   without gradient checkpointing, as its best users run it).
//!
//! The sampling and training rows time 2 prompts × 8 completions, best of 3; the step rows time
//! 8 prompts × 8 completions, as the other GRPO cases do.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::AutodiffModule;
use rein_model::CpuAutodiff;
use rein_model::lm::{CausalLm, LmTokenizer, save};
use rein_posttrain::{TokenBatch, completion_log_probs};
use rein_sampler::{Generation, GenerationConfig, generate};

use crate::grpo::{Case, arithmetic_prompts, compare, measure, trl_peer};
use crate::qwen2_3m::qwen2_3m_with_positions;
use crate::report::{Report, Row};

/// The few-shot prefix's length in tokens (at least).
const PREFIX_TOKENS: usize = 1024;
/// Completions per prompt, and their length (no stop token: every completion is this long).
const GROUP: usize = 8;
const COMPLETION_TOKENS: usize = 128;

pub fn run(plugin_dir: &Path, report: &mut Report) -> anyhow::Result<()> {
    let device = Default::default();
    let tokenizer = LmTokenizer::load(Path::new("recipes/assets/arithmetic-tokenizer"), &[])?;
    let system = few_shot_prefix(&tokenizer)?;
    let prompts = arithmetic_prompts(&tokenizer, Some(&system))?;
    let model = qwen2_3m_with_positions::<CpuAutodiff>(1, 2048, &device)?;
    let lengths: Vec<usize> = prompts.iter().take(8).map(|p| p.tokens.len()).collect();
    println!(
        "shared prefix: prompts of {}–{} tokens (a {PREFIX_TOKENS}-token few-shot prefix and the question), {GROUP} completions of {COMPLETION_TOKENS} tokens",
        lengths.iter().min().unwrap_or(&0),
        lengths.iter().max().unwrap_or(&0),
    );

    // Sampling: one prefill per prompt against one per sequence.
    let two: Vec<Vec<u32>> = prompts.iter().take(2).map(|p| p.tokens.clone()).collect();
    let inference = model.valid();
    let config = |n| GenerationConfig {
        max_new_tokens: COMPLETION_TOKENS,
        n,
        seed: 1,
        ..GenerationConfig::default()
    };
    let repeated: Vec<Vec<u32>> = two.iter().flat_map(|p| std::iter::repeat_n(p.clone(), GROUP)).collect();
    let per_sequence = best_of_3(|| {
        generate(&inference, &repeated, &config(1), 0, &mut |_, _| false, &device);
    });
    let mut generations = Vec::new();
    let per_prompt = best_of_3(|| {
        generations = generate(&inference, &two, &config(GROUP), 0, &mut |_, _| false, &device);
    });
    report.push(Row {
        name: format!("sampling 2×{GROUP}, {COMPLETION_TOKENS} tokens after a shared {PREFIX_TOKENS}-token prefix (s)"),
        value: per_prompt,
        unit: "s",
        baseline: Some(("rein, one prefill per sequence".into(), per_sequence)),
        target: None,
    });

    // Training: the same completions' forward and backward passes, prompts shared or copied.
    let (shared, copied) = train_both_ways(&model, &two, &generations);
    report.push(Row {
        name: format!("training forward + backward, 2×{GROUP} rows after a shared {PREFIX_TOKENS}-token prefix (s)"),
        value: shared,
        unit: "s",
        baseline: Some(("rein, each row its own copy of the prompt".into(), copied)),
        target: None,
    });
    // And on the default recipe's shapes (8 short prompts × 8 completions of 32 tokens), where
    // the prompt is a small part of each row: sharing must not cost.
    let short: Vec<Vec<u32>> = (arithmetic_prompts(&tokenizer, None)?.into_iter())
        .take(8)
        .map(|p| p.tokens)
        .collect();
    let config = GenerationConfig {
        max_new_tokens: 32,
        ..config(GROUP)
    };
    let generations = generate(&inference, &short, &config, 0, &mut |_, _| false, &device);
    let (shared, copied) = train_both_ways(&model, &short, &generations);
    report.push(Row {
        name: format!("training forward + backward, 8×{GROUP} rows of 32 tokens after short prompts (s)"),
        value: shared,
        unit: "s",
        baseline: Some(("rein, each row its own copy of the prompt".into(), copied)),
        target: Some(("not slower (≤ 1.05×)".into(), shared <= 1.05 * copied)),
    });

    // The whole step against TRL.
    let checkpoint = PathBuf::from("target/bench/grpo-shared-prefix");
    save(&model, &checkpoint)?;
    tokenizer.save(&checkpoint)?;
    let case = Case {
        name: format!(
            "GRPO step, {PREFIX_TOKENS}-token shared prefix, 8×{GROUP} completions, {COMPLETION_TOKENS} tokens"
        ),
        tokenizer,
        prompts,
        work_dir: checkpoint.clone(),
        checkpoint,
        steps: 2,
        completions: GROUP,
        max_new_tokens: COMPLETION_TOKENS,
        lr: 1e-5,
        lora: None,
        teacher: None,
    };
    let (rein, _, _) = measure(&case, model, plugin_dir)?;
    compare(&case, &rein, &[(false, trl_peer(&case, false))], report);
    Ok(())
}

/// Worked sums, one per line, until the prefix is [`PREFIX_TOKENS`] tokens long.
fn few_shot_prefix(tokenizer: &LmTokenizer) -> anyhow::Result<String> {
    let mut prefix = String::from("Solve the arithmetic problem. Worked examples:\n");
    let mut i = 0u32;
    while tokenizer.encode(&prefix)?.len() < PREFIX_TOKENS {
        let (a, b) = ((i * 37 + 11) % 100, (i * 53 + 7) % 100);
        prefix += &format!("{a} + {b} = <answer>{}</answer>\n", a + b);
        i += 1;
    }
    Ok(prefix)
}

/// The forward and backward passes' time (best of 3) on `generations` of `prompts`, each group's
/// prompt packed once and every row with its own copy.
fn train_both_ways(model: &CausalLm<CpuAutodiff>, prompts: &[Vec<u32>], generations: &[Generation]) -> (f64, f64) {
    let pairs: Vec<(&[u32], &[u32])> = (generations.iter())
        .map(|g| (prompts[g.prompt].as_slice(), g.tokens.as_slice()))
        .collect();
    let time = |share_prompts| {
        let mut batch = TokenBatch::new(&pairs, 0);
        batch.share_prompts = share_prompts;
        best_of_3(|| forward_backward(model, &batch))
    };
    (time(true), time(false))
}

/// The completions' summed log-probability, and its gradients.
fn forward_backward(model: &CausalLm<CpuAutodiff>, batch: &TokenBatch) {
    let _graph = rein_model::one_graph();
    let device = Default::default();
    let (log_prob, _) = completion_log_probs(model, batch, 1.0, false, &device);
    let loss = (log_prob * batch.mask::<CpuAutodiff>(&device)).sum().neg();
    let _ = loss.backward();
}

/// The fastest of three runs of `f`, in seconds.
fn best_of_3(mut f: impl FnMut()) -> f64 {
    (0..3)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}
