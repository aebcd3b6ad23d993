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

use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, save};
use serde::Serialize;

pub use rein_core::ServerApi;

use crate::batch_decode::Generation;
use crate::generator::{Generator, GeneratorError};
use crate::protocol::{
    CompletionChoice, CompletionRequest, CompletionResponse, GenerateOutput, GenerateRequest, GenerateResponse,
    LoadLoraRequest, Matched, Prompts, SamplingParams, SamplingParamsField, SglangFinish, Stop, StopReason,
    UnloadLoraRequest, UpdateWeightsRequest, UpdateWeightsResponse, parse,
};
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
pub struct HttpGenerator<B: ReinBackend> {
    settings: HttpSettings,
    alive: Vec<bool>,
    agent: ureq::Agent,
    version: u64,
    written: VecDeque<PathBuf>,
    _backend: PhantomData<fn() -> B>,
}

/// Why one request failed.
pub(crate) enum Failure {
    /// The server may be gone: retry, then drop it.
    Unreachable(String),
    /// The server answered something unusable: stop.
    Bad(String),
}

/// One model on an inference server that scores for a trainer (a reward model, a process
/// reward model): its address, its name there (none: the server's only model) and a client
/// whose requests may each take `timeout`.
pub(crate) struct ServedModel {
    pub(crate) url: String,
    pub(crate) model: Option<String>,
    agent: ureq::Agent,
}

impl ServedModel {
    pub(crate) fn new(url: &str, model: Option<&str>, timeout: Duration) -> Self {
        Self {
            url: url.trim_end_matches('/').to_string(),
            model: model.map(str::to_string),
            agent: ureq::AgentBuilder::new()
                .timeout_connect(Duration::from_secs(5).min(timeout))
                .timeout(timeout)
                .build(),
        }
    }

    /// POSTs `body` as JSON to `path` on the server ([`post_json`]).
    pub(crate) fn post(&self, path: &str, body: &impl Serialize) -> Result<String, Failure> {
        post_json(self.agent.post(&format!("{}{path}", self.url)), path, body)
    }
}

/// A served model's answers put back in input order: `items` as (input index, answer) for `n`
/// inputs; an index past them or an input without an answer is an error naming `url`.
pub(crate) fn in_input_order<T>(
    url: &str,
    n: usize,
    items: impl IntoIterator<Item = (usize, T)>,
) -> Result<Vec<T>, String> {
    let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
    for (index, answer) in items {
        let slot = (out.get_mut(index)).ok_or_else(|| format!("{url}: answered for input {index} of {n}"))?;
        *slot = Some(answer);
    }
    (out.into_iter().enumerate())
        .map(|(i, answer)| answer.ok_or_else(|| format!("{url}: no answer for input {i}")))
        .collect()
}

