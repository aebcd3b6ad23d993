//! `cargo xtask bench serve`: what serving over HTTP costs. 64 prompts sent as 64 concurrent
//! requests to a `rein serve` process (through the client GRPO uses, `HttpGenerator`, SGLang's
//! `/generate` with token ids and log-probabilities) against the same 64 prompts generated in
//! process as one batch (`rein generate`'s path), same model, seeds and tokens: SmolLM2-135M-
//! Instruct (f32), 64 new tokens each. Each figure is the best of 2 runs.
//!
//! Then what one long request costs the others: the latency (median and worst of 10) of short
//! greedy requests (a one-line prompt, 8 new tokens) sent one after another to an idle server,
//! and again while another client keeps the server busy with long requests (a 1,024-token prompt,
//! 4 samples of 128 tokens each), one after another.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
    println!("{differing} of {REQUESTS} completions differ from the in-process ones");
    let address = url.trim_start_matches("http://").to_string();
    let alone = short_latencies(&address)?;
    let beside = beside_long_requests(&address, &tokenizer)?;
    drop(server);
    let mut report = report_rows(best_http, best_local)?;
    for (what, pick) in [("median", 0.5), ("worst", 1.0)] {
        report.push(Row {
            name: format!("a short request's latency beside long ones, {what} of {SHORT} (ms)"),
            value: percentile(&beside, pick) * 1e3,
            unit: "ms",
            baseline: Some(("on an idle server".into(), percentile(&alone, pick) * 1e3)),
            target: None,
        });
    }
    Ok(report)
}

/// Short requests timed per latency figure.
const SHORT: usize = 10;

/// POSTs `body` to `path` and returns the answer's body (`Connection: close`).
fn post(address: &str, path: &str, body: &serde_json::Value) -> anyhow::Result<String> {
    let body = body.to_string();
    let mut stream = TcpStream::connect(address)?;
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    anyhow::ensure!(answer.starts_with("HTTP/1.1 200"), "{path} answered {answer}");
    Ok(answer)
}

/// Seconds each of `SHORT` short greedy requests took, sent one after another.
fn short_latencies(address: &str) -> anyhow::Result<Vec<f64>> {
    let body = serde_json::json!({"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0});
    (0..SHORT)
        .map(|_| {
            let start = Instant::now();
            post(address, "/v1/completions", &body)?;
            Ok(start.elapsed().as_secs_f64())
        })
        .collect()
}

/// [`short_latencies`] while another client sends long requests one after another.
fn beside_long_requests(address: &str, tokenizer: &LmTokenizer) -> anyhow::Result<Vec<f64>> {
    let long_prompt: Vec<u32> = tokenizer
        .encode(&"The quick brown fox jumps over the lazy dog. ".repeat(400))?
        .into_iter()
        .take(1024)
        .collect();
    let body = serde_json::json!({"prompt": long_prompt, "max_tokens": 128, "n": 4, "temperature": 1.0});
    let done = Arc::new(AtomicBool::new(false));
    let long = {
        let (address, done) = (address.to_string(), done.clone());
        std::thread::spawn(move || -> anyhow::Result<usize> {
            let mut sent = 0;
            while !done.load(Ordering::Relaxed) {
                post(&address, "/v1/completions", &body)?;
                sent += 1;
            }
            Ok(sent)
        })
    };
    // Let the first long request reach the engine.
    std::thread::sleep(Duration::from_millis(500));
    let latencies = short_latencies(address);
    done.store(true, Ordering::Relaxed);
    let sent = long
        .join()
        .map_err(|_| anyhow::anyhow!("the long-request client panicked"))??;
    println!("{sent} long requests ran beside {SHORT} short ones");
    latencies
}

/// The `q` quantile (0.5: median, 1: worst) of `seconds`.
fn percentile(seconds: &[f64], q: f64) -> f64 {
    let mut sorted = seconds.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
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
