//! `cargo xtask bench rewards`: rewards that are models. Reward-model scoring, in completions per
//! second, of the default recipe's arithmetic prompts with worked solutions, rendered through
//! the chat template, on a random ~3M-parameter Qwen2 classifier (the `generate` bench's shape,
//! one label), against transformers' `AutoModelForSequenceClassification` on the same checkpoint
//! and texts (`benches/peers/hf_reward_model.py`, which also writes the checkpoint).

use std::path::Path;

use anyhow::Context;
use rein_model::Cpu;
use rein_recipe::LoadedRecipe;
use rein_train::lm::{ModelReward, generate_task};

use crate::report::{Report, Row, median};

/// Completions scored per step.
const TEXTS: usize = 256;
/// Completions per forward pass, on both sides.
const BATCH: usize = 16;
const STEPS: usize = 5;
const WARMUP: usize = 1;
const RECIPE: &str = "recipes/grpo-arithmetic.toml";

pub fn run() -> anyhow::Result<Report> {
    let mut report = Report::default();
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
        scores = reward.score_texts(&texts)?;
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
