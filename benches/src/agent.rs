//! `cargo xtask bench agent`: multi-turn generation against single-turn generation at the same
//! batch (the prefix is never encoded again), and what a tool call costs in the sandbox: the
//! Rust `calculator` and the Python `python-exec` after its first call.

use std::path::Path;
use std::time::{Duration, Instant};

use rein_core::Tool;
use rein_model::Cpu;
use rein_plugin::{PluginRuntime, SandboxLimits};
use rein_sampler::{AfterTurn, GenerationConfig, Session, generate};

use crate::qwen2_3m::qwen2_3m;
use crate::report::{Report, Row};

/// Sequences decoded together: 8 prompts × 4 samples.
const PROMPTS: usize = 8;
const SAMPLES: usize = 4;
/// Tokens per turn, and turns of the multi-turn case.
const TURN: usize = 32;
const TURNS: usize = 3;
/// Tokens a tool appends between turns.
const TOOL_OUTPUT: usize = 24;

pub fn run(plugin_dir: &Path) -> anyhow::Result<Report> {
    let mut report = Report::default();
    generation(&mut report)?;
    tool_calls(&mut report, plugin_dir)?;
    Ok(report)
}

/// Sampled tokens per second: single-turn (`TURNS · TURN` tokens in one turn) against
/// `TURNS` turns of `TURN` tokens with `TOOL_OUTPUT` tokens appended to every sequence between
/// them, both from the same prompts, batch and seed. Each is the median of 5 runs.
fn generation(report: &mut Report) -> anyhow::Result<()> {
    let device = Default::default();
    let model = qwen2_3m::<Cpu>(&device)?;
    let prompts: Vec<Vec<u32>> = (0..PROMPTS as u32)
        .map(|i| (0..24 + i).map(|j| (i * 31 + j * 7) % 512).collect())
        .collect();
    let config = |max_new_tokens: usize| GenerationConfig {
        max_new_tokens,
        temperature: 1.0,
        n: SAMPLES,
        seed: 3,
        ..GenerationConfig::default()
    };
    let rows = PROMPTS * SAMPLES;
    let tool_output = |s: usize| -> Vec<u32> { (0..TOOL_OUTPUT as u32).map(|j| (s as u32 + j * 13) % 512).collect() };
    let single = median(|| {
        let start = Instant::now();
        let out = generate(&model, &prompts, &config(TURNS * TURN), 0, &mut |_, _| false, &device);
        let tokens: usize = out.iter().map(|g| g.tokens.len()).sum();
        tokens as f64 / start.elapsed().as_secs_f64()
    });
    let multi = median(|| {
        let start = Instant::now();
        let mut session = Session::start(&model, &prompts, &config(TURN), 0, &device);
        let all: Vec<usize> = (0..rows).collect();
        let mut tokens = 0;
        for turn in 0..TURNS {
            let out = session.turn(&all, AfterTurn::Keep, &mut |_, _| false);
            tokens += out.iter().map(|t| t.tokens.len()).sum::<usize>();
            if turn + 1 < TURNS {
                let tool: Vec<(usize, Vec<u32>)> = (0..rows).map(|s| (s, tool_output(s))).collect();
                session.append(&tool);
            }
        }
        tokens as f64 / start.elapsed().as_secs_f64()
    });
    // What a loop without a kept cache does: every turn encodes the whole conversation again
    // (one sequence per episode, its transcript so far as the prompt).
    let reencoded = median(|| {
        let start = Instant::now();
        let mut transcripts: Vec<Vec<u32>> = (0..rows).map(|s| prompts[s / SAMPLES].clone()).collect();
        let mut tokens = 0;
        for turn in 0..TURNS {
            let one = GenerationConfig {
                n: 1,
                seed: 3 + turn as u64,
                ..config(TURN)
            };
            let out = generate(&model, &transcripts, &one, 0, &mut |_, _| false, &device);
            for g in out {
                tokens += g.tokens.len();
                transcripts[g.prompt].extend(&g.tokens);
                if turn + 1 < TURNS {
                    transcripts[g.prompt].extend(tool_output(g.prompt));
                }
            }
        }
        tokens as f64 / start.elapsed().as_secs_f64()
    });
    report.push(Row {
        name: format!("multi-turn, {TURNS}×{TURN} tokens, {rows} seqs (tokens/s)"),
        value: multi,
        unit: "tok/s",
        baseline: Some((format!("single turn of {}", TURNS * TURN), single)),
        target: Some(("≥ 0.8× single-turn".into(), multi >= 0.8 * single)),
    });
    report.push(Row {
        name: format!("multi-turn re-encoding each turn's transcript, {rows} seqs"),
        value: reencoded,
        unit: "tok/s",
        baseline: Some(("one cache kept across turns".into(), multi)),
        target: None,
    });
    Ok(())
}

/// The median call time of the calculator (Rust) and of python-exec after its first call.
fn tool_calls(report: &mut Report, plugin_dir: &Path) -> anyhow::Result<()> {
    let runtime = PluginRuntime::default();
    let mut calculator = runtime
        .load(plugin_dir.join("calculator.wasm"), SandboxLimits::default())?
        .tool("{}")?;
    let calculator_us = call_time(&mut calculator, r#"{"expression": "1234 * 5678 + 9"}"#, 2000)?;
    report.push(Row {
        name: "calculator tool call (Rust, sandboxed)".into(),
        value: calculator_us,
        unit: "µs",
        baseline: None,
        target: Some(("≤ 20 µs".into(), calculator_us <= 20.0)),
    });
    let mut python = runtime
        .load(plugin_dir.join("python-exec.wasm"), SandboxLimits::default())?
        .tool("{}")?;
    let snippet = serde_json::json!({"code": "total = sum(i * i for i in range(100))\nprint(total)"}).to_string();
    python
        .call(&snippet)
        .map_err(|e| anyhow::anyhow!("python-exec: {}", e.message))?;
    let python_us = call_time(&mut python, &snippet, 200)?;
    report.push(Row {
        name: "python-exec call, small snippet, warm".into(),
        value: python_us,
        unit: "µs",
        baseline: None,
        target: Some(("≤ 2 ms".into(), python_us <= 2000.0)),
    });
    Ok(())
}

/// The median of `calls` calls of `tool` with `arguments`, in µs (after one warm-up call).
fn call_time(tool: &mut dyn Tool, arguments: &str, calls: usize) -> anyhow::Result<f64> {
    tool.call(arguments)
        .map_err(|e| anyhow::anyhow!("{}: {}", tool.spec().name, e.message))?;
    let mut times: Vec<Duration> = Vec::with_capacity(calls);
    for _ in 0..calls {
        let start = Instant::now();
        tool.call(arguments)
            .map_err(|e| anyhow::anyhow!("{}: {}", tool.spec().name, e.message))?;
        times.push(start.elapsed());
    }
    times.sort();
    Ok(times[calls / 2].as_secs_f64() * 1e6)
}

fn median(mut f: impl FnMut() -> f64) -> f64 {
    f(); // warm up
    let mut values: Vec<f64> = (0..5).map(|_| f()).collect();
    values.sort_by(f64::total_cmp);
    values[2]
}
