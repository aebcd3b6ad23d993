//! `rein serve`: an inference server over the native sampler.
//!
//! OpenAI-compatible `/v1/completions` and `/v1/chat/completions` (with vLLM's token-id
//! extensions: token-id prompts, `return_token_ids`), SGLang's native `/generate` with
//! `input_ids` and `/update_weights_from_disk`, plus `/health`, `/v1/models` and
//! `/get_model_info`. Concurrent requests are batched by the [`engine`]. It is the reference
//! server for `backend = "http"` runs and serves any trained checkpoint to OpenAI clients.
//!
//! A vision-language model's chat requests may hold images as OpenAI `image_url` parts
//! ([`images`]: `data:` URLs, `file://` under `--allowed-local-media-path`, no network fetches).
//!
//! A sequence classifier (a reward model) is served through the classification API instead
//! ([`classify`]), and a token classifier (a process reward model) through vLLM's pooling API
//! ([`pooling`]).
//!
//! Every size a client controls is bounded before it is used: the body (`--max-body-bytes`, read
//! by the [`http`] front within `--read-timeout`), a request's context (prompt and new tokens
//! within `--max-model-len`), its sequences (`--max-num-seqs`) and its stop strings; a request
//! past one is answered 4xx naming the limit, and one that still fails in the engine is answered
//! 500 while the server goes on.

mod api;
mod classify;
mod engine;
mod http;
mod images;
mod limits;
mod pooling;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use hyper::Method;
use rein_core::{ModelDtype, SamplerPrecision};
use rein_model::lm::{LmTokenizer, SequenceClassifier, TokenClassifier, load};
use rein_model::vision::{ImageLimits, ImageProcessor, ImageSide};
use rein_sampler::protocol::{
    ChatRequest, CompletionRequest, ErrorBody, ErrorResponse, GenerateRequest, UpdateWeightsRequest,
    UpdateWeightsResponse, parse,
};
use serde::Serialize;
use serde_json::{Value, json};

use api::{Api, BadRequest};
use engine::{Done, Engine, Work};
use http::HttpLimits;
use limits::RequestLimits;

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
    /// Requests answered at once (threads that parse, tokenize and wait on the engine, which
    /// batches them).
    #[arg(long, default_value_t = 128)]
    workers: usize,
    /// Most tokens of a request's prompt and completion together (vLLM's `--max-model-len`;
    /// default: the model's `max_position_embeddings`, which is also the most it may be).
    #[arg(long)]
    max_model_len: Option<usize>,
    /// Most sequences one request may ask for: prompts × `n` (a classifier's inputs); also the
    /// most the batches in flight decode together (vLLM's `--max-num-seqs`).
    #[arg(long, default_value_t = 256)]
    max_num_seqs: usize,
    /// Largest request body in bytes (413 past it).
    #[arg(long, default_value_t = 16 * 1024 * 1024)]
    max_body_bytes: usize,
    /// Seconds a client may take to send a request's head, and then its body; also how long an
    /// idle kept-alive connection stays open.
    #[arg(long, default_value_t = 30.0)]
    read_timeout: f64,
    /// Connections open at once (more wait in the listen queue).
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Most stop strings in one request.
    #[arg(long, default_value_t = 64)]
    max_stop_strings: usize,
    /// Most bytes of a request's stop strings together.
    #[arg(long, default_value_t = 16 * 1024)]
    max_stop_bytes: usize,
    /// Most bytes of keys and values the sequences in flight may hold (a request that needs more
    /// is refused; a batch waits until it fits beside those in flight). Default: a quarter of
    /// the machine's memory.
    #[arg(long)]
    max_kv_cache_bytes: Option<u64>,
    /// Require `Authorization: Bearer KEY` on every endpoint but `/health` (default: the
    /// `REIN_API_KEY` variable, if set).
    #[arg(long)]
    api_key: Option<String>,
    /// `/update_weights_from_disk` loads only checkpoints and adapters inside this directory.
    #[arg(long)]
    weights_dir: Option<PathBuf>,
    /// `exact`, or `q8`: a quantised model's products with its activations quantised to 8 bits
    /// per block, as llama.cpp does (faster, not exact; weights loaded later through
    /// `/update_weights_from_disk` are read exactly unless they keep the quantised codes).
    #[arg(long, default_value = "exact", value_parser = crate::generate::precision)]
    precision: SamplerPrecision,
    /// `f32`, or `bf16`: the decoder's linear layers multiply in bf16, as a model trained with
    /// `model.dtype = "bf16"` did (mixed precision); weights loaded later through
    /// `/update_weights_from_disk` too.
    #[arg(long, default_value = "f32", value_parser = crate::generate::dtype)]
    dtype: ModelDtype,
    /// A vision-language model reads `file://` image URLs inside this directory only (vLLM's
    /// flag); without it they are refused. `data:` URLs are always read; other URLs never are.
    #[arg(long)]
    allowed_local_media_path: Option<PathBuf>,
    /// Most images in one request to a vision-language model.
    #[arg(long, default_value_t = 8)]
    limit_images_per_prompt: usize,
    /// Most pixels of one image (width × height), checked before it is decoded.
    #[arg(long, default_value_t = 4096 * 4096)]
    max_image_pixels: u64,
    /// A token classifier (a process reward model) answers `/pooling` with the rows of this
    /// text's token only, one per step (vLLM's `STEP` pooling with its `step_tag_id`); it must
    /// be one token. Default: every token's row.
    #[arg(long)]
    step_tag: Option<String>,
}

