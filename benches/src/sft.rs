//! `cargo xtask bench sft`: supervised fine-tuning throughput, in target tokens per second, on
//! the default recipe's model and SFT settings (`recipes/grpo-arithmetic.toml`: the tiny Qwen2,
//! randomly initialised; batches of its arithmetic examples; AdamW, clipping), against a plain
//! PyTorch training loop on the same checkpoint and examples (`benches/peers/torch_sft.py`).

use std::path::Path;

use anyhow::Context;
use rein_model::CpuAutodiff;
use rein_model::lm::{LmConfig, LmInit, LmTokenizer, save};
use rein_recipe::{LoadedRecipe, SftSection};
use rein_train::checkpoint::Checkpointing;
use rein_train::driver::Driver;
use rein_train::lm::{Sft, generate_task, prepare};

use crate::report::{Report, Row};

const STEPS: usize = 40;
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
        steps: STEPS,
        ..recipe.sft.clone().context("the default recipe has an SFT stage")?
    };
    let data = recipe.data.clone().context("the default recipe has data")?;
    let task = data.task.clone().context("the default recipe generates its task")?;
    let device = Default::default();
    <CpuAutodiff as burn::tensor::backend::Backend>::seed(&device, 1);
    let model = LmInit {
        config,
        std: recipe.model.init_std,
    }
    .init::<CpuAutodiff>(&device);
    let tokenizer_dir = loaded.resolve(recipe.model.tokenizer.as_deref().unwrap_or_default());
    let tokenizer = LmTokenizer::load(&tokenizer_dir, &model.config().eos_ids())?;
    let examples = prepare(&generate_task(&task, 1).0, &tokenizer, &data, &[])?;
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
    let start = std::time::Instant::now();
    let mut trainer = Sft::new(model, &examples, pad_id, &sft, 1, &device)?;
    let driven = Driver {
        metrics: None,
        checkpointing: &Checkpointing::default(),
        stall_timeout: std::time::Duration::from_secs(600),
        stage: None,
    }
    .run(&mut trainer)?;
    let tokens_per_s = trainer.tokens_seen() as f64 / start.elapsed().as_secs_f64();
    let phase = |name: &str| driven.phases.get(name).map_or(0.0, |d| d.as_secs_f64()) / STEPS as f64;
    println!(
        "  rein: {tokens_per_s:.0} target tokens/s; per step: forward + backward {:.1} ms, optimizer {:.1} ms",
        1e3 * phase("backward"),
        1e3 * phase("optimizer")
    );
    let peer = torch_peer(peer_dir, &sft, pad_id);
    let target = peer.as_ref().map(|(_, theirs)| {
        (
            format!("≥ 2× PyTorch ({:.2}×)", tokens_per_s / theirs),
            tokens_per_s >= 2.0 * theirs,
        )
    });
    let mut report = Report::default();
    report.push(Row {
        name: format!(
            "SFT, default recipe's model, batch {} (target tokens/s)",
            sft.batch_size
        ),
        value: tokens_per_s,
        unit: "tokens/s",
        baseline: peer,
        target,
    });
    Ok(report)
}

/// A plain PyTorch loop's target tokens per second on the same checkpoint and examples.
fn torch_peer(dir: &Path, sft: &SftSection, pad_id: u32) -> Option<(String, f64)> {
    println!("a plain PyTorch training loop on the same checkpoint and examples (benches/peers/torch_sft.py)");
    let args = [
        dir.display().to_string(),
        dir.join("examples.jsonl").display().to_string(),
        STEPS.to_string(),
        sft.batch_size.to_string(),
        sft.lr.to_string(),
        sft.weight_decay.to_string(),
        sft.max_grad_norm.to_string(),
        pad_id.to_string(),
    ];
    let stdout = crate::peers::run("torch_sft.py", args)?;
    let value: serde_json::Value = serde_json::from_str(stdout.lines().last()?).ok()?;
    let tokens_per_s = value["tokens_per_s"].as_f64()?;
    println!("  PyTorch: {tokens_per_s:.0} target tokens/s");
    Some((
        format!(
            "PyTorch {} loop (transformers {}), this run",
            value["versions"]["torch"].as_str()?,
            value["versions"]["transformers"].as_str()?
        ),
        tokens_per_s,
    ))
}
