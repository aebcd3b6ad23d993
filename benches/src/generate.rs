//! `cargo xtask bench generate`: tokens per second generating 128 new tokens with sampling
//! (temperature 1, no end-of-sequence stop) from the same prompts on every side, each figure
//! the median of the timed runs after one untimed run, as every peer measures it:
//! - a random ~3M-parameter Qwen2 (hidden 256, 4 layers, 4 heads, 2 KV heads, vocab 512) in
//!   f32, at batch 1, 8 and 64, against HF transformers `generate` on the same checkpoint;
//! - SmolLM2-135M-Instruct (fetched by `cargo xtask model smollm2-135m`) at batch 1 and 16,
//!   like with like: rein reading the GGUF's Q4_1 codes against llama.cpp (llama-cpp-python)
//!   decoding the same `.gguf` file — exactly, and with its activations quantised to 8 bits as
//!   llama.cpp quantises them (`precision = "q8"`) — and rein on plain f32 weights (the same
//!   values, decoded) against HF transformers reading them in f32;
//! - Gemma 3 270M (fetched by `cargo xtask model gemma3-270m`) at batch 1 and 16, rein reading
//!   the file's Q4_K_M codes (Q4_K, Q6_K, Q5_0 and Q8_0 blocks) against llama.cpp on the same
//!   `.gguf`, exactly and with q8 activations, when the model has been fetched.

use std::path::{Path, PathBuf};
use std::time::Instant;

use rein_core::SamplerPrecision;
use rein_model::Cpu;
use rein_model::lm::{CausalLm, load, locate, save};
use rein_sampler::{GenerationConfig, SeededRng, generate};

use crate::qwen2_3m::qwen2_3m;
use crate::report::{Report, Row, median};

const PROMPT_LEN: usize = 16;
const NEW_TOKENS: usize = 128;

/// A peer generating from the same prompts: its script, what it reads, its label.
struct Peer {
    script: &'static str,
    /// The checkpoint directory or `.gguf` file it loads.
    model: PathBuf,
    label: &'static str,
}

/// What rein must reach against llama.cpp, as multiples of its rate: exactly at batch 1, with
/// q8 activations at batch 1, and batched.
struct LlamaCppBar {
    exact: f64,
    q8: f64,
    batched: f64,
}

/// SmolLM2's bar.
const SMOLLM2_BAR: LlamaCppBar = LlamaCppBar {
    exact: 0.8,
    q8: 1.2,
    batched: 1.0,
};

/// Gemma 3's: the ratios rein reaches on SmolLM2's Q4_1 (docs/benchmarks.md).
const GEMMA3_BAR: LlamaCppBar = LlamaCppBar {
    exact: 1.0,
    q8: 1.5,
    batched: 1.0,
};

/// One model at several batch sizes, against its peer.
struct Case<'a> {
    /// What rein reads (`random Qwen2, f32`, `SmolLM2-135M, Q4_1 codes`).
    label: &'a str,
    batches: &'a [usize],
    /// rein's precisions, each measured against the same peer run.
    precisions: &'a [SamplerPrecision],
    /// Timed runs per batch (the median counts), after one untimed run; the same for the peer.
    runs: usize,
    /// Where the prompts are written for the peer.
    work_dir: PathBuf,
    peer: Peer,
    /// The goals against llama.cpp (none against transformers).
    bar: &'a LlamaCppBar,
}

