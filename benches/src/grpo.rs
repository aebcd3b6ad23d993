//! `cargo xtask bench grpo`: seconds per GRPO step on a random ~3M-parameter Qwen2 (hidden 256,
//! 4 layers, vocab 512): 8 prompts × 8 completions of 32 new tokens, β = 0, rewards from the
//! sandboxed `math-answer` plugin; split into generate / reward / train, the train phase into
//! forward / backward / optimizer, with its effective GFLOP/s against the peak of rein's matrix
//! kernel measured in the same run.

use std::path::Path;

use rein_model::CpuAutodiff;
use rein_model::lm::{LmTokenizer, save};
use rein_plugin::PluginRuntime;
use rein_recipe::{DataSection, GrpoSection, OptimizerSection, SamplerSection};
use rein_train::checkpoint::Checkpointing;
use rein_train::driver::Driver;
use rein_train::lm::{ArithmeticTask, Grpo, GrpoContext, WeightedReward, generate_task, prepare};

use crate::qwen2_3m::qwen2_3m;
use crate::report::{Report, Row, peak_rss_mib};

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
    let longest_prompt = prompts.iter().map(|p| p.tokens.len()).max().unwrap_or(0);
    let train_flop = train_flop(model.config(), 64, longest_prompt, 32);
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
    // The driver resets the peak before each step: the run's peak is the larger of the one
    // before it (loading) and its steps'.
    let loading_rss = peak_rss_mib();
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
    let phase = |name: &str| driven.phases.get(name).map_or(0.0, |d| d.as_secs_f64()) / STEPS as f64;
    println!(
        "  per step: generate {:.3} s, reward {:.3} s, train {:.3} s (forward {:.3} s, backward {:.3} s, optimizer {:.3} s)",
        outcome.generate.as_secs_f64() / STEPS as f64,
        outcome.reward.as_secs_f64() / STEPS as f64,
        outcome.train.as_secs_f64() / STEPS as f64,
        phase("forward"),
        phase("backward"),
        phase("optimizer"),
    );
    let achieved = train_flop / (phase("forward") + phase("backward")) / 1e9;
    let peak = gemm_peak_gflops();
    println!(
        "  forward + backward: ≈{:.1} GFLOP per step, {achieved:.1} GFLOP/s = {:.0}% of the matrix kernel's {peak:.1} GFLOP/s (this run)",
        train_flop / 1e9,
        100.0 * achieved / peak
    );
    let rss = [loading_rss, driven.peak_rss_mib]
        .into_iter()
        .flatten()
        .reduce(f64::max);
    let trl = trl_peer(peer_dir);
    let target = trl.as_ref().map(|trl| {
        (
            format!("≥ 2× TRL ({:.2}×)", trl.seconds_per_step / per_step),
            per_step * 2.0 <= trl.seconds_per_step,
        )
    });
    let mut report = Report::default();
    report.push(Row {
        name: "GRPO step, 8×8 completions, 32 tokens (s)".into(),
        value: per_step,
        unit: "s",
        baseline: trl.as_ref().map(|trl| (trl.label.clone(), trl.seconds_per_step)),
        target,
    });
    if let Some(rss) = rss {
        let trl_rss = trl
            .as_ref()
            .and_then(|trl| Some((trl.label.clone(), trl.peak_rss_mib?)));
        let target = trl_rss
            .as_ref()
            .map(|(_, theirs)| ("≤ TRL's".to_string(), rss <= *theirs));
        report.push(Row {
            name: "GRPO peak resident memory, whole process (MiB)".into(),
            value: rss,
            unit: "MiB",
            baseline: trl_rss,
            target,
        });
    }
    report.push(Row {
        name: "GRPO forward + backward, share of the matrix kernel's peak (%)".into(),
        value: 100.0 * achieved / peak,
        unit: "%",
        baseline: None,
        target: Some(("≥ 60 %".into(), achieved >= 0.6 * peak)),
    });
    Ok(report)
}

/// Floating-point operations of one GRPO update's forward and backward passes (backward = 2×
/// forward), counting the matrix products: the layers' projections on every position of
/// `rows` rows of `prompt + completion` tokens, causal attention as dense, and the output head
/// on the completion positions only.
fn train_flop(config: &rein_model::lm::LmConfig, rows: usize, prompt: usize, completion: usize) -> f64 {
    let (h, layers) = (config.hidden_size as f64, config.num_hidden_layers as f64);
    let head_dim = h / config.num_attention_heads as f64;
    let kv = config.kv_heads() as f64 * head_dim;
    let per_layer = h * (h + 2.0 * kv) + h * h + 3.0 * h * config.intermediate_size as f64;
    let seq = (prompt + completion) as f64;
    let projections = 2.0 * rows as f64 * seq * per_layer * layers;
    let attention = 2.0 * 2.0 * rows as f64 * seq * seq * h * layers;
    let head = 2.0 * (rows * completion) as f64 * h * config.vocab_size as f64;
    3.0 * (projections + attention + head)
}

/// The matrix kernel's best rate on a large square product (`rein_kernels::matmul`, both cores),
/// in GFLOP/s: the best of five.
fn gemm_peak_gflops() -> f64 {
    use rein_kernels::{Init, MatRef, matmul};
    let n = 768;
    let a: Vec<f32> = (0..n * n).map(|i| (i % 17) as f32 * 0.01).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 13) as f32 * 0.01).collect();
    let mut c = vec![0.0f32; n * n];
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = std::time::Instant::now();
        let (a, b) = (
            MatRef::row_major(&a, n, n).unwrap(),
            MatRef::row_major(&b, n, n).unwrap(),
        );
        matmul(&mut c, n, a, b, Init::Zero);
        best = best.min(start.elapsed().as_secs_f64());
    }
    2.0 * (n * n * n) as f64 / best / 1e9
}

/// What the TRL peer measured.
struct TrlFigures {
    /// TRL's and torch's versions.
    label: String,
    seconds_per_step: f64,
    /// The peer process's peak resident set.
    peak_rss_mib: Option<f64>,
}

/// TRL's `GRPOTrainer` on the same checkpoint and prompts (benches/peers/); `None` (said why)
/// when it cannot run.
fn trl_peer(dir: &Path) -> Option<TrlFigures> {
    println!("TRL GRPOTrainer on the same checkpoint and prompts (benches/peers/trl_grpo.py)");
    let args = [dir.to_path_buf(), dir.join("prompts.jsonl"), STEPS.to_string().into()];
    let stdout = crate::peers::run("trl_grpo.py", args)?;
    let value: serde_json::Value = serde_json::from_str(stdout.lines().last()?).ok()?;
    let seconds = value["seconds_per_step"].as_f64()?;
    let peak_rss_mib = value["peak_rss_mib"].as_f64();
    let versions = &value["versions"];
    println!(
        "  TRL: {seconds:.3} s per step, peak RSS {:.0} MiB",
        peak_rss_mib.unwrap_or(f64::NAN)
    );
    Some(TrlFigures {
        label: format!(
            "TRL {} GRPOTrainer (torch {}), this run",
            versions["trl"].as_str()?,
            versions["torch"].as_str()?
        ),
        seconds_per_step: seconds,
        peak_rss_mib,
    })
}
