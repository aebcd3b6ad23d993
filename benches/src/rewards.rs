//! `cargo xtask bench rewards`: rewards that are models. Reward-model scoring, in completions per
//! second, of the default recipe's arithmetic prompts with worked solutions, rendered through
//! the chat template, on a random ~3M-parameter Qwen2 classifier (the `generate` bench's shape,
//! one label), against transformers' `AutoModelForSequenceClassification` on the same checkpoint
//! and texts (`benches/peers/hf_reward_model.py`, which also writes the checkpoint).
//!
//! Judges: 64 "does the student's answer equal the reference?" requests (half of the answers
//! right, half off by one), 4 new tokens each, greedy, asked of SmolLM2-135M-Instruct (f32) in
//! process (`NativeJudge`, one batch) and through `rein serve` (`HttpJudge`, 64 concurrent chat
//! completions), in judge calls per second; and how often the judge's Yes/No is right.
//!
//! Distillation: one on-policy distillation step (the full reverse KL to a teacher) against TRL's
//! `DistillationTrainer` ([`crate::grpo::distillation`]).

use std::path::Path;

use std::time::Instant;

use anyhow::Context;
use rein_core::{Judge, JudgeRequest, Message, request_seed};
use rein_model::Cpu;
use rein_model::lm::{LmTokenizer, load, locate};
use rein_posttrain::generate_task;
use rein_recipe::LoadedRecipe;
use rein_sampler::HttpJudge;
use rein_sampler::{ModelReward, NativeJudge};

use crate::report::{Report, Row, median};

/// Completions scored per step.
const TEXTS: usize = 256;
/// Completions per forward pass, on both sides.
const BATCH: usize = 16;
const STEPS: usize = 5;
const WARMUP: usize = 1;
const RECIPE: &str = "recipes/grpo-arithmetic.toml";