pub fn run() -> anyhow::Result<Report> {
    let device = Default::default();
    let mut report = Report::default();

    let model = qwen2_3m::<Cpu>(&device)?;
    let dir = PathBuf::from("target/bench/qwen2-3m");
    save(&model, &dir)?;
    let params: usize = burn::module::Module::num_params(&model);
    println!("random Qwen2, {params} parameters, in {}", dir.display());
    let random = Case {
        label: "random Qwen2 (f32)",
        batches: &[1, 8, 64],
        precisions: &[SamplerPrecision::Exact],
        runs: 5,
        work_dir: dir.clone(),
        peer: Peer {
            script: "hf_generate.py",
            model: dir.clone(),
            label: "HF transformers (f32)",
        },
        bar: &SMOLLM2_BAR,
    };
    measure(&model, &random, &mut report)?;

    // The real pretrained model: its packed Q4_1 codes, then the same values as f32.
    let smollm2 = locate(Path::new("smollm2-135m"))?;
    let gguf = downloads().join("smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf");
    let quantised = load::<Cpu>(&smollm2, &device)?;
    anyhow::ensure!(
        quantised.packed_weights().is_some(),
        "{} holds no packed Q4_1 codes",
        smollm2.display()
    );
    println!(
        "SmolLM2-135M-Instruct in {} (from {})",
        smollm2.display(),
        gguf.display()
    );
    let work_dir = PathBuf::from("target/bench/smollm2-135m");
    let codes = Case {
        label: "SmolLM2-135M (Q4_1 codes)",
        batches: &[1, 16],
        precisions: &[SamplerPrecision::Exact, SamplerPrecision::Q8],
        runs: 3,
        work_dir: work_dir.clone(),
        peer: Peer {
            script: "llama_cpp_generate.py",
            model: gguf,
            label: "llama.cpp on the same .gguf (Q4_1)",
        },
        bar: &SMOLLM2_BAR,
    };
    measure(&quantised, &codes, &mut report)?;
    let f32_weights = quantised.without_packed();
    let plain = Case {
        label: "SmolLM2-135M (f32)",
        batches: &[1, 16],
        precisions: &[SamplerPrecision::Exact],
        runs: 3,
        work_dir,
        peer: Peer {
            script: "hf_generate.py",
            model: smollm2.clone(),
            label: "HF transformers (f32)",
        },
        bar: &SMOLLM2_BAR,
    };
    measure(&f32_weights, &plain, &mut report)?;

    // Gemma 3 270M, when fetched: its Q4_K_M codes against llama.cpp on the same file.
    match locate(Path::new("gemma3-270m")) {
        Ok(gemma) => {
            let gguf = downloads().join("gemma3-270m/gemma-3-270m-q4_k_m.gguf");
            let model = load::<Cpu>(&gemma, &device)?;
            println!("Gemma 3 270M in {} (from {})", gemma.display(), gguf.display());
            let case = Case {
                label: "Gemma 3 270M (Q4_K_M codes)",
                batches: &[1, 16],
                precisions: &[SamplerPrecision::Exact, SamplerPrecision::Q8],
                runs: 3,
                work_dir: PathBuf::from("target/bench/gemma3-270m"),
                peer: Peer {
                    script: "llama_cpp_generate.py",
                    model: gguf,
                    label: "llama.cpp on the same .gguf (Q4_K_M)",
                },
                bar: &GEMMA3_BAR,
            };
            measure(&model, &case, &mut report)?;
        }
        Err(e) => report.not_measured(
            "generate, Gemma 3 270M (Q4_K_M codes)",
            "llama.cpp on the same .gguf (Q4_K_M)",
            format!("{e} (cargo xtask model gemma3-270m)"),
        ),
    }
    Ok(report)
}

/// Where `cargo xtask model` keeps the files it fetched.
fn downloads() -> PathBuf {
    std::env::var_os("REIN_DOWNLOADS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/downloads"))
}

fn measure(model: &CausalLm<Cpu>, case: &Case, report: &mut Report) -> anyhow::Result<()> {
    let vocab = model.config().vocab_size.min(512) as u64;
    let prompts: Vec<(usize, Vec<Vec<u32>>)> = (case.batches.iter())
        .map(|&batch| {
            let mut rng = SeededRng::new(batch as u64);
            let rows = (0..batch)
                .map(|_| (0..PROMPT_LEN).map(|_| 3 + rng.below(vocab - 3) as u32).collect())
                .collect();
            (batch, rows)
        })
        .collect();
    std::fs::create_dir_all(&case.work_dir)?;
    let prompts_file = case.work_dir.join("prompts.json");
    let table: serde_json::Map<String, serde_json::Value> = (prompts.iter())
        .map(|(batch, rows)| (batch.to_string(), serde_json::json!(rows)))
        .collect();
    std::fs::write(&prompts_file, serde_json::to_string(&table)?)?;
    let peer = run_peer(case, &prompts_file);

    for &precision in case.precisions {
        for (batch, prompts) in &prompts {
            measure_batch(model, case, precision, (*batch, prompts), &peer, report)?;
        }
    }
    Ok(())
}