/// Sends `request` (a POST to `path` on some server) with `body` as JSON; returns the answer's
/// body. (vLLM's adapter endpoints answer in plain text, not JSON: what an answer must be is up
/// to its reader.) Errors name `path`; a 5xx or a transport error means the server may be gone.
pub(crate) fn post_json(request: ureq::Request, path: &str, body: &impl Serialize) -> Result<String, Failure> {
    match request.send_json(body) {
        Ok(response) => response
            .into_string()
            .map_err(|e| Failure::Unreachable(format!("{path}: reading the answer: {e}"))),
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

impl<B: ReinBackend> HttpGenerator<B> {
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

    fn post(&self, url: &str, path: &str, body: &impl Serialize) -> Result<String, Failure> {
        post_json(self.agent.post(&format!("{url}{path}")), path, body)
    }

    /// `post` retried with backoff while the server seems unreachable.
    fn post_retrying(&self, url: &str, path: &str, body: &impl Serialize) -> Result<String, Failure> {
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

    /// The request for `n` samples of one prompt: its endpoint and body.
    fn request(&self, prompt: &[u32], seed: u64, config: &GenerationConfig, stops: &[String]) -> Request {
        let n = config.n.max(1) as u64;
        let max_new_tokens = Some(config.max_new_tokens as u64);
        let top_k = config.top_k.map(|k| k as i64);
        let stop = Some(Stop::Many(stops.to_vec()));
        let stop_token_ids = Some(config.stop_token_ids.clone());
        match self.settings.api {
            ServerApi::Sglang => Request::Sglang(Box::new(GenerateRequest {
                input_ids: Some(Prompts::Ids(prompt.to_vec())),
                sampling_params: Some(SamplingParamsField::One(SamplingParams {
                    max_new_tokens,
                    temperature: Some(config.temperature),
                    top_k,
                    top_p: config.top_p,
                    min_p: config.min_p,
                    n: Some(n),
                    stop,
                    stop_token_ids,
                    sampling_seed: Some(seed),
                    skip_special_tokens: Some(false),
                    no_stop_trim: Some(true),
                })),
                return_logprob: Some(true),
                logprob_start_len: Some(-1),
                ..GenerateRequest::default()
            })),
            ServerApi::Vllm => Request::Vllm(Box::new(CompletionRequest {
                model: Some(self.settings.model.clone()),
                prompt: Prompts::Ids(prompt.to_vec()),
                max_tokens: max_new_tokens,
                max_completion_tokens: None,
                temperature: Some(config.temperature),
                top_k,
                top_p: config.top_p,
                min_p: config.min_p,
                n: Some(n),
                stop,
                stop_token_ids,
                seed: Some(seed),
                logprobs: Some(0),
                return_token_ids: Some(true),
                skip_special_tokens: Some(false),
                include_stop_str_in_output: Some(true),
                echo: None,
                stream: None,
            })),
        }
    }

    /// The `n` samples of one answer, with the policy version the server reports.
    fn parse(&self, answer: &str, config: &GenerationConfig) -> Result<(Vec<Sample>, Option<String>), String> {
        let n = config.n.max(1);
        match self.settings.api {
            ServerApi::Sglang => {
                let outputs = parse::<GenerateResponse>(answer)
                    .map_err(|e| format!("not an SGLang /generate answer ({e})"))?
                    .outputs();
                let version = outputs.first().and_then(|o| o.meta_info.weight_version.clone());
                let samples = (outputs.into_iter())
                    .map(|o| sglang_sample(o, config))
                    .collect::<Result<Vec<_>, _>>()?;
                check_count(samples, n).map(|s| (s, version))
            }
            ServerApi::Vllm => {
                let mut answer = parse::<CompletionResponse>(answer)
                    .map_err(|e| format!("not an OpenAI completions answer ({e})"))?;
                answer.choices.sort_by_key(|c| c.index);
                let samples = (answer.choices.into_iter())
                    .map(|c| vllm_sample(c, config))
                    .collect::<Result<Vec<_>, _>>()?;
                check_count(samples, n).map(|s| (s, None))
            }
        }
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

    /// SGLang's (and rein serve's) `/update_weights_from_disk` of `path` as `version`.
    fn update_sglang(&self, url: &str, path: &str, version: u64) -> Result<(), Failure> {
        let endpoint = "/update_weights_from_disk";
        let request = UpdateWeightsRequest {
            model_path: path.into(),
            weight_version: Some(version.to_string()),
        };
        let answer = self.post_retrying(url, endpoint, &request)?;
        let answer = parse::<UpdateWeightsResponse>(&answer)
            .map_err(|e| Failure::Bad(format!("{endpoint}: not an update answer ({e})")))?;
        match answer.success {
            true => Ok(()),
            false => Err(Failure::Bad(format!("{endpoint} refused {path}: {}", answer.message))),
        }
    }

    /// vLLM: unloads the policy's LoRA adapter and loads the one in `path` under the same
    /// name. Both endpoints answer in plain text; vLLM refuses to unload an adapter it does not
    /// have yet, which is not an error here.
    fn swap_vllm_adapter(&self, url: &str, path: &str) -> Result<(), Failure> {
        let lora_name = self.settings.model.clone();
        let unload = UnloadLoraRequest {
            lora_name: lora_name.clone(),
        };
        match self.post_retrying(url, "/v1/unload_lora_adapter", &unload) {
            Ok(_) | Err(Failure::Bad(_)) => {}
            Err(unreachable) => return Err(unreachable),
        }
        let load = LoadLoraRequest {
            lora_name,
            lora_path: path.into(),
        };
        self.post_retrying(url, "/v1/load_lora_adapter", &load).map(drop)
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
            let loaded = match self.settings.api {
                ServerApi::Sglang => self.update_sglang(&url, &path, version),
                ServerApi::Vllm => self.swap_vllm_adapter(&url, &path),
            };
            match loaded {
                Ok(()) => {}
                Err(Failure::Bad(message)) => return Err(GeneratorError::BadResponse { url, message }),
                Err(Failure::Unreachable(why)) => {
                    self.mark_dead(i, &why);
                    last = why;
                }
            }
        }
        match self.alive.contains(&true) {
            true => Ok(()),
            false => Err(self.no_servers(last)),
        }
    }
}

/// A generation request, by API.
enum Request {
    Sglang(Box<GenerateRequest>),
    Vllm(Box<CompletionRequest>),
}

impl Request {
    fn path(&self) -> &'static str {
        match self {
            Self::Sglang(_) => "/generate",
            Self::Vllm(_) => "/v1/completions",
        }
    }
}

impl Serialize for Request {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Sglang(request) => request.serialize(serializer),
            Self::Vllm(request) => request.serialize(serializer),
        }
    }
}