pub fn run(plugin_dir: &Path) -> anyhow::Result<Report> {
    let mut report = Report::default();
    crate::grpo::distillation(plugin_dir, &mut report)?;
    judges(&mut report)?;
    let name = format!("reward-model scoring, 3M Qwen2 classifier, batch {BATCH} (completions/s)");
    let dir = Path::new("target/bench/reward-model-qwen2-3m");
    let loaded = LoadedRecipe::load(Path::new(RECIPE), &[])?;
    let tokenizer = loaded.resolve(loaded.recipe.model.tokenizer.as_deref().unwrap_or_default());
    let created = crate::peers::run(
        "hf_reward_model.py",
        [
            "--create".to_string(),
            dir.display().to_string(),
            "--tokenizer".into(),
            tokenizer.display().to_string(),
        ],
    );
    if let Err(reason) = created {
        report.not_measured(
            name,
            "transformers (hf_reward_model.py)",
            format!("no checkpoint: {reason}"),
        );
        return Ok(report);
    }
    let device = Default::default();
    let reward = ModelReward::<Cpu>::load("bench", dir, None, BATCH, &device)?;
    let task = loaded
        .recipe
        .data
        .as_ref()
        .and_then(|d| d.task.clone())
        .context("the default recipe generates its task")?;
    let (train, _) = generate_task(&task, 1);
    let texts = (train.iter().take(TEXTS))
        .map(|e| reward.text(&e.prompt, e.completion.as_deref().unwrap_or_default()))
        .collect::<Result<Vec<_>, _>>()?;
    let texts_path = dir.join("texts.json");
    std::fs::write(&texts_path, serde_json::to_string(&texts)?)?;
    println!("{TEXTS} prompt–completion pairs of {RECIPE}'s task through the chat template, batches of {BATCH}");

    let mut times = Vec::with_capacity(STEPS);
    let mut scores = Vec::new();
    for step in 0..WARMUP + STEPS {
        let start = std::time::Instant::now();
        scores = reward.score_texts(&texts).map_err(anyhow::Error::msg)?;
        if step >= WARMUP {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    let rate = TEXTS as f64 / median(&times).unwrap_or(f64::NAN);
    println!("  rein: {rate:.0} completions/s (median of {STEPS} passes)");
    match peer(dir, &texts_path) {
        Ok((label, theirs, their_scores)) => {
            let gap = (scores.iter().zip(&their_scores))
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f64, f64::max);
            println!("  largest score difference from transformers: {gap:.2e}");
            anyhow::ensure!(gap < 1e-4, "rein's scores differ from transformers' by {gap}");
            report.push(Row {
                name,
                value: rate,
                unit: "completions/s",
                baseline: Some((label, theirs)),
                target: Some((
                    format!("≥ 2× transformers ({:.2}×)", rate / theirs),
                    rate >= 2.0 * theirs,
                )),
            });
        }
        Err(reason) => report.not_measured(name, "transformers (hf_reward_model.py)", reason),
    }
    Ok(report)
}

/// transformers' completions per second on the same checkpoint and texts, and its scores.
fn peer(dir: &Path, texts: &Path) -> Result<(String, f64, Vec<f64>), String> {
    println!(
        "transformers AutoModelForSequenceClassification on the same checkpoint and texts (benches/peers/hf_reward_model.py)"
    );
    let args = [
        dir.display().to_string(),
        texts.display().to_string(),
        format!("--batch={BATCH}"),
        format!("--steps={STEPS}"),
        format!("--warmup={WARMUP}"),
    ];
    let value = crate::peers::run("hf_reward_model.py", args)?;
    crate::peers::describe("hf_reward_model.py", &value);
    let rate = value["completions_per_s"].as_f64().ok_or("no `completions_per_s`")?;
    let scores = (value["scores"].as_array().ok_or("no `scores`")?.iter())
        .map(|v| v.as_f64().ok_or("a score that is not a number"))
        .collect::<Result<Vec<_>, _>>()?;
    println!("  transformers: {rate:.0} completions/s (median of {STEPS} passes)");
    Ok((
        format!("transformers ({})", crate::peers::versions(&value)),
        rate,
        scores,
    ))
}

/// Judge requests per second in process and over HTTP, and the judge's accuracy.
fn judges(report: &mut Report) -> anyhow::Result<()> {
    const REQUESTS: usize = 64;
    let dir = locate(Path::new("smollm2-135m"))?;
    let device = Default::default();
    let model = load::<Cpu>(&dir, &device)?;
    let tokenizer = LmTokenizer::load(&dir, &model.config().eos_ids())?;
    let mut native = NativeJudge::<Cpu>::new(model, tokenizer, "smollm2-135m", &device);
    let (requests, truth): (Vec<JudgeRequest>, Vec<bool>) = (0..REQUESTS)
        .map(|i| {
            let (a, b) = (17 * i + 3, 29 * i + 11);
            let right = i % 2 == 0;
            let answer = if right { a + b } else { a + b + 1 };
            let messages = vec![
                Message::new("system", "You grade answers. Reply with one word: Yes or No."),
                Message::new(
                    "user",
                    format!("Question: What is {a} + {b}?\nReference answer: {}\nStudent's answer: {answer}\nDoes the student's answer equal the reference?", a + b),
                ),
            ];
            let request = JudgeRequest {
                seed: request_seed(1, &messages, 4, 0.0, &[]),
                messages,
                max_new_tokens: 4,
                temperature: 0.0,
                stop: Vec::new(),
                top_logprobs: 0,
            };
            (request, right)
        })
        .unzip();
    println!("{REQUESTS} judge requests (4 new tokens, greedy) to SmolLM2-135M-Instruct, f32");
    let later = || Instant::now() + std::time::Duration::from_secs(600);
    let timed = |judge: &mut dyn Judge| {
        let start = Instant::now();
        let answers = judge.judge(&requests, later(), 0);
        (REQUESTS as f64 / start.elapsed().as_secs_f64(), answers)
    };
    timed(&mut native); // warm up
    let (in_process, answers) = timed(&mut native);
    let verdicts: Vec<bool> = (answers.iter())
        .map(|a| {
            a.as_ref()
                .map(|j| j.text.trim_start().to_lowercase().starts_with("yes"))
                .map_err(Clone::clone)
        })
        .collect::<Result<_, _>>()?;
    let accuracy = verdicts.iter().zip(&truth).filter(|(v, t)| v == t).count() as f64 / REQUESTS as f64;
    let says_yes = verdicts.iter().filter(|&&v| v).count();
    println!(
        "  in process: {in_process:.1} calls/s; the judge is right on {:.0}% ({says_yes} of {REQUESTS} verdicts Yes)",
        100.0 * accuracy
    );
    let (server, url) = crate::serve::serve(&dir)?;
    let mut http = HttpJudge::new(&url, "smollm2-135m", 4096);
    timed(&mut http); // warm up
    let (over_http, served) = timed(&mut http);
    drop(server);
    let same = (served.iter().zip(&answers))
        .filter(|(s, a)| matches!((s, a), (Ok(s), Ok(a)) if s.text == a.text))
        .count();
    println!("  over HTTP (rein serve): {over_http:.1} calls/s; {same} of {REQUESTS} answers the same as in process");
    report.push(Row {
        name: format!("judge, {REQUESTS} requests of 4 tokens, SmolLM2-135M in process (calls/s)"),
        value: in_process,
        unit: "calls/s",
        baseline: Some(("the same judge through rein serve (HttpJudge)".into(), over_http)),
        target: None,
    });
    report.push(Row {
        name: format!("judge accuracy, SmolLM2-135M-Instruct, {REQUESTS} Yes/No answer checks (%)"),
        value: 100.0 * accuracy,
        unit: "%",
        baseline: None,
        target: None,
    });
    Ok(())
}
