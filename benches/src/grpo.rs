//! `cargo xtask bench grpo`: seconds per GRPO step and peak resident memory against TRL's
//! `GRPOTrainer` on the same checkpoint, prompts and settings, in the same run, in two cases
//! (and, after them, what step rewards cost a step: [`crate::step_rewards`]):
//! - a random ~3M-parameter Qwen2 (hidden 256, 4 layers, vocab 512), fully fine-tuned: 8 prompts
//!   × 8 completions of 32 new tokens, β = 0, rewards from the sandboxed `math-answer` plugin;
//!   split into generate / reward / train, the train phase into forward / backward / optimizer,
//!   with its effective GFLOP/s against the peak of rein's matrix kernel measured in the same run;
//! - SmolLM2-135M-Instruct (fetched by `cargo xtask model smollm2-135m`) with rank-16 LoRA on
//!   every linear layer (TRL with PEFT): 8 prompts × 4 completions of up to 64 new tokens, in
//!   its chat template.
//!
//! rein's frozen LoRA base is SmolLM2's packed Q4_1 codes, TRL + PEFT's is the same values in
//! f32, so the SmolLM2 case also runs rein on the f32 weights (a row of its own). TRL runs as
//! its best users run it, without gradient checkpointing (its default, which recomputes every
//! forward pass in the backward and drops the KV cache while generating, is a second row).
//!
//! A step's time is the true median of the timed steps after one untimed warm-up step, the same
//! count on both sides. Completions stop at end-of-sequence, so both sides' mean completion
//! lengths are printed: the same model and settings sample similar lengths, not equal ones.

use std::path::{Path, PathBuf};

use rein_model::CpuAutodiff;
use rein_model::lm::lora::LoraSpec;
use rein_model::lm::{CausalLm, LmTokenizer, load, locate, save};
use rein_plugin::PluginRuntime;
use rein_posttrain::{
    ArithmeticTask, OnlineContext, OnlineTrainer, Prompt, Update, WeightedReward, generate_task, prepare,
};
use rein_recipe::{DataSection, GrpoSection, OptimizerSection, SamplerSection, TeacherKl};
use rein_run::checkpoint::Checkpointing;
use rein_run::driver::{Driven, Driver, Trainer};
use rein_run::memory::reset_peak_rss;
use rein_run::{MetricsWriter, RunDir};

use crate::qwen2_3m::{qwen2_3m, qwen2_3m_from};
use crate::report::{Report, Row, median, peak_rss_mib};

/// One benchmark case: a model, its prompts and settings, and the same for the TRL peer.
pub(crate) struct Case {
    /// What the rows are called (`GRPO step, …`).
    pub(crate) name: String,
    pub(crate) tokenizer: LmTokenizer,
    pub(crate) prompts: Vec<Prompt>,
    /// Where the peer reads the checkpoint (Hugging Face format) and `prompts.jsonl`.
    pub(crate) checkpoint: PathBuf,
    /// Where the case's prompts and metrics go.
    pub(crate) work_dir: PathBuf,
    /// Timed steps, after [`WARMUP`] untimed ones.
    pub(crate) steps: usize,
    pub(crate) completions: usize,
    pub(crate) max_new_tokens: usize,
    pub(crate) lr: f64,
    pub(crate) lora: Option<LoraSpec>,
    /// On-policy distillation toward this teacher (Hugging Face format, the full reverse KL as
    /// the only signal) instead of GRPO on the `math-answer` reward; TRL's peer is then its
    /// `DistillationTrainer`.
    pub(crate) teacher: Option<PathBuf>,
}

/// Untimed steps before the timed ones, on both sides.
pub(crate) const WARMUP: usize = 1;

/// What one side measured.
pub(crate) struct Measured {
    seconds_per_step: f64,
    peak_rss_mib: Option<f64>,
    mean_completion_tokens: Option<f64>,
}