/// rein at one precision and batch size, beside the peer's figure for that batch.
fn measure_batch(
    model: &CausalLm<Cpu>,
    case: &Case,
    precision: SamplerPrecision,
    (batch, prompts): (usize, &[Vec<u32>]),
    peer: &Result<(String, serde_json::Value), String>,
    report: &mut Report,
) -> anyhow::Result<()> {
    let device = Default::default();
    let config = |new| GenerationConfig {
        max_new_tokens: new,
        temperature: 1.0,
        n: 1,
        seed: 1,
        precision,
        ..GenerationConfig::default()
    };
    let label = match precision {
        SamplerPrecision::Exact => case.label.to_string(),
        SamplerPrecision::Q8 => format!("{}, q8 activations", case.label),
    };
    let start = Instant::now();
    generate(model, prompts, &config(1), 0, &mut |_, _| false, &device);
    let prefill = start.elapsed().as_secs_f64();
    generate(model, prompts, &config(NEW_TOKENS), 0, &mut |_, _| false, &device); // untimed
    let mut rates = Vec::new();
    for _ in 0..case.runs {
        let start = Instant::now();
        let out = generate(model, prompts, &config(NEW_TOKENS), 0, &mut |_, _| false, &device);
        let tokens: usize = out.iter().map(|g| g.tokens.len()).sum();
        anyhow::ensure!(tokens == batch * NEW_TOKENS, "{tokens} tokens generated");
        rates.push(tokens as f64 / start.elapsed().as_secs_f64());
    }
    let rate = median(&rates).unwrap_or(f64::NAN);
    println!(
        "  {label}, batch {batch}: {rate:.1} tokens/s (median of {}; prefill ≈ {:.1} ms)",
        case.runs,
        prefill * 1e3
    );
    let name = format!("generate, {label}, batch {batch} (new tokens/s)");
    match peer {
        Ok((peer_label, theirs)) => {
            let theirs = theirs["batches"][batch.to_string()]["tokens_per_s"].as_f64();
            let target = theirs.and_then(|t| goal(case, precision, batch).map(|(text, x)| (text, rate >= x * t)));
            report.push(Row {
                name,
                value: rate,
                unit: "tok/s",
                baseline: theirs.map(|t| (peer_label.clone(), t)),
                target,
            });
        }
        Err(reason) => report.not_measured(name, case.peer.label, reason.clone()),
    }
    Ok(())
}

/// The goal against the peer, as a multiple of its rate: 2× transformers (batch 8 is a middle
/// point, not a goal); against llama.cpp the case's bar.
fn goal(case: &Case, precision: SamplerPrecision, batch: usize) -> Option<(String, f64)> {
    let times = match (case.peer.script, precision, batch) {
        ("hf_generate.py", _, 8) => return None,
        ("hf_generate.py", _, _) => 2.0,
        (_, SamplerPrecision::Exact, 1) => case.bar.exact,
        (_, SamplerPrecision::Q8, 1) => case.bar.q8,
        _ => case.bar.batched,
    };
    let peer = match case.peer.script {
        "hf_generate.py" => "HF",
        _ => "llama.cpp",
    };
    Some((format!("≥ {times}× {peer}"), times))
}

/// The case's peer on the same prompts, batches and run counts: its label with the versions it
/// reported, and its figures.
fn run_peer(case: &Case, prompts: &Path) -> Result<(String, serde_json::Value), String> {
    let mut args = vec![case.peer.model.display().to_string()];
    args.extend(case.batches.iter().map(|b| b.to_string()));
    args.extend([
        format!("--prompt-len={PROMPT_LEN}"),
        format!("--new-tokens={NEW_TOKENS}"),
        format!("--steps={}", case.runs),
        "--warmup=1".to_string(),
        format!("--prompts={}", prompts.display()),
    ]);
    println!(
        "{} ({}), {}: batches {:?}",
        case.peer.label, case.peer.script, case.label, case.batches
    );
    let value = crate::peers::run(case.peer.script, args)?;
    crate::peers::describe(case.peer.script, &value);
    if let Some(info) = value["llama_cpp_system_info"].as_str() {
        println!("  llama.cpp: {}", info.trim());
    }
    let label = format!("{} ({})", case.peer.label, crate::peers::versions(&value));
    Ok((label, value))
}
