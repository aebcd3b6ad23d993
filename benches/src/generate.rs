//! `cargo xtask bench generate`: tokens per second generating 128 new tokens with sampling from
//! a random ~3M-parameter Qwen2 (hidden 256, 4 layers, 4 heads, 2 KV heads, vocab 512), at
//! batch 1, 8 and 64, and from the real SmolLM2-135M-Instruct (f32, fetched by
//! `cargo xtask model smollm2-135m`) at batch 1 and 16, against HF transformers on the same
//! checkpoint in the same run (each the fastest of several runs: this machine's speed drifts by
//! a quarter between runs).

use std::path::Path;
use std::time::Instant;

use rein_model::Cpu;
use rein_model::lm::{CausalLm, load, locate, save};
use rein_sampler::{GenerationConfig, SeededRng, generate};

use crate::qwen2_3m::qwen2_3m;
use crate::report::{Report, Row};

const PROMPT_LEN: usize = 16;
const NEW_TOKENS: usize = 128;

/// One model at several batch sizes.
struct Case<'a> {
    label: &'a str,
    dir: &'a Path,
    batches: &'a [usize],
    /// Timed runs per batch (the fastest counts), the same for the peer.
    runs: usize,
}

pub fn run() -> anyhow::Result<Report> {
    let device = Default::default();
    let model = qwen2_3m::<Cpu>(&device)?;
    let dir = Path::new("target/bench/qwen2-3m");
    save(&model, dir)?;
    let params: usize = burn::module::Module::num_params(&model);
    println!("random Qwen2, {params} parameters, in {}", dir.display());
    let mut report = Report::default();
    let random = Case {
        label: "",
        dir,
        batches: &[1, 8, 64],
        runs: 5,
    };
    measure(&model, &random, &mut report);

    // The real pretrained model, when `cargo xtask bench` has fetched it.
    let smollm2 = locate(Path::new("smollm2-135m"))?;
    let model = load::<Cpu>(&smollm2, &device)?;
    println!("SmolLM2-135M-Instruct (f32) in {}", smollm2.display());
    let real = Case {
        label: "SmolLM2-135M, ",
        dir: &smollm2,
        batches: &[1, 16],
        runs: 2,
    };
    measure(&model, &real, &mut report);
    Ok(report)
}

fn measure(model: &CausalLm<Cpu>, case: &Case, report: &mut Report) {
    let device = Default::default();
    let peer = hf_peer(case);
    let vocab = model.config().vocab_size.min(512) as u64;
    for &batch in case.batches {
        let mut rng = SeededRng::new(batch as u64);
        let prompts: Vec<Vec<u32>> = (0..batch)
            .map(|_| (0..PROMPT_LEN).map(|_| 3 + rng.below(vocab - 3) as u32).collect())
            .collect();
        let config = |new| GenerationConfig {
            max_new_tokens: new,
            temperature: 1.0,
            n: 1,
            seed: 1,
            ..GenerationConfig::default()
        };
        generate(model, &prompts, &config(4), 0, &mut |_, _| false, &device); // warm up
        let start = Instant::now();
        generate(model, &prompts, &config(1), 0, &mut |_, _| false, &device);
        let prefill = start.elapsed().as_secs_f64();
        // The fastest of the runs, as for the peer.
        let mut total = f64::INFINITY;
        let mut tokens = 0;
        for _ in 0..case.runs {
            let start = Instant::now();
            let out = generate(model, &prompts, &config(NEW_TOKENS), 0, &mut |_, _| false, &device);
            total = total.min(start.elapsed().as_secs_f64());
            tokens = out.iter().map(|g| g.tokens.len()).sum();
        }
        println!(
            "  {}batch {batch}: {tokens} tokens in {total:.2} s (prefill ≈ {:.1} ms, decode {:.2} s)",
            case.label,
            prefill * 1e3,
            total - prefill
        );
        let rate = tokens as f64 / total;
        // Without the peer there is nothing to compare with: rein's figure alone, no target.
        let hf = peer.as_ref().and_then(|p| p[batch.to_string()].as_f64());
        let target = hf
            .filter(|_| batch != 8)
            .map(|hf| ("≥ 2× HF".to_string(), rate >= 2.0 * hf));
        report.push(Row {
            name: format!("generate, {}batch {batch} (new tokens/s)", case.label),
            value: rate,
            unit: "tok/s",
            baseline: hf.map(|hf| ("HF transformers, this run".to_string(), hf)),
            target,
        });
    }
}

/// HF transformers on the same checkpoint, if `.venv` has it (see benches/peers/).
fn hf_peer(case: &Case) -> Option<serde_json::Value> {
    let mut args = vec![
        case.dir.as_os_str().to_owned(),
        PROMPT_LEN.to_string().into(),
        NEW_TOKENS.to_string().into(),
        case.runs.to_string().into(),
    ];
    args.extend(case.batches.iter().map(|b| b.to_string().into()));
    serde_json::from_str(&crate::peers::run("hf_generate.py", args)?).ok()
}
