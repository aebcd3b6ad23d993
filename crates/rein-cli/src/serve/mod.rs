//! `rein serve`: an inference server over the native sampler.
//!
//! OpenAI-compatible `/v1/completions` and `/v1/chat/completions` (with vLLM's token-id
//! extensions: token-id prompts, `return_token_ids`), SGLang's native `/generate` with
//! `input_ids` and `/update_weights_from_disk`, plus `/health`, `/v1/models` and
//! `/get_model_info`. Concurrent requests are batched by the [`engine`]. It is the reference
//! server for `backend = "http"` runs and serves any trained checkpoint to OpenAI clients.

mod api;
mod engine;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use rein_model::lm::{LmTokenizer, load};
use serde_json::{Value, json};
use tiny_http::{Header, Method, Request, Response, Server};

use api::{Api, BadRequest};
use engine::Engine;

#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// Checkpoint directory, `.gguf` file, or the name of a model fetched with
    /// `cargo xtask model NAME`.
    #[arg(long)]
    model: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// The model's name in the API (default: the directory's name).
    #[arg(long)]
    served_model_name: Option<String>,
    /// A batch gathers requests until none arrived for this many milliseconds (at most ten
    /// times as long).
    #[arg(long, default_value_t = 50)]
    batch_window_ms: u64,
    /// HTTP worker threads (requests handled at once; the engine batches them).
    #[arg(long, default_value_t = 128)]
    workers: usize,
}

impl ServeArgs {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        let device = Default::default();
        let model = load::<rein_model::Cpu>(&self.model, &device)
            .with_context(|| format!("loading {}", self.model.display()))?;
        let tokenizer = LmTokenizer::load(&self.model, &model.config().eos_ids())?;
        let name = self.served_model_name.clone().unwrap_or_else(|| {
            let path = self.model.canonicalize().unwrap_or(self.model.clone());
            path.file_name()
                .map_or("rein".into(), |n| n.to_string_lossy().into_owned())
        });
        let server = Server::http((self.host.as_str(), self.port))
            .map_err(|e| anyhow::anyhow!("cannot listen on {}:{}: {e}", self.host, self.port))?;
        let address = server.server_addr().to_ip().map(|a| a.to_string()).unwrap_or_default();
        let engine = Engine::start(model, tokenizer.clone(), Duration::from_millis(self.batch_window_ms));
        let state = Arc::new(State {
            engine,
            tokenizer,
            name,
            model_path: self.model.display().to_string(),
            seeds: AtomicU64::new(seed_from_clock()),
        });
        let server = Arc::new(server);
        eprintln!("rein serve: {} on http://{address}", state.model_path);
        let workers: Vec<_> = (0..self.workers.max(1))
            .map(|_| {
                let (server, state) = (server.clone(), state.clone());
                std::thread::spawn(move || {
                    while let Ok(request) = server.recv() {
                        state.handle(request);
                    }
                })
            })
            .collect();
        for worker in workers {
            let _ = worker.join();
        }
        Ok(())
    }
}

struct State {
    engine: Engine,
    tokenizer: LmTokenizer,
    name: String,
    model_path: String,
    seeds: AtomicU64,
}

/// An answer: status and JSON body.
type Answer = (u16, Value);

fn error(status: u16, message: impl Into<String>) -> Answer {
    let message = message.into();
    (
        status,
        json!({"error": {"message": message, "type": "invalid_request_error", "code": status}}),
    )
}

impl State {
    fn handle(&self, mut request: Request) {
        let mut body = String::new();
        let (status, value) = match request.as_reader().read_to_string(&mut body) {
            Err(e) => error(400, format!("cannot read the request body: {e}")),
            Ok(_) => self.route(request.method(), request.url(), &body),
        };
        let content_type = Header::from_bytes("Content-Type", "application/json").expect("a valid header");
        let response = Response::from_string(value.to_string())
            .with_status_code(status)
            .with_header(content_type);
        let _ = request.respond(response);
    }

    fn route(&self, method: &Method, url: &str, body: &str) -> Answer {
        let path = url.split('?').next().unwrap_or(url);
        match (method, path) {
            (Method::Get, "/health" | "/health_generate") => (200, json!({})),
            (Method::Get, "/v1/models") => (
                200,
                json!({"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": "rein"}]}),
            ),
            (Method::Get, "/get_model_info" | "/model_info") => (
                200,
                json!({"model_path": self.model_path, "is_generation": true, "served_model_name": self.name}),
            ),
            (Method::Post, "/generate" | "/v1/completions" | "/v1/chat/completions" | "/update_weights_from_disk") => {
                match serde_json::from_str::<Value>(body) {
                    Ok(body) => self.post(path, &body),
                    Err(e) => error(400, format!("the body is not JSON: {e}")),
                }
            }
            (_, "/generate" | "/v1/completions" | "/v1/chat/completions" | "/update_weights_from_disk") => {
                error(405, format!("{path} takes POST"))
            }
            _ => error(404, format!("no endpoint {path}")),
        }
    }

    fn post(&self, path: &str, body: &Value) -> Answer {
        let fresh_seed = || self.seeds.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
        let api = Api {
            tokenizer: &self.tokenizer,
            model_name: &self.name,
            fresh_seed: &fresh_seed,
        };
        let gone = || error(503, "the engine stopped");
        let answer = match path {
            "/generate" => api.sglang_request(body).map(|(work, batched)| {
                let logprobs = body["return_logprob"].as_bool() == Some(true);
                match self.engine.generate(work.clone()) {
                    Some(done) => (200, api.sglang_response(&work, &done, batched, logprobs)),
                    None => gone(),
                }
            }),
            "/v1/completions" => api
                .completion_request(body)
                .map(|work| match self.engine.generate(work.clone()) {
                    Some(done) => (200, api.completion_response(body, &work, &done)),
                    None => gone(),
                }),
            "/v1/chat/completions" => api
                .chat_request(body)
                .map(|work| match self.engine.generate(work.clone()) {
                    Some(done) => (200, api.chat_response(body, &work, &done)),
                    None => gone(),
                }),
            _ => Ok(self.update_weights(body)),
        };
        answer.unwrap_or_else(|BadRequest(message)| error(400, message))
    }

    /// SGLang's `/update_weights_from_disk`: `model_path` (a checkpoint or a LoRA adapter
    /// directory), optional `weight_version`.
    fn update_weights(&self, body: &Value) -> Answer {
        let Some(path) = body["model_path"].as_str() else {
            return (400, json!({"success": false, "message": "give `model_path`"}));
        };
        let version = match &body["weight_version"] {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        };
        match self.engine.reload(PathBuf::from(path), version) {
            Ok(version) => (
                200,
                json!({"success": true, "message": format!("loaded {path}"), "weight_version": version, "num_paused_requests": 0}),
            ),
            Err(message) => (400, json!({"success": false, "message": message})),
        }
    }
}

fn seed_from_clock() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