pub fn run(plugin_dir: &Path) -> anyhow::Result<Report> {
    let device = Default::default();
    let mut report = Report::default();

    // The random Qwen2, fully fine-tuned.
    let model = qwen2_3m::<CpuAutodiff>(&device)?;
    let tokenizer = LmTokenizer::load(Path::new("recipes/assets/arithmetic-tokenizer"), &[])?;
    let prompts = arithmetic_prompts(&tokenizer, None)?;
    let checkpoint = PathBuf::from("target/bench/grpo-qwen2-3m");
    save(&model, &checkpoint)?;
    tokenizer.save(&checkpoint)?;
    let params: usize = burn::module::Module::num_params(&model);
    println!("random Qwen2, {params} parameters");
    let longest_prompt = prompts.iter().map(|p| p.tokens.len()).max().unwrap_or(0);
    let train_flop = train_flop(model.config(), 64, longest_prompt, 32);
    let random = Case {
        name: "GRPO step, 8×8 completions, 32 tokens".into(),
        tokenizer,
        prompts,
        work_dir: checkpoint.clone(),
        checkpoint,
        steps: 5,
        completions: 8,
        max_new_tokens: 32,
        lr: 1e-5,
        lora: None,
        teacher: None,
    };
    let steps = random.steps as f64;
    let (rein, driven, outcome) = measure(&random, model, plugin_dir)?;
    let phase = |name: &str| driven.get(name).map_or(0.0, |d| d.as_secs_f64()) / steps;
    println!(
        "  per step: generate {:.3} s, reward {:.3} s, train {:.3} s (forward {:.3} s, backward {:.3} s, optimizer {:.3} s)",
        outcome.generate.as_secs_f64() / steps,
        outcome.reward.as_secs_f64() / steps,
        outcome.train.as_secs_f64() / steps,
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
    compare(&random, &rein, &trl_runs(&random), &mut report);
    report.push(Row {
        name: "GRPO forward + backward, share of the matrix kernel's peak (%)".into(),
        value: 100.0 * achieved / peak,
        unit: "%",
        baseline: None,
        target: Some(("≥ 60 %".into(), achieved >= 0.6 * peak)),
    });

    // SmolLM2-135M-Instruct with LoRA.
    reset_peak_rss();
    let checkpoint = locate(Path::new("smollm2-135m"))?;
    let spec = LoraSpec {
        rank: 16,
        alpha: 32.0,
        dropout: 0.0,
        targets: vec!["all-linear".into()],
        rslora: false,
        vision: false,
    };
    let quantised = load::<CpuAutodiff>(&checkpoint, &device)?;
    anyhow::ensure!(
        quantised.packed_weights().is_some(),
        "{} holds no Q4_1 codes",
        checkpoint.display()
    );
    let f32_base = quantised.clone().without_packed();
    let model = quantised.with_lora(&spec, &mut rein_core::SeededRng::new(1), &device);
    let tokenizer = LmTokenizer::load(&checkpoint, &model.config().eos_ids())?;
    let system = "Solve the arithmetic problem. Write the final number inside <answer></answer> tags.";
    let prompts = arithmetic_prompts(&tokenizer, Some(system))?;
    println!(
        "SmolLM2-135M-Instruct in {}, LoRA rank 16 on every linear layer",
        checkpoint.display()
    );
    let smollm2 = Case {
        name: "GRPO step, SmolLM2-135M LoRA (rein's base: Q4_1 codes), 8×4 completions, ≤64 tokens".into(),
        tokenizer,
        prompts,
        checkpoint,
        work_dir: PathBuf::from("target/bench/grpo-smollm2-lora"),
        // Three timed steps: their median is not one slow step.
        steps: 3,
        completions: 4,
        max_new_tokens: 64,
        lr: 2e-4,
        lora: Some(spec.clone()),
        teacher: None,
    };
    let (rein, _, _) = measure(&smollm2, model, plugin_dir)?;
    let trl = trl_runs(&smollm2);
    compare(&smollm2, &rein, &trl, &mut report);
    // The same on f32 weights, as TRL + PEFT holds them, against the same TRL runs.
    reset_peak_rss();
    let f32_case = Case {
        name: "GRPO step, SmolLM2-135M LoRA (rein's base: f32), 8×4 completions, ≤64 tokens".into(),
        work_dir: PathBuf::from("target/bench/grpo-smollm2-lora-f32"),
        ..smollm2
    };
    let model = f32_base.with_lora(&spec, &mut rein_core::SeededRng::new(1), &device);
    let (rein, _, _) = measure(&f32_case, model, plugin_dir)?;
    compare(&f32_case, &rein, &trl, &mut report);
    Ok(report)
}

/// On-policy distillation (`[teacher] kl = "full"`) of the random Qwen2 toward another random
/// Qwen2 of its shape, against TRL's `DistillationTrainer` (β = 1, the same reverse KL over the
/// vocabulary) on the same student, teacher and prompts: seconds per step and peak memory.
pub fn distillation(plugin_dir: &Path, report: &mut Report) -> anyhow::Result<()> {
    let device = Default::default();
    reset_peak_rss();
    let student = qwen2_3m::<CpuAutodiff>(&device)?;
    let tokenizer = LmTokenizer::load(Path::new("recipes/assets/arithmetic-tokenizer"), &[])?;
    let checkpoint = PathBuf::from("target/bench/distill-student");
    save(&student, &checkpoint)?;
    tokenizer.save(&checkpoint)?;
    let teacher = PathBuf::from("target/bench/distill-teacher");
    save(&qwen2_3m_from::<rein_model::Cpu>(2, &device)?, &teacher)?;
    tokenizer.save(&teacher)?;
    let case = Case {
        name: "distillation step (full reverse KL), 3M Qwen2 from a 3M teacher, 8×8 completions, 32 tokens".into(),
        prompts: arithmetic_prompts(&tokenizer, None)?,
        tokenizer,
        work_dir: checkpoint.clone(),
        checkpoint,
        steps: 3,
        completions: 8,
        max_new_tokens: 32,
        lr: 1e-5,
        lora: None,
        teacher: Some(teacher),
    };
    let (rein, _, _) = measure(&case, student, plugin_dir)?;
    compare(&case, &rein, &trl_runs(&case), report);
    Ok(())
}

/// The arithmetic prompts both sides train on (two-digit sums, as in the default recipe), in
/// the tokenizer's chat template with `system` as the system prompt.
pub(crate) fn arithmetic_prompts(tokenizer: &LmTokenizer, system: Option<&str>) -> anyhow::Result<Vec<Prompt>> {
    let task = ArithmeticTask {
        min_operand: 0,
        max_operand: 99,
        ops: vec!["+".into()],
        train: 512,
        test: 0,
        solution: Default::default(),
        tool_share: 1.0,
        digits: Vec::new(),
    };
    let data = DataSection {
        task: None,
        shapes_task: None,
        train: None,
        test: None,
        fields: Default::default(),
        chat_template: true,
        system_prompt: system.map(str::to_string),
        chat_template_kwargs: Default::default(),
    };
    Ok(prepare(&generate_task(&task, 1).0, tokenizer, &data, &[], None)?)
}

/// Runs rein's GRPO on `case` from `model` (adapters attached when the case has LoRA) and
/// returns its figures, the time of each phase, and the outcome.
pub(crate) fn measure(
    case: &Case,
    model: CausalLm<CpuAutodiff>,
    plugin_dir: &Path,
) -> anyhow::Result<(
    Measured,
    std::collections::BTreeMap<String, std::time::Duration>,
    rein_posttrain::OnlineOutcome,
)> {
    let device = Default::default();
    // The same prompts for the TRL peer.
    std::fs::create_dir_all(&case.work_dir)?;
    let mut lines = String::new();
    for prompt in case.prompts.iter().take(8 * (WARMUP + case.steps)) {
        let row = serde_json::json!({
            "prompt": case.tokenizer.decode(&prompt.tokens, false)?,
            "answer": prompt.answer.clone().unwrap_or_default(),
        });
        lines += &format!("{row}\n");
    }
    std::fs::write(case.work_dir.join("prompts.jsonl"), lines)?;
    let runtime = PluginRuntime::default();
    let plugin = runtime.load(plugin_dir.join("math-answer.wasm"), Default::default())?;
    // Distillation's only signal is the teacher: the verifier still runs, with weight 0.
    let mut rewards = vec![WeightedReward {
        reward: Box::new(plugin.reward(r#"{"extract": "answer"}"#)?),
        weight: if case.teacher.is_some() { 0.0 } else { 1.0 },
        isolate: false,
    }];
    let grpo = GrpoSection {
        steps: WARMUP + case.steps,
        prompts_per_step: 8,
        ..GrpoSection::default()
    };
    let sampler = SamplerSection {
        max_new_tokens: case.max_new_tokens,
        n: case.completions,
        ..SamplerSection::default()
    };
    let optimizer = OptimizerSection {
        lr: case.lr,
        weight_decay: 0.0,
        max_grad_norm: 1.0,
        eps: 1e-8,
        ..OptimizerSection::default()
    };
    println!(
        "{}: {WARMUP} + {} steps of 8 prompts × {} completions × up to {} tokens",
        case.name, case.steps, case.completions, case.max_new_tokens
    );
    let ctx = OnlineContext {
        tokenizer: &case.tokenizer,
        prompts: &case.prompts,
        rewards: &mut rewards,
        signals: &[],
        accuracy_reward: 0,
        curriculum: None,
        rollout: grpo.rollout(),
        sampler: &sampler,
        optimizer: &optimizer,
        seed: 1,
        agent: None,
    };
    let runs = case.work_dir.join("runs");
    let _ = std::fs::remove_dir_all(&runs);
    let loading_rss = peak_rss_mib();
    let mut trainer = OnlineTrainer::new(model, ctx, Update::Grpo(&grpo), &device)?;
    if let Some(teacher) = &case.teacher {
        let teacher = load::<rein_model::Cpu>(teacher, &device)?;
        trainer = trainer.with_teacher(teacher, 1.0, TeacherKl::Full)?;
    }
    let (driven, peak_rss_mib, records) = drive(&mut trainer, &runs, loading_rss)?;
    let outcome = trainer.outcome(driven.steps, &driven.phases);
    let times = column(&records, "time/step_s");
    anyhow::ensure!(times.len() == case.steps, "{} timed steps logged", times.len());
    let measured = Measured {
        seconds_per_step: median(&times).unwrap_or(f64::NAN),
        peak_rss_mib,
        mean_completion_tokens: mean(&column(&records, "train/completion_length")),
    };
    println!(
        "  rein: {:.2} s per step, mean completion {:.1} tokens, peak RSS {:.0} MiB",
        measured.seconds_per_step,
        measured.mean_completion_tokens.unwrap_or(f64::NAN),
        measured.peak_rss_mib.unwrap_or(f64::NAN)
    );
    Ok((measured, driven.phases, outcome))
}

/// Drives `trainer` with its steps logged to a new run directory under `runs`. Returns the
/// driver's report, the run's peak resident memory (the driver resets the peak before each
/// step, so it is the larger of `loading_rss`, measured before the trainer was built, and the
/// steps') and the metric records of the steps after [`WARMUP`].
pub(crate) fn drive(
    trainer: &mut impl Trainer,
    runs: &Path,
    loading_rss: Option<f64>,
) -> anyhow::Result<(Driven, Option<f64>, Vec<serde_json::Value>)> {
    let run_dir = RunDir::create(runs, "bench", "")?;
    let mut metrics: MetricsWriter = run_dir.metrics()?;
    let driven = Driver {
        metrics: Some(&mut metrics),
        checkpointing: &Checkpointing::default(),
        stall_timeout: std::time::Duration::from_secs(1200),
        stage: None,
    }
    .run(trainer)?;
    let records = std::fs::read_to_string(run_dir.path().join("metrics.jsonl"))?
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .skip(WARMUP)
        .collect();
    let peak = [loading_rss, driven.peak_rss_mib]
        .into_iter()
        .flatten()
        .reduce(f64::max);
    Ok((driven, peak, records))
}

/// `key`'s values in `records` (of the records that have it).
pub(crate) fn column(records: &[serde_json::Value], key: &str) -> Vec<f64> {
    records.iter().filter_map(|r| r[key].as_f64()).collect()
}

/// What TRL measured on a case, with gradient checkpointing or without: its label and figures,
/// or why it could not run.
pub(crate) type TrlRun = (bool, Result<(String, Measured), String>);

/// What TRL measured on a case, without gradient checkpointing and with it (its default).
type TrlRuns = [TrlRun; 2];

/// Runs the TRL peer on `case` without gradient checkpointing and then with it.
fn trl_runs(case: &Case) -> TrlRuns {
    [false, true].map(|checkpointing| (checkpointing, trl_peer(case, checkpointing)))
}

/// Pushes rein's step time and peak memory on `case`, each against each TRL run.
pub(crate) fn compare(case: &Case, rein: &Measured, trl_runs: &[TrlRun], report: &mut Report) {
    for (checkpointing, run) in trl_runs {
        let checkpointing = *checkpointing;
        let setting = match checkpointing {
            false => "TRL, no gradient checkpointing",
            true => "TRL's default: gradient checkpointing",
        };
        let name = format!("{} (s)", case.name);
        let (label, trl) = match run {
            Ok((label, trl)) => (label.clone(), trl),
            Err(reason) => {
                report.not_measured(name, setting, reason.clone());
                continue;
            }
        };
        let target = (!checkpointing).then(|| {
            (
                format!("≥ 2× TRL ({:.2}×)", trl.seconds_per_step / rein.seconds_per_step),
                rein.seconds_per_step * 2.0 <= trl.seconds_per_step,
            )
        });
        report.push(Row {
            name,
            value: rein.seconds_per_step,
            unit: "s",
            baseline: Some((label.clone(), trl.seconds_per_step)),
            target,
        });
        if let (Some(rss), Some(theirs)) = (rein.peak_rss_mib, trl.peak_rss_mib) {
            report.push(Row {
                name: format!("{}, peak resident memory (MiB)", case.name),
                value: rss,
                unit: "MiB",
                baseline: Some((label, theirs)),
                target: Some(("≤ TRL's".to_string(), rss <= theirs)),
            });
        }
    }
}

/// TRL's `GRPOTrainer` (with PEFT when the case has LoRA; its `DistillationTrainer` when the
/// case has a teacher) on the case's checkpoint and prompts (benches/peers/trl_grpo.py,
/// trl_distill.py): its label and figures, or why it could not run.
pub(crate) fn trl_peer(case: &Case, checkpointing: bool) -> Result<(String, Measured), String> {
    let (script, trainer) = match case.teacher {
        Some(_) => ("trl_distill.py", "DistillationTrainer"),
        None => ("trl_grpo.py", "GRPOTrainer"),
    };
    println!(
        "  TRL {trainer} on the same checkpoint and prompts (benches/peers/{script}), gradient checkpointing {}",
        if checkpointing { "on" } else { "off" }
    );
    let mut args: Vec<String> = vec![case.checkpoint.display().to_string()];
    args.extend(case.teacher.iter().map(|t| t.display().to_string()));
    args.extend([
        case.work_dir.join("prompts.jsonl").display().to_string(),
        format!("--warmup={WARMUP}"),
        format!("--steps={}", case.steps),
        format!("--completions={}", case.completions),
        format!("--max-tokens={}", case.max_new_tokens),
        format!("--lr={}", case.lr),
        format!("--output-dir={}", case.work_dir.join("trl").display()),
    ]);
    if let Some(lora) = &case.lora {
        args.push(format!("--lora-rank={}", lora.rank));
        args.push(format!("--lora-alpha={}", lora.alpha));
    }
    if checkpointing {
        args.push("--gradient-checkpointing".into());
    }
    let value = crate::peers::run(script, args)?;
    crate::peers::describe(script, &value);
    if value["checkpointing_active"].as_bool() != Some(checkpointing) {
        return Err(format!(
            "asked for gradient checkpointing {checkpointing}, TRL reports {}",
            value["checkpointing_active"]
        ));
    }
    let measured = Measured {
        seconds_per_step: value["seconds_per_step"].as_f64().ok_or("no `seconds_per_step`")?,
        peak_rss_mib: value["peak_rss_mib"].as_f64(),
        mean_completion_tokens: value["mean_completion_tokens"].as_f64(),
    };
    println!(
        "  TRL: {:.2} s per step, mean completion {:.1} tokens, peak RSS {:.0} MiB",
        measured.seconds_per_step,
        measured.mean_completion_tokens.unwrap_or(f64::NAN),
        measured.peak_rss_mib.unwrap_or(f64::NAN)
    );
    let what = match (case.lora.is_some(), checkpointing) {
        (true, false) => "TRL + PEFT (f32 base)",
        (true, true) => "TRL + PEFT (f32 base), gradient checkpointing",
        (false, false) => "TRL",
        (false, true) => "TRL, gradient checkpointing",
    };
    Ok((format!("{what} ({})", crate::peers::versions(&value)), measured))
}

fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
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