/// One sample as a server returned it.
struct Sample {
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    finish: FinishReason,
}

fn check_count(samples: Vec<Sample>, n: usize) -> Result<Vec<Sample>, String> {
    match samples.len() == n {
        true => Ok(samples),
        false => Err(format!("asked for {n} samples, got {}", samples.len())),
    }
}

/// A sample that stopped before its length limit: on a stop token (the server says one
/// matched, or the sample ends with one) or on a stop string.
fn stop_finish(matched_token: bool, tokens: &[u32], config: &GenerationConfig) -> FinishReason {
    match matched_token || tokens.last().is_some_and(|t| config.stop_token_ids.contains(t)) {
        true => FinishReason::StopToken,
        false => FinishReason::StopCondition,
    }
}

fn sglang_sample(output: GenerateOutput, config: &GenerationConfig) -> Result<Sample, String> {
    let tokens = output.output_ids;
    let meta = output.meta_info;
    let entries = (meta.output_token_logprobs)
        .ok_or("no `meta_info.output_token_logprobs` in the answer (was return_logprob ignored?)")?;
    let logprobs = (entries.iter())
        .map(|e| e.0)
        .collect::<Option<Vec<_>>>()
        .ok_or("an `output_token_logprobs` entry has no log-probability")?;
    if logprobs.len() != tokens.len() {
        return Err(format!(
            "{} output ids but {} log-probabilities",
            tokens.len(),
            logprobs.len()
        ));
    }
    let finish = match meta.finish_reason {
        Some(SglangFinish::Length { .. }) => FinishReason::Length,
        Some(SglangFinish::Abort { message }) => {
            return Err(format!("the request was aborted: {}", message.unwrap_or_default()));
        }
        Some(SglangFinish::Stop { matched }) => {
            stop_finish(matches!(matched, Some(Matched::Token(_))), &tokens, config)
        }
        None => stop_finish(false, &tokens, config),
    };
    Ok(Sample {
        tokens,
        logprobs,
        finish,
    })
}

fn vllm_sample(choice: CompletionChoice, config: &GenerationConfig) -> Result<Sample, String> {
    let tokens = choice
        .token_ids
        .ok_or("no `choices[].token_ids` in the answer (needs vLLM ≥ 0.10.2)")?;
    let logprobs = (choice.logprobs)
        .ok_or("no `choices[].logprobs` in the answer")?
        .token_logprobs
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or("`token_logprobs` holds a null")?;
    if logprobs.len() != tokens.len() {
        return Err(format!(
            "{} token ids but {} log-probabilities",
            tokens.len(),
            logprobs.len()
        ));
    }
    let finish = match choice.finish_reason.as_deref() {
        Some("length") => FinishReason::Length,
        _ => stop_finish(
            matches!(choice.stop_reason, Some(StopReason::Token(_))),
            &tokens,
            config,
        ),
    };
    Ok(Sample {
        tokens,
        logprobs,
        finish,
    })
}

impl<B: ReinBackend> Generator<B> for HttpGenerator<B> {
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
                        let request = this.request(&prompts[p], prompt_seed(config.seed, p), config, stops);
                        let path = request.path();
                        let failed = |message: String| {
                            *bad.lock().unwrap() = Some(GeneratorError::BadResponse {
                                url: url.clone(),
                                message,
                            });
                        };
                        match this.post_retrying(url, path, &request) {
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
                    top_logprobs: Vec::new(),
                    certainty: Vec::new(),
                    finish: x.finish,
                    routes: None,
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
mod tests;
