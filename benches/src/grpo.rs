//! `cargo xtask bench grpo`: seconds per GRPO step on a random ~3M-parameter Qwen2 (hidden 256,
//! 4 layers, vocab 512): 8 prompts × 8 completions of 32 new tokens, β = 0, rewards from the
//! sandboxed `math-answer` plugin; split into generate / reward / train.

use std::path::Path;

use rein_model::CpuAutodiff;
use rein_model::lm::{LmTokenizer, save};
use rein_plugin::PluginRuntime;
use rein_recipe::{DataSection, GrpoSection, OptimizerSection, SamplerSection};
use rein_train::checkpoint::Checkpointing;
use rein_train::driver::Driver;
use rein_train::lm::{ArithmeticTask, Grpo, GrpoContext, WeightedReward, generate_task, prepare};

use crate::qwen2_3m::qwen2_3m;
use crate::report::{Report, Row};

const STEPS: usize = 6;

pub fn run(plugin_dir: &Path) -> anyhow::Result<Report> {
    let device = Default::default();
    let model = qwen2_3m::<CpuAutodiff>(&device)?;
    let tokenizer = LmTokenizer::load(Path::new("recipes/assets/arithmetic-tokenizer"), &[])?;
    let task = ArithmeticTask {
        max_operand: 99,
        ops: vec!["+".into()],
        train: 512,
        test: 0,
    };
    let data = DataSection {
        task: None,
        train: None,
        test: None,
        fields: Default::default(),
        chat_template: true,
        system_prompt: None,
    };
    let prompts = prepare(&generate_task(&task, 1).0, &tokenizer, &data)?;
    // The same checkpoint and prompts for the TRL peer.
    let peer_dir = Path::new("target/bench/grpo-qwen2-3m");
    save(&model, peer_dir)?;
    tokenizer.save(peer_dir)?;
    let mut lines = String::new();
    for prompt in prompts.iter().take(8 * (STEPS + 1)) {
        let row = serde_json::json!({
            "prompt": tokenizer.decode(&prompt.tokens, false)?,
            "answer": prompt.answer.clone().unwrap_or_default(),
        });
        lines += &format!("{row}\n");
    }
    std::fs::write(peer_dir.join("prompts.jsonl"), lines)?;
    let runtime = PluginRuntime::default();
    let plugin = runtime.load(plugin_dir.join("math-answer.wasm"), Default::default())?;
    let mut rewards = vec![WeightedReward {
        reward: Box::new(plugin.reward(r#"{"extract": "answer"}"#)?),
        weight: 1.0,
    }];
    let grpo = GrpoSection {
        steps: STEPS,
        prompts_per_step: 8,
        ..GrpoSection::default()
    };
    // Completions always run their 32 tokens: a random model rarely says end-of-sequence.
    let sampler = SamplerSection {
        max_new_tokens: 32,
        n: 8,
        ..SamplerSection::default()
    };
    let optimizer = OptimizerSection {
        lr: 1e-5,
        weight_decay: 0.0,
        max_grad_norm: 1.0,
        eps: 1e-8,
        ..OptimizerSection::default()
    };
    let params: usize = burn::module::Module::num_params(&model);
    println!("random Qwen2, {params} parameters; {STEPS} steps of 8 prompts × 8 completions × 32 tokens");
    let ctx = GrpoContext {
        tokenizer: &tokenizer,
        prompts: &prompts,
        rewards: &mut rewards,
        grpo: &grpo,
        sampler: &sampler,
        optimizer: &optimizer,
        seed: 1,
    };
    let start = std::time::Instant::now();
    let mut grpo = Grpo::new(model, ctx, &device)?;
    let driven = Driver {
        metrics: None,
        checkpointing: &Checkpointing::default(),
        stall_timeout: std::time::Duration::from_secs(600),
        stage: None,
    }
    .run(&mut grpo)?;
    let outcome = grpo.outcome(driven.steps, &driven.phases);
    let total = start.elapsed().as_secs_f64();
    let per_step = total / STEPS as f64;
    println!(
        "  per step: generate {:.3} s, reward {:.3} s, train {:.3} s",
        outcome.generate.as_secs_f64() / STEPS as f64,
        outcome.reward.as_secs_f64() / STEPS as f64,
        outcome.train.as_secs_f64() / STEPS as f64
    );
    let trl = trl_peer(peer_dir);
    let mut report = Report::default();
    report.push(Row {
        name: "GRPO step, 8×8 completions, 32 tokens (s)".into(),
        value: per_step,
        unit: "s",
        baseline: trl,
        target: Some(("≤ 0.45 s".into(), per_step <= 0.45)),
    });
    Ok(report)
}

/// TRL's `GRPOTrainer` seconds per step on the same checkpoint and prompts (benches/peers/),
/// with its versions in the label; `None` (said why) when it cannot run.
fn trl_peer(dir: &Path) -> Option<(String, f64)> {
    println!("TRL GRPOTrainer on the same checkpoint and prompts (benches/peers/trl_grpo.py)");
    let args = [dir.to_path_buf(), dir.join("prompts.jsonl"), STEPS.to_string().into()];
    let stdout = crate::peers::run("trl_grpo.py", args)?;
    let value: serde_json::Value = serde_json::from_str(stdout.lines().last()?).ok()?;
    let seconds = value["seconds_per_step"].as_f64()?;
    let versions = &value["versions"];
    println!("  TRL: {seconds:.3} s per step");
    Some((
        format!(
            "TRL {} GRPOTrainer (torch {}), this run",
            versions["trl"].as_str()?,
            versions["torch"].as_str()?
        ),
        seconds,
    ))
}
