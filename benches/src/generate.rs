//! `cargo xtask bench generate`: tokens per second generating 128 new tokens with sampling from
//! a random ~3M-parameter Qwen2 (hidden 256, 4 layers, 4 heads, 2 KV heads, vocab 512), at
//! batch 1, 8 and 64, against HF transformers on the same checkpoint in the same run (each the
//! fastest of five runs: this machine's speed drifts by a quarter between runs).

use std::path::Path;
use std::time::Instant;

use rein_model::Cpu;
use rein_model::lm::save;
use rein_sampler::{GenerationConfig, SeededRng, generate};

use crate::qwen2_3m::qwen2_3m;
use crate::report::{Report, Row};

const PROMPT_LEN: usize = 16;
const NEW_TOKENS: usize = 128;
const BATCHES: [usize; 3] = [1, 8, 64];

pub fn run() -> anyhow::Result<Report> {
    let device = Default::default();
    let model = qwen2_3m::<Cpu>(&device)?;
    let dir = Path::new("target/bench/qwen2-3m");
    save(&model, dir)?;
    let params: usize = burn::module::Module::num_params(&model);
    println!("random Qwen2, {params} parameters, in {}", dir.display());
    let peer = hf_peer(dir);

    let mut report = Report::default();
    for batch in BATCHES {
        let mut rng = SeededRng::new(batch as u64);
        let prompts: Vec<Vec<u32>> = (0..batch)
            .map(|_| (0..PROMPT_LEN).map(|_| 3 + rng.below(509) as u32).collect())
            .collect();
        let config = |new| GenerationConfig {
            max_new_tokens: new,
            temperature: 1.0,
            n: 1,
            seed: 1,
            ..GenerationConfig::default()
        };
        generate(&model, &prompts, &config(4), 0, &mut |_, _| false, &device); // warm up
        let start = Instant::now();
        generate(&model, &prompts, &config(1), 0, &mut |_, _| false, &device);
        let prefill = start.elapsed().as_secs_f64();
        // The fastest of five runs, as for the peer.
        let mut total = f64::INFINITY;
        let mut tokens = 0;
        for _ in 0..5 {
            let start = Instant::now();
            let out = generate(&model, &prompts, &config(NEW_TOKENS), 0, &mut |_, _| false, &device);
            total = total.min(start.elapsed().as_secs_f64());
            tokens = out.iter().map(|g| g.tokens.len()).sum();
        }
        println!(
            "  batch {batch}: {tokens} tokens in {total:.2} s (prefill ≈ {:.1} ms, decode {:.2} s)",
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
            name: format!("generate, batch {batch} (new tokens/s)"),
            value: rate,
            unit: "tok/s",
            baseline: hf.map(|hf| ("HF transformers, this run".to_string(), hf)),
            target,
        });
    }
    Ok(report)
}

/// HF transformers on the same checkpoint, if `.venv` has it (see benches/peers/).
fn hf_peer(dir: &Path) -> Option<serde_json::Value> {
    let mut args = vec![
        dir.as_os_str().to_owned(),
        PROMPT_LEN.to_string().into(),
        NEW_TOKENS.to_string().into(),
    ];
    args.extend(BATCHES.map(|b| b.to_string().into()));
    serde_json::from_str(&crate::peers::run("hf_generate.py", args)?).ok()
}
