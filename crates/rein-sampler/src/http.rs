//! [`HttpGenerator`]: completions from inference servers (SGLang, vLLM, `rein serve`) over
//! their HTTP APIs, token ids both ways, the policy synced through files.
//!
//! Each prompt is one request (`n` samples, the prompt's own seed), spread over the servers
//! that still answer; the servers batch concurrent requests themselves. A request that fails
//! (connection refused, timeout, 5xx) is retried with exponential backoff; a server that fails
//! every retry is dropped, named in the log, and its requests go to the others. With none left
//! the generator returns [`GeneratorError::NoServers`] naming them all.
//!
//! Weight sync: [`Generator::update`] writes the policy (the merged model, or only its LoRA
//! adapter) atomically under `weights_dir/v<version>` and asks every server to load it
//! (SGLang's `/update_weights_from_disk`, which `rein serve` implements; vLLM's LoRA
//! endpoints). The servers report the version they sample from and a mismatch is an error.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rein_model::Backend;
use rein_model::lm::{CausalLm, save};
use serde_json::{Value, json};

pub use rein_core::ServerApi;

use crate::generate::Generation;
use crate::generator::{Generator, GeneratorError};
use crate::session::prompt_seed;
use crate::token_choice::{FinishReason, GenerationConfig};

/// How to reach the servers and how to hand them the policy.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Base URLs (`http://host:port`).
    pub urls: Vec<String>,
    /// Their API.
    pub api: ServerApi,
    /// The model name the servers know the policy by (vLLM's `model` field).
    pub model: String,
    /// How long one request may take.
    pub timeout: Duration,
    /// Retries of a failing request on the same server before it is dropped.
    pub retries: u32,
    /// The first retry's wait (doubled for each later one).
    pub backoff: Duration,
    /// Where policy versions are written for the servers to read.
    pub weights_dir: PathBuf,
    /// Sync only the LoRA adapter (PEFT format) instead of the merged model.
    pub adapter_only: bool,
    /// Policy versions kept on disk (older ones are deleted once every server moved on).
    pub keep_versions: usize,
}

/// Completions from inference servers; see the module docs.
pub struct HttpGenerator<B: Backend> {
    settings: HttpSettings,
    alive: Vec<bool>,
    agent: ureq::Agent,
    version: u64,
    written: VecDeque<PathBuf>,
    _backend: PhantomData<fn() -> B>,
}

/// Why one request failed.
enum Failure {
    /// The server may be gone: retry, then drop it.
    Unreachable(String),
    /// The server answered something unusable: stop.
    Bad(String),
}