impl ServeArgs {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        let device = Default::default();
        let loading = || format!("loading {}", self.model.display());
        let name = self.served_model_name.clone().unwrap_or_else(|| {
            let path = self.model.canonicalize().unwrap_or(self.model.clone());
            path.file_name()
                .map_or("rein".into(), |n| n.to_string_lossy().into_owned())
        });
        let weights_dir = (self.weights_dir.as_ref())
            .map(|dir| {
                dir.canonicalize()
                    .with_context(|| format!("--weights-dir {}", dir.display()))
            })
            .transpose()?;
        let token_classifier = TokenClassifier::<rein_model::Cpu>::is_token_classifier(&self.model);
        anyhow::ensure!(
            self.step_tag.is_none() || token_classifier,
            "--step-tag is for token classifiers (process reward models); {} is not one",
            self.model.display()
        );
        let handler: Arc<dyn Handler> = if token_classifier {
            self.token_classifier(name)?
        } else if SequenceClassifier::<rein_model::Cpu>::is_classifier(&self.model) {
            anyhow::ensure!(
                self.precision == SamplerPrecision::Exact && self.dtype == ModelDtype::F32,
                "--precision q8 and --dtype bf16 are for language models; {} is a sequence classifier",
                self.model.display()
            );
            let model = SequenceClassifier::load(&self.model, &device).with_context(loading)?;
            let tokenizer = LmTokenizer::load(&rein_model::lm::locate(&self.model)?, &[])?;
            let limits = self.input_limits(model.config())?;
            Arc::new(classify::Classifier::new(model, tokenizer, name, limits))
        } else {
            self.language_model(name, weights_dir)?
        };
        let listener = std::net::TcpListener::bind((self.host.as_str(), self.port))
            .with_context(|| format!("cannot listen on {}:{}", self.host, self.port))?;
        let address = listener.local_addr()?;
        let api_key = (self.api_key.clone())
            .or_else(|| std::env::var("REIN_API_KEY").ok())
            .filter(|key| !key.is_empty());
        if api_key.is_none() && !address.ip().is_loopback() {
            eprintln!(
                "rein serve: warning: listening on {address} without an API key: anyone who can reach it can \
                 generate and replace the weights (set --api-key or REIN_API_KEY)"
            );
        }
        anyhow::ensure!(
            self.read_timeout.is_finite() && self.read_timeout > 0.0,
            "--read-timeout must be a positive number of seconds, got {}",
            self.read_timeout
        );
        let limits = HttpLimits {
            max_body_bytes: self.max_body_bytes,
            read_timeout: Duration::from_secs_f64(self.read_timeout),
            max_connections: self.max_connections,
            workers: self.workers,
            api_key,
        };
        eprintln!("rein serve: {} on http://{address}", self.model.display());
        http::serve(listener, handler, limits)
    }

    /// The handler of a causal language model, or of a vision-language model's decoder with its
    /// image side.
    fn language_model(&self, name: String, weights_dir: Option<PathBuf>) -> anyhow::Result<Arc<dyn Handler>> {
        let (device, loading) = (Default::default(), || format!("loading {}", self.model.display()));
        let mut model = load::<rein_model::Cpu>(&self.model, &device).with_context(loading)?;
        // The image side runs apart from the decoder (in the engine, once per batch).
        let vision = model.vision.take();
        let model = model.with_dtype(self.dtype);
        crate::generate::q8_has_codes(self.precision, &model, &self.model)?;
        crate::generate::q8_fits_dtype(self.precision, self.dtype)?;
        let limits = self.request_limits(model.config())?;
        let tokenizer = LmTokenizer::load(&self.model, &model.config().eos_ids())?;
        let images = (vision.as_ref()).map(|v| self.served_images(v)).transpose()?;
        let window = Duration::from_millis(self.batch_window_ms);
        let engine = Engine::start(model, vision, tokenizer.clone(), window, limits.clone());
        Ok(Arc::new(State {
            engine,
            tokenizer,
            name,
            model_path: self.model.display().to_string(),
            seeds: AtomicU64::new(seed_from_clock()),
            precision: self.precision,
            limits,
            weights_dir,
            images,
        }))
    }

    /// How a vision-language model's requests' images are read.
    fn served_images(&self, vision: &ImageSide<rein_model::Cpu>) -> anyhow::Result<images::ServedImages> {
        let local_media = (self.allowed_local_media_path.as_ref())
            .map(|dir| (dir.canonicalize()).with_context(|| format!("--allowed-local-media-path {}", dir.display())))
            .transpose()?;
        Ok(images::ServedImages {
            processor: ImageProcessor::load(&self.model, vision)?,
            limits: ImageLimits {
                max_bytes: self.max_body_bytes,
                max_pixels: self.max_image_pixels,
            },
            max_images: self.limit_images_per_prompt,
            local_media,
        })
    }

    /// `--max-model-len`, checked against the model's context.
    /// The handler of a token classifier: `/pooling`, every token's rows or the step tag's.
    fn token_classifier(&self, name: String) -> anyhow::Result<Arc<dyn Handler>> {
        anyhow::ensure!(
            self.precision == SamplerPrecision::Exact && self.dtype == ModelDtype::F32,
            "--precision q8 and --dtype bf16 are for language models; {} is a token classifier",
            self.model.display()
        );
        let loading = || format!("loading {}", self.model.display());
        let model = TokenClassifier::load(&self.model, &Default::default()).with_context(loading)?;
        let tokenizer = LmTokenizer::load(&rein_model::lm::locate(&self.model)?, &[])?;
        let step_tag = match &self.step_tag {
            None => None,
            Some(tag) => match tokenizer.encode(tag)?.as_slice() {
                [id] => Some(*id),
                ids => anyhow::bail!(
                    "--step-tag {tag:?} is {} tokens of {}'s vocabulary; a step tag is one token",
                    ids.len(),
                    self.model.display()
                ),
            },
        };
        let limits = self.input_limits(model.config())?;
        Ok(Arc::new(pooling::TokenClassifierServer::new(
            model, tokenizer, name, limits, step_tag,
        )))
    }

    /// What a classifier's request may hold: inputs within the context (`--max-model-len`) and
    /// the vocabulary, at most `--max-num-seqs` of them.
    fn input_limits(&self, model: &rein_model::lm::LmConfig) -> anyhow::Result<classify::InputLimits> {
        Ok(classify::InputLimits {
            max_len: self.context_length(model.max_position_embeddings)?,
            vocab: model.vocab_size,
            max_inputs: self.max_num_seqs,
        })
    }

    fn context_length(&self, max_position_embeddings: usize) -> anyhow::Result<usize> {
        let max_model_len = self.max_model_len.unwrap_or(max_position_embeddings);
        anyhow::ensure!(
            (1..=max_position_embeddings).contains(&max_model_len),
            "--max-model-len {max_model_len} is outside the model's context: 1..={max_position_embeddings} \
             (max_position_embeddings in {})",
            self.model.display()
        );
        Ok(max_model_len)
    }

    /// The limits on each generation request.
    fn request_limits(&self, model: &rein_model::lm::LmConfig) -> anyhow::Result<RequestLimits> {
        let max_model_len = self.context_length(model.max_position_embeddings)?;
        anyhow::ensure!(self.max_num_seqs >= 1, "--max-num-seqs must be at least 1");
        Ok(RequestLimits {
            max_model_len,
            max_num_seqs: self.max_num_seqs,
            max_stop_strings: self.max_stop_strings,
            max_stop_bytes: self.max_stop_bytes,
            // A quarter of the machine's memory (of 16 GiB where /proc/meminfo cannot be read).
            max_kv_cache_bytes: (self.max_kv_cache_bytes)
                .unwrap_or_else(|| rein_run::memory::total_bytes().unwrap_or(16 << 30) / 4),
            model: model.clone(),
        })
    }
}

