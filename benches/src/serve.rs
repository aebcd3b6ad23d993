//! `cargo xtask bench serve`: what serving over HTTP costs. 64 prompts sent as 64 concurrent
//! requests to a `rein serve` process (through the client GRPO uses, `HttpGenerator`, SGLang's
//! `/generate` with token ids and log-probabilities) against the same 64 prompts generated in
//! process as one batch (`rein generate`'s path), same model, seeds and tokens: SmolLM2-135M-
//! Instruct (f32), 64 new tokens each. Each figure is the best of 2 runs.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use rein_model::Cpu;
use rein_model::lm::{LmTokenizer, load, locate};
use rein_sampler::{GenerationConfig, Generator, HttpGenerator, HttpSettings, ServerApi, generate};

use crate::report::{Report, Row};

const REQUESTS: usize = 64;
const NEW_TOKENS: usize = 64;
const RUNS: usize = 2;

/// A `rein serve` process, killed when dropped.
pub(crate) struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn serve(model: &Path) -> anyhow::Result<(Server, String)> {
    let rein = PathBuf::from(std::env::var("REIN_BIN").context("REIN_BIN: run through `cargo xtask bench serve`")?);
    let mut child = Command::new(rein)
        .args(["serve", "--port", "0", "--model"])
        .arg(model)
        .stderr(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(child.stderr.take().context("no stderr")?).lines();
    let url = loop {
        let line = lines.next().context("rein serve ended before printing its address")??;
        if let Some(at) = line.find("http://") {
            break line[at..].trim().to_string();
        }
    };
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            println!("  rein serve: {line}");
        }
    });
    Ok((Server(child), url))
}

pub fn run() -> anyhow::Result<Report> {
    let device = Default::default();
    let dir = locate(Path::new("smollm2-135m"))?;
    let model = load::<Cpu>(&dir, &device)?;
    let tokenizer = LmTokenizer::load(&dir, &model.config().eos_ids())?;
    let prompts: Vec<Vec<u32>> = (0..REQUESTS)
        .map(|i| {
            tokenizer.encode(&format!(
                "Question {i}: what is {} plus {}? Answer:",
                17 * i + 3,
                29 * i + 11
            ))
        })
        .collect::<Result<_, _>>()?;
    let config = GenerationConfig {
        max_new_tokens: NEW_TOKENS,
        temperature: 1.0,
        n: 1,
        stop_token_ids: tokenizer.eos_ids().to_vec(),
        seed: 7,
        ..GenerationConfig::default()
    };
    let pad = tokenizer.pad_id().unwrap_or(0);
    let (server, url) = serve(&dir)?;
    let mut client = HttpGenerator::<Cpu>::new(HttpSettings {
        urls: vec![url.clone()],
        api: ServerApi::Sglang,
        model: "smollm2-135m".into(),
        timeout: Duration::from_secs(600),
        retries: 0,
        backoff: Duration::from_millis(100),
        weights_dir: PathBuf::from("target/bench/serve-weights"),
        adapter_only: false,
        keep_versions: 1,
    });
    client.wait_ready(Duration::from_secs(60))?;
    println!("rein serve on {url}: {REQUESTS} concurrent requests of {NEW_TOKENS} tokens (SmolLM2-135M, f32)");

    let (mut best_local, mut best_http) = (0f64, 0f64);
    let mut differing = 0;
    for _ in 0..RUNS {
        let start = Instant::now();
        let local = generate(&model, &prompts, &config, pad, &mut |_, _| false, &device);
        let local_tokens: usize = local.iter().map(|g| g.tokens.len()).sum();
        best_local = best_local.max(local_tokens as f64 / start.elapsed().as_secs_f64());

        let start = Instant::now();
        let served = client.generate(&prompts, &config, &[])?;
        let served_tokens: usize = served.iter().map(|g| g.tokens.len()).sum();
        best_http = best_http.max(served_tokens as f64 / start.elapsed().as_secs_f64());
        differing = local.iter().zip(&served).filter(|(a, b)| a.tokens != b.tokens).count();
    }
    drop(server);
    println!("{differing} of {REQUESTS} completions differ from the in-process ones");
    report_rows(best_http, best_local)
}

fn report_rows(http: f64, local: f64) -> anyhow::Result<Report> {
    let mut report = Report::default();
    report.push(Row {
        name: format!("rein serve, {REQUESTS} concurrent requests (tok/s)"),
        value: http,
        unit: "tok/s",
        baseline: Some(("in process, one batch".into(), local)),
        target: Some(("HTTP overhead ≤ 10 %".into(), http >= 0.9 * local)),
    });
    Ok(report)
}
