//! `cargo xtask bench sft`: supervised fine-tuning throughput, in target tokens per second, on
//! the default recipe's model and SFT settings (`recipes/grpo-arithmetic.toml`: the tiny Qwen2,
//! randomly initialised; batches of its arithmetic examples; AdamW, clipping), against a plain
//! PyTorch training loop on the same checkpoint and examples (`benches/peers/torch_sft.py`).

use std::path::Path;

use anyhow::Context;
use rein_model::CpuAutodiff;
use rein_model::lm::{LmConfig, LmInit, LmTokenizer, save};
use rein_posttrain::{Sft, generate_task, prepare};
use rein_recipe::{LoadedRecipe, SftSection};
use rein_run::driver::Trainer;
use rein_run::watchdog::Phases;

use crate::report::{Report, Row, median};

/// Timed steps, after [`WARMUP`] untimed ones, on both sides.
const STEPS: usize = 40;
const WARMUP: usize = 1;
const RECIPE: &str = "recipes/grpo-arithmetic.toml";

pub fn run() -> anyhow::Result<Report> {
    let loaded = LoadedRecipe::load(Path::new(RECIPE), &[])?;
    let recipe = &loaded.recipe;
    let architecture = recipe
        .model
        .architecture
        .clone()
        .context("the default recipe names an architecture")?;
    let config = LmConfig::from_json(serde_json::to_value(architecture)?).map_err(anyhow::Error::msg)?;
    let sft = SftSection {
        steps: WARMUP + STEPS,
        ..recipe.sft.clone().context("the default recipe has an SFT stage")?
    };
    let data = recipe.data.clone().context("the default recipe has data")?;
    let task = data.task.clone().context("the default recipe generates its task")?;
    let device = Default::default();
    let model = LmInit {
        config,
        std: recipe.model.init_std,
    }
    .init::<CpuAutodiff>(&mut rein_core::SeededRng::new(1), &device);
    let tokenizer_dir = loaded.resolve(recipe.model.tokenizer.as_deref().unwrap_or_default());
    let tokenizer = LmTokenizer::load(&tokenizer_dir, &model.config().eos_ids())?;
    let examples = prepare(&generate_task(&task, 1).0, &tokenizer, &data, &[], None)?;
    let pad_id = model.config().eos_ids().first().copied().unwrap_or(0);

    // The same checkpoint and examples for the PyTorch peer.
    let peer_dir = Path::new("target/bench/sft-tiny-qwen2");
    save(&model, peer_dir)?;
    let mut lines = String::new();
    for example in &examples {
        let row = serde_json::json!({"prompt": example.tokens, "target": example.target});
        lines += &format!("{row}\n");
    }
    std::fs::write(peer_dir.join("examples.jsonl"), lines)?;

    let params: usize = burn::module::Module::num_params(&model);
    println!(
        "{RECIPE}'s model ({params} parameters), {STEPS} SFT steps of {} examples",
        sft.batch_size
    );
    let mut trainer = Sft::new(model, &examples, pad_id, &sft, 1, vec![device])?;
    // One untimed step, then STEPS timed ones: the median of their rates, as the peer's.
    let phases = Phases::new(Default::default(), Default::default());
    let mut rates = Vec::with_capacity(STEPS);
    for step in 1..=WARMUP + STEPS {
        let (tokens, start) = (trainer.tokens_seen(), std::time::Instant::now());
        trainer.step(step, &phases)?;
        if step > WARMUP {
            rates.push((trainer.tokens_seen() - tokens) as f64 / start.elapsed().as_secs_f64());
        }
    }
    let tokens_per_s = median(&rates).unwrap_or(f64::NAN);
    let phase = |name: &str| phases.total(name).as_secs_f64() / (WARMUP + STEPS) as f64;
    println!(
        "  rein: {tokens_per_s:.0} target tokens/s (median step); per step: forward + backward {:.1} ms, optimizer {:.1} ms",
        1e3 * phase("backward"),
        1e3 * phase("optimizer")
    );
    let name = format!(
        "SFT, default recipe's model, batch {} (target tokens/s)",
        sft.batch_size
    );
    let mut report = Report::default();
    match torch_peer(peer_dir, &sft, pad_id) {
        Ok((label, theirs)) => report.push(Row {
            name,
            value: tokens_per_s,
            unit: "tokens/s",
            baseline: Some((label, theirs)),
            target: Some((
                format!("≥ 2× PyTorch ({:.2}×)", tokens_per_s / theirs),
                tokens_per_s >= 2.0 * theirs,
            )),
        }),
        Err(reason) => report.not_measured(name, "PyTorch loop (torch_sft.py)", reason),
    }
    Ok(report)
}

/// A plain PyTorch loop's target tokens per second on the same checkpoint and examples.
fn torch_peer(dir: &Path, sft: &SftSection, pad_id: u32) -> Result<(String, f64), String> {
    println!("a plain PyTorch training loop on the same checkpoint and examples (benches/peers/torch_sft.py)");
    let args = [
        dir.display().to_string(),
        dir.join("examples.jsonl").display().to_string(),
        format!("--batch={}", sft.batch_size),
        format!("--lr={}", sft.lr),
        format!("--weight-decay={}", sft.weight_decay),
        format!("--max-grad-norm={}", sft.max_grad_norm),
        format!("--pad-id={pad_id}"),
        format!("--steps={STEPS}"),
        format!("--warmup={WARMUP}"),
    ];
    let value = crate::peers::run("torch_sft.py", args)?;
    crate::peers::describe("torch_sft.py", &value);
    let tokens_per_s = value["tokens_per_s"].as_f64().ok_or("no `tokens_per_s`")?;
    println!("  PyTorch: {tokens_per_s:.0} target tokens/s (median step)");
    Ok((
        format!("PyTorch loop ({})", crate::peers::versions(&value)),
        tokens_per_s,
    ))
}