struct State {
    engine: Engine,
    tokenizer: LmTokenizer,
    name: String,
    model_path: String,
    seeds: AtomicU64,
    precision: SamplerPrecision,
    limits: RequestLimits,
    /// Where `/update_weights_from_disk` may load from (canonical), if restricted.
    weights_dir: Option<PathBuf>,
    /// How a vision-language model's images are read; `None` for a language model.
    images: Option<images::ServedImages>,
}

/// An answer: status and JSON body.
type Answer = (u16, Value);

fn error(status: u16, message: impl Into<String>) -> Answer {
    let error = ErrorResponse {
        error: ErrorBody {
            message: message.into(),
            kind: Some("invalid_request_error".into()),
            code: Some(json!(status)),
        },
    };
    (status, json!(error))
}

/// What a server answers: a status and a JSON body for each request's method, path (without
/// its query) and body.
trait Handler: Send + Sync {
    fn route(&self, method: &Method, path: &str, body: &str) -> Answer;
}

impl Handler for State {
    fn route(&self, method: &Method, path: &str, body: &str) -> Answer {
        match (method, path) {
            (&Method::GET, "/health" | "/health_generate") => (200, json!({})),
            (&Method::GET, "/v1/models") => (
                200,
                json!({"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": "rein"}]}),
            ),
            (&Method::GET, "/get_model_info" | "/model_info") => (
                200,
                json!({"model_path": self.model_path, "is_generation": true, "served_model_name": self.name}),
            ),
            (&Method::POST, "/generate" | "/v1/completions" | "/v1/chat/completions" | "/update_weights_from_disk") => {
                self.post(path, body)
            }
            (_, "/generate" | "/v1/completions" | "/v1/chat/completions" | "/update_weights_from_disk") => {
                error(405, format!("{path} takes POST"))
            }
            _ => error(404, format!("no endpoint {path}")),
        }
    }
}