impl<B: Backend> HttpGenerator<B> {
    /// A client for `settings.urls`, which are assumed to hold version 0 of the policy.
    pub fn new(settings: HttpSettings) -> Self {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(5).min(settings.timeout))
            .timeout(settings.timeout)
            .build();
        Self {
            alive: vec![true; settings.urls.len()],
            settings,
            agent,
            version: 0,
            written: VecDeque::new(),
            _backend: PhantomData,
        }
    }

    /// The servers still answering.
    pub fn live_urls(&self) -> Vec<&str> {
        (self.settings.urls.iter().zip(&self.alive))
            .filter(|(_, a)| **a)
            .map(|(u, _)| u.as_str())
            .collect()
    }

    /// Waits until every server answers its health check, for at most `timeout`.
    pub fn wait_ready(&self, timeout: Duration) -> Result<(), GeneratorError> {
        let started = std::time::Instant::now();
        for url in &self.settings.urls {
            loop {
                match self.agent.get(&format!("{url}/health")).call() {
                    Ok(_) => break,
                    Err(e) if started.elapsed() >= timeout => {
                        return Err(GeneratorError::NoServers {
                            urls: vec![url.clone()],
                            last: format!("not ready after {:.0} s: {e}", timeout.as_secs_f64()),
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        }
        Ok(())
    }

    fn post(&self, url: &str, path: &str, body: &Value) -> Result<Value, Failure> {
        match self.agent.post(&format!("{url}{path}")).send_json(body) {
            // vLLM's adapter endpoints answer success in plain text, not JSON: such a body is kept
            // as a string, and a generation endpoint that sends one fails where its fields are read.
            Ok(response) => {
                let text = response
                    .into_string()
                    .map_err(|e| Failure::Unreachable(format!("{path}: reading the answer: {e}")))?;
                Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)))
            }
            Err(ureq::Error::Status(code, response)) => {
                let text = response.into_string().unwrap_or_default();
                let message = format!(
                    "{path} answered HTTP {code}: {}",
                    text.chars().take(300).collect::<String>()
                );
                match code >= 500 {
                    true => Err(Failure::Unreachable(message)),
                    false => Err(Failure::Bad(message)),
                }
            }
            Err(ureq::Error::Transport(t)) => Err(Failure::Unreachable(format!("{path}: {t}"))),
        }
    }

    /// `post` retried with backoff while the server seems unreachable.
    fn post_retrying(&self, url: &str, path: &str, body: &Value) -> Result<Value, Failure> {
        let mut wait = self.settings.backoff;
        let mut attempt = 0;
        loop {
            match self.post(url, path, body) {
                Err(Failure::Unreachable(_)) if attempt < self.settings.retries => {
                    std::thread::sleep(wait);
                    wait *= 2;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    fn request(&self, prompt: &[u32], seed: u64, config: &GenerationConfig, stops: &[String]) -> (String, Value) {
        let n = config.n.max(1);
        match self.settings.api {
            ServerApi::Sglang => {
                let mut params = json!({
                    "max_new_tokens": config.max_new_tokens,
                    "temperature": config.temperature,
                    "n": n,
                    "stop": stops,
                    "stop_token_ids": config.stop_token_ids,
                    "sampling_seed": seed,
                    "skip_special_tokens": false,
                    "no_stop_trim": true,
                });
                put_filters(&mut params, config);
                let body = json!({
                    "input_ids": prompt,
                    "sampling_params": params,
                    "return_logprob": true,
                    "logprob_start_len": -1,
                });
                ("/generate".into(), body)
            }
            ServerApi::Vllm => {
                let mut body = json!({
                    "model": self.settings.model,
                    "prompt": prompt,
                    "max_tokens": config.max_new_tokens,
                    "temperature": config.temperature,
                    "n": n,
                    "stop": stops,
                    "stop_token_ids": config.stop_token_ids,
                    "seed": seed,
                    "logprobs": 0,
                    "return_token_ids": true,
                    "skip_special_tokens": false,
                    "include_stop_str_in_output": true,
                });
                put_filters(&mut body, config);
                ("/v1/completions".into(), body)
            }
        }
    }

    /// The `n` samples of one answer, with the policy version the server reports.
    fn parse(&self, answer: &Value, config: &GenerationConfig) -> Result<(Vec<Sample>, Option<String>), String> {
        let n = config.n.max(1);
        let samples = match self.settings.api {
            ServerApi::Sglang => {
                let outputs: Vec<&Value> = match answer {
                    Value::Array(items) => items.iter().collect(),
                    single => vec![single],
                };
                let version = (outputs.first())
                    .and_then(|o| o["meta_info"]["weight_version"].as_str())
                    .map(str::to_string);
                let samples = outputs
                    .iter()
                    .map(|o| parse_sglang(o, config))
                    .collect::<Result<Vec<_>, _>>()?;
                return check_count(samples, n).map(|s| (s, version));
            }
            ServerApi::Vllm => {
                let choices = answer["choices"].as_array().ok_or("no `choices` in the answer")?;
                let mut indexed: Vec<(u64, &Value)> =
                    choices.iter().map(|c| (c["index"].as_u64().unwrap_or(0), c)).collect();
                indexed.sort_by_key(|(i, _)| *i);
                (indexed.into_iter())
                    .map(|(_, c)| parse_vllm(c, config))
                    .collect::<Result<Vec<_>, _>>()?
            }
        };
        check_count(samples, n).map(|s| (s, None))
    }

    fn mark_dead(&mut self, index: usize, why: &str) {
        if std::mem::replace(&mut self.alive[index], false) {
            let left = self.alive.iter().filter(|a| **a).count();
            eprintln!(
                "inference server {} stopped answering ({why}); dropped, {left} left",
                self.settings.urls[index]
            );
        }
    }

    fn no_servers(&self, last: String) -> GeneratorError {
        GeneratorError::NoServers {
            urls: self.settings.urls.clone(),
            last,
        }
    }

    /// Writes version `version` of `policy` where the servers can read it; returns the directory.
    fn write_policy(&mut self, policy: &CausalLm<B>, version: u64) -> Result<PathBuf, GeneratorError> {
        let root = &self.settings.weights_dir;
        let failed = |path: &Path, reason: String| GeneratorError::Weights {
            path: path.display().to_string(),
            reason,
        };
        std::fs::create_dir_all(root).map_err(|e| failed(root, e.to_string()))?;
        let root = root.canonicalize().map_err(|e| failed(root, e.to_string()))?;
        let dir = root.join(format!("v{version:06}"));
        let partial = root.join(format!(".v{version:06}.partial"));
        let _ = std::fs::remove_dir_all(&partial);
        let written = match self.settings.adapter_only {
            true => rein_model::lm::peft::save_adapter(policy, &partial, "rein-policy"),
            false => save(policy, &partial),
        };
        written.map_err(|e| failed(&partial, e.to_string()))?;
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&partial, &dir).map_err(|e| failed(&dir, e.to_string()))?;
        Ok(dir)
    }

    /// Asks every live server to sample from the policy in `dir` from now on.
    fn load_everywhere(&mut self, dir: &Path, version: u64) -> Result<(), GeneratorError> {
        let path = dir.display().to_string();
        let mut last = String::new();
        for i in 0..self.settings.urls.len() {
            if !self.alive[i] {
                continue;
            }
            let url = self.settings.urls[i].clone();
            let calls: Vec<(&str, Value)> = match self.settings.api {
                ServerApi::Sglang => vec![(
                    "/update_weights_from_disk",
                    json!({"model_path": path, "weight_version": version.to_string()}),
                )],
                ServerApi::Vllm => vec![
                    ("/v1/unload_lora_adapter", json!({"lora_name": self.settings.model})),
                    (
                        "/v1/load_lora_adapter",
                        json!({"lora_name": self.settings.model, "lora_path": path}),
                    ),
                ],
            };
            for (k, (endpoint, body)) in calls.iter().enumerate() {
                match self.post_retrying(&url, endpoint, body) {
                    Ok(answer) => {
                        if answer.get("success").and_then(Value::as_bool) == Some(false) {
                            let message = answer["message"].as_str().unwrap_or("no message");
                            return Err(GeneratorError::BadResponse {
                                url,
                                message: format!("{endpoint} refused {path}: {message}"),
                            });
                        }
                    }
                    // vLLM refuses to unload an adapter it does not have yet.
                    Err(Failure::Bad(_)) if self.settings.api == ServerApi::Vllm && k == 0 => {}
                    Err(Failure::Bad(message)) => return Err(GeneratorError::BadResponse { url, message }),
                    Err(Failure::Unreachable(why)) => {
                        self.mark_dead(i, &why);
                        last = why;
                        break;
                    }
                }
            }
        }
        match self.alive.contains(&true) {
            true => Ok(()),
            false => Err(self.no_servers(last)),
        }
    }
}

/// One sample as a server returned it.
struct Sample {
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    finish: FinishReason,
}

fn put_filters(params: &mut Value, config: &GenerationConfig) {
    if let Some(k) = config.top_k {
        params["top_k"] = json!(k);
    }
    if let Some(p) = config.top_p {
        params["top_p"] = json!(p);
    }
    if let Some(p) = config.min_p {
        params["min_p"] = json!(p);
    }
}

fn check_count(samples: Vec<Sample>, n: usize) -> Result<Vec<Sample>, String> {
    match samples.len() == n {
        true => Ok(samples),
        false => Err(format!("asked for {n} samples, got {}", samples.len())),
    }
}

fn finish_reason(kind: &str, matched_token: bool, tokens: &[u32], config: &GenerationConfig) -> FinishReason {
    match kind {
        "length" => FinishReason::Length,
        _ if matched_token || tokens.last().is_some_and(|t| config.stop_token_ids.contains(t)) => {
            FinishReason::StopToken
        }
        _ => FinishReason::StopCondition,
    }
}

fn ids(value: &Value, what: &str) -> Result<Vec<u32>, String> {
    let items = value.as_array().ok_or_else(|| format!("no `{what}` in the answer"))?;
    (items.iter())
        .map(|v| v.as_u64().and_then(|x| u32::try_from(x).ok()))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| format!("`{what}` holds something other than token ids"))
}

fn parse_sglang(output: &Value, config: &GenerationConfig) -> Result<Sample, String> {
    let tokens = ids(&output["output_ids"], "output_ids")?;
    let meta = &output["meta_info"];
    let entries = meta["output_token_logprobs"]
        .as_array()
        .ok_or("no `meta_info.output_token_logprobs` in the answer (was return_logprob ignored?)")?;
    let logprobs = (entries.iter())
        .map(|e| e[0].as_f64().map(|x| x as f32))
        .collect::<Option<Vec<_>>>()
        .ok_or("`output_token_logprobs` entries are not [logprob, id, text]")?;
    if logprobs.len() != tokens.len() {
        return Err(format!(
            "{} output ids but {} log-probabilities",
            tokens.len(),
            logprobs.len()
        ));
    }
    let reason = &meta["finish_reason"];
    let kind = reason["type"].as_str().or(reason.as_str()).unwrap_or("stop");
    if kind == "abort" {
        return Err(format!("the request was aborted: {reason}"));
    }
    let finish = finish_reason(kind, reason["matched"].is_u64(), &tokens, config);
    Ok(Sample {
        tokens,
        logprobs,
        finish,
    })
}

fn parse_vllm(choice: &Value, config: &GenerationConfig) -> Result<Sample, String> {
    let tokens = ids(&choice["token_ids"], "choices[].token_ids (needs vLLM ≥ 0.10.2)")?;
    let logprobs = choice["logprobs"]["token_logprobs"]
        .as_array()
        .ok_or("no `choices[].logprobs.token_logprobs` in the answer")?
        .iter()
        .map(|v| v.as_f64().map(|x| x as f32))
        .collect::<Option<Vec<_>>>()
        .ok_or("`token_logprobs` holds something other than numbers")?;
    if logprobs.len() != tokens.len() {
        return Err(format!(
            "{} token ids but {} log-probabilities",
            tokens.len(),
            logprobs.len()
        ));
    }
    let kind = choice["finish_reason"].as_str().unwrap_or("stop");
    let finish = finish_reason(kind, choice["stop_reason"].is_u64(), &tokens, config);
    Ok(Sample {
        tokens,
        logprobs,
        finish,
    })
}

impl<B: Backend> Generator<B> for HttpGenerator<B> {
    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        config: &GenerationConfig,
        stops: &[String],
    ) -> Result<Vec<Generation>, GeneratorError> {
        let n = config.n.max(1);
        let queue: Mutex<VecDeque<usize>> = Mutex::new((0..prompts.len()).collect());
        let answers: Mutex<Vec<Option<Vec<Sample>>>> = Mutex::new((0..prompts.len()).map(|_| None).collect());
        let dead: Mutex<Vec<(usize, String)>> = Mutex::new(Vec::new());
        let bad: Mutex<Option<GeneratorError>> = Mutex::new(None);
        let turn = AtomicUsize::new(0);
        let alive = Mutex::new(self.alive.clone());
        let expected = self.version.to_string();
        let this = &*self;
        std::thread::scope(|scope| {
            for _ in 0..prompts.len().min(256) {
                scope.spawn(|| {
                    loop {
                        if bad.lock().unwrap().is_some() {
                            return;
                        }
                        let Some(p) = queue.lock().unwrap().pop_front() else {
                            return;
                        };
                        let live: Vec<usize> = (alive.lock().unwrap().iter().enumerate())
                            .filter(|(_, a)| **a)
                            .map(|(i, _)| i)
                            .collect();
                        if live.is_empty() {
                            return;
                        }
                        let server = live[turn.fetch_add(1, Ordering::Relaxed) % live.len()];
                        let url = &this.settings.urls[server];
                        let (path, body) = this.request(&prompts[p], prompt_seed(config.seed, p), config, stops);
                        let failed = |message: String| {
                            *bad.lock().unwrap() = Some(GeneratorError::BadResponse {
                                url: url.clone(),
                                message,
                            });
                        };
                        match this.post_retrying(url, &path, &body) {
                            Ok(answer) => match this.parse(&answer, config) {
                                Ok((_, Some(v))) if this.settings.api == ServerApi::Sglang && v != expected => {
                                    failed(format!("sampled with policy version {v}, expected {expected}"));
                                }
                                Ok((samples, _)) => answers.lock().unwrap()[p] = Some(samples),
                                Err(message) => failed(format!("{path}: {message}")),
                            },
                            Err(Failure::Bad(message)) => failed(message),
                            Err(Failure::Unreachable(why)) => {
                                alive.lock().unwrap()[server] = false;
                                dead.lock().unwrap().push((server, why));
                                queue.lock().unwrap().push_back(p);
                            }
                        }
                    }
                });
            }
        });
        let mut last = String::new();
        for (server, why) in dead.into_inner().unwrap() {
            self.mark_dead(server, &why);
            last = why;
        }
        if let Some(error) = bad.into_inner().unwrap() {
            return Err(error);
        }
        let answers = answers.into_inner().unwrap();
        if answers.iter().any(Option::is_none) {
            return Err(self.no_servers(last));
        }
        Ok((answers.into_iter().flatten().enumerate())
            .flat_map(|(p, samples)| {
                samples.into_iter().enumerate().map(move |(s, x)| Generation {
                    prompt: p,
                    sample: s,
                    tokens: x.tokens,
                    logprobs: x.logprobs,
                    finish: x.finish,
                })
            })
            .take(prompts.len() * n)
            .collect())
    }

    fn update(&mut self, policy: &CausalLm<B>, version: u64) -> Result<(), GeneratorError> {
        let dir = self.write_policy(policy, version)?;
        self.load_everywhere(&dir, version)?;
        self.version = version;
        self.written.push_back(dir);
        while self.written.len() > self.settings.keep_versions.max(1) {
            if let Some(old) = self.written.pop_front() {
                let _ = std::fs::remove_dir_all(old);
            }
        }
        Ok(())
    }

    fn version(&self) -> u64 {
        self.version
    }

    fn describe(&self) -> String {
        format!("http ({})", self.live_urls().join(", "))
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    use super::*;

    type B = rein_model::Cpu;

    /// A server that answers every request `200 OK` with `body` as plain text, recording the
    /// request lines it saw.
    fn plain_text_server(body: &'static str) -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(stream);
                let (mut first, mut length) = (String::new(), 0usize);
                reader.read_line(&mut first).unwrap();
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap();
                    }
                    if line.trim().is_empty() {
                        break;
                    }
                }
                let mut request_body = vec![0; length];
                reader.read_exact(&mut request_body).unwrap();
                log.lock().unwrap().push(first.trim().to_string());
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                reader.get_mut().write_all(answer.as_bytes()).unwrap();
            }
        });
        (url, seen)
    }

    fn settings(url: String, api: ServerApi) -> HttpSettings {
        HttpSettings {
            urls: vec![url],
            api,
            model: "policy".into(),
            timeout: Duration::from_secs(5),
            retries: 0,
            backoff: Duration::from_millis(1),
            weights_dir: std::env::temp_dir(),
            adapter_only: true,
            keep_versions: 2,
        }
    }

    #[test]
    fn vllm_adapter_endpoints_answering_plain_text_succeed() {
        let (url, seen) = plain_text_server("Success: LoRA adapter 'policy' added successfully.");
        let mut generator = HttpGenerator::<B>::new(settings(url, ServerApi::Vllm));
        generator.load_everywhere(Path::new("/weights/v000001"), 1).unwrap();
        assert_eq!(generator.live_urls().len(), 1);
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "POST /v1/unload_lora_adapter HTTP/1.1",
                "POST /v1/load_lora_adapter HTTP/1.1"
            ]
        );
    }

    #[test]
    fn a_plain_text_answer_to_a_generation_request_is_a_bad_response() {
        let (url, _) = plain_text_server("hello");
        let generator = HttpGenerator::<B>::new(settings(url.clone(), ServerApi::Sglang));
        let Ok(answer) = generator.post(&url, "/generate", &json!({})) else {
            panic!("post failed")
        };
        assert_eq!(answer, Value::String("hello".into()));
        let config = GenerationConfig::default();
        let failure = generator.parse(&answer, &config).err().unwrap();
        assert!(failure.contains("answer"), "{failure}");
    }
}