impl State {
    /// A POST to one of the generation endpoints or to `/update_weights_from_disk`.
    fn post(&self, path: &str, body: &str) -> Answer {
        let fresh_seed = || self.seeds.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
        let api = Api {
            tokenizer: &self.tokenizer,
            model_name: &self.name,
            fresh_seed: &fresh_seed,
            precision: self.precision,
            limits: &self.limits,
            images: self.images.as_ref(),
        };
        let unreadable = |e: String| BadRequest(format!("the body of {path}: {e}"));
        let answer = match path {
            "/generate" => parse::<GenerateRequest>(body).map_err(unreadable).and_then(|request| {
                let (work, batched) = api.sglang_request(&request)?;
                let logprobs = request.return_logprob == Some(true);
                Ok(self.generate(work, |work, done| api.sglang_response(work, done, batched, logprobs)))
            }),
            "/v1/completions" => parse::<CompletionRequest>(body)
                .map_err(unreadable)
                .and_then(|request| {
                    let work = api.completion_request(&request)?;
                    Ok(self.generate(work, |work, done| api.completion_response(&request, work, done)))
                }),
            "/v1/chat/completions" => parse::<ChatRequest>(body).map_err(unreadable).and_then(|request| {
                let work = api.chat_request(&request)?;
                Ok(self.generate(work, |work, done| api.chat_response(&request, work, done)))
            }),
            _ => Ok(self.update_weights(body)),
        };
        answer.unwrap_or_else(|BadRequest(message)| error(400, message))
    }

    /// Runs `work` on the engine and answers with `respond`'s body (500 if the engine failed on
    /// it, 503 once the engine stopped).
    fn generate<T: Serialize>(&self, work: Work, respond: impl FnOnce(&Work, &Done) -> T) -> Answer {
        match self.engine.generate(work.clone()) {
            Some(Ok(done)) => (200, json!(respond(&work, &done))),
            Some(Err(failure)) => error(500, failure),
            None => error(503, "the engine stopped"),
        }
    }

    /// Whether `--weights-dir` lets `/update_weights_from_disk` load `path`.
    fn may_load(&self, path: &Path) -> Result<(), String> {
        let Some(dir) = &self.weights_dir else {
            return Ok(());
        };
        let inside = path.canonicalize().is_ok_and(|path| path.starts_with(dir));
        match inside {
            true => Ok(()),
            false => Err(format!(
                "{} is not inside {}, the only directory this server loads weights from (--weights-dir)",
                path.display(),
                dir.display()
            )),
        }
    }

    /// SGLang's `/update_weights_from_disk`: `model_path` (a checkpoint or a LoRA adapter
    /// directory), optional `weight_version`.
    fn update_weights(&self, body: &str) -> Answer {
        let refused = |message: String| UpdateWeightsResponse {
            success: false,
            message,
            num_paused_requests: None,
            weight_version: None,
        };
        let request = match parse::<UpdateWeightsRequest>(body) {
            Ok(request) => request,
            Err(e) => {
                return (
                    400,
                    json!(refused(format!("the body of /update_weights_from_disk: {e}"))),
                );
            }
        };
        let path = request.model_path;
        if let Err(message) = self.may_load(Path::new(&path)) {
            return (403, json!(refused(message)));
        }
        match self.engine.reload(PathBuf::from(&path), request.weight_version) {
            Ok(version) => {
                let loaded = UpdateWeightsResponse {
                    success: true,
                    message: format!("loaded {path}"),
                    num_paused_requests: Some(0),
                    weight_version: Some(version),
                };
                (200, json!(loaded))
            }
            Err(message) => (400, json!(refused(message))),
        }
    }
}

fn seed_from_clock() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use rein_sampler::protocol::{ClassifyRequest, LoadLoraRequest, Prompts, SamplingParamsField, UnloadLoraRequest};

    use super::*;

    fn fixture(name: &str) -> String {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/protocol");
        std::fs::read_to_string(dir.join(name)).unwrap()
    }

    #[test]
    fn documented_sglang_requests_parse() {
        let single = parse::<GenerateRequest>(&fixture("sglang-generate-request.json")).unwrap();
        assert_eq!(
            single.input_ids,
            Some(Prompts::Ids(vec![128000, 791, 6864, 315, 9822, 374]))
        );
        assert_eq!(single.return_logprob, Some(true));
        let Some(SamplingParamsField::One(params)) = single.sampling_params else {
            panic!("one set of sampling parameters")
        };
        let sampling = params.sampling();
        assert_eq!((sampling.temperature, sampling.max_new_tokens), (Some(0.0), Some(32)));
        assert_eq!(sampling.stop_token_ids, Some(vec![119690]));

        let batch = parse::<GenerateRequest>(&fixture("sglang-generate-request-batch.json")).unwrap();
        assert!(batch.input_ids.as_ref().is_some_and(Prompts::is_batch));
        let Some(SamplingParamsField::One(params)) = batch.sampling_params else {
            panic!("one set of sampling parameters")
        };
        assert_eq!((params.top_k, params.sampling_seed), (Some(50), Some(42)));

        let text = parse::<GenerateRequest>(&fixture("sglang-generate-request-text.json")).unwrap();
        assert_eq!(text.text, Some(Prompts::Text("The capital of France is".into())));

        let update = parse::<UpdateWeightsRequest>(&fixture("sglang-update-weights-request.json")).unwrap();
        assert_eq!(
            (update.model_path.as_str(), update.weight_version),
            ("qwen/qwen2.5-0.5b-instruct", None)
        );
        let tagged = parse::<UpdateWeightsRequest>(&fixture("sglang-update-weights-request-version.json")).unwrap();
        assert_eq!(tagged.weight_version.as_deref(), Some("step_42"));
    }

    #[test]
    fn documented_vllm_requests_parse() {
        let logprobs = parse::<CompletionRequest>(&fixture("vllm-completions-request-logprobs.json")).unwrap();
        assert_eq!(
            (logprobs.prompt, logprobs.logprobs),
            (Prompts::Ids(vec![0; 5]), Some(5))
        );
        let ids = parse::<CompletionRequest>(&fixture("vllm-completions-request-token-ids.json")).unwrap();
        assert_eq!(ids.return_token_ids, Some(true));
        let seeded = parse::<CompletionRequest>(&fixture("vllm-completions-request-n-seed.json")).unwrap();
        let sampling = seeded.sampling();
        assert_eq!(
            (sampling.n, sampling.seed, sampling.max_new_tokens),
            (Some(3), Some(42), Some(50))
        );
        let batch = parse::<CompletionRequest>(&fixture("vllm-completions-request-batch.json")).unwrap();
        assert!(batch.prompt.is_batch());
        assert_eq!(batch.stop_token_ids, Some(vec![151645]));
        for name in ["vllm-load-lora-request.json", "vllm-load-lora-request-inplace.json"] {
            parse::<LoadLoraRequest>(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        parse::<UnloadLoraRequest>(&fixture("vllm-unload-lora-request.json")).unwrap();
        let classify = parse::<ClassifyRequest>(&fixture("vllm-classify-request.json")).unwrap();
        assert!(classify.input.is_batch() && classify.activation.is_none());
        let one = parse::<ClassifyRequest>(&fixture("sglang-classify-request.json")).unwrap();
        assert_eq!(one.input, Prompts::Text("text to classify".into()));
    }
}
