//! The serving engine: one thread owns the model and batches whatever requests arrive together.
//!
//! A batch gathers requests until none came for `window` (at most ten windows); then every request with
//! the same sampling settings is decoded in one [`generate_seeded`] call, each prompt with its
//! own seed, so a prompt draws the same tokens whether it came alone or with 63 others (and as
//! it would in a native trainer's batch with the same seed). Requests with `echo` also get one
//! teacher-forced pass over each prompt ([`prompt_logprobs`]). A weight reload is a barrier:
//! requests before it finish on the old weights, requests after it start on the new ones.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use rein_model::Cpu;
use rein_model::lm::{CausalLm, LmTokenizer, load};
use rein_sampler::{Generation, GenerationConfig, ScoredToken, generate_seeded, prompt_logprobs, stop_check};

use super::limits::RequestLimits;

/// One request's generation work.
#[derive(Clone)]
pub(crate) struct Work {
    /// Prompts as token ids.
    pub prompts: Vec<Vec<u32>>,
    /// Each prompt's seed.
    pub seeds: Vec<u64>,
    /// Sampling settings (`seed` unused: see `seeds`).
    pub config: GenerationConfig,
    /// Stop strings.
    pub stops: Vec<String>,
    /// Score each prompt's own tokens too (`echo` with log-probabilities).
    pub score_prompts: bool,
}

/// A request's completions and the policy version that sampled them.
pub(crate) struct Done {
    /// `n` per prompt, in order.
    pub generations: Vec<Generation>,
    /// The weight version.
    pub version: String,
    /// Per prompt, its tokens after the first scored given those before them (with `echo`;
    /// empty otherwise).
    pub prompt_logprobs: Vec<Vec<ScoredToken>>,
}

/// A request's completions, or why the engine failed on it.
pub(crate) type Outcome = Result<Done, String>;

enum Message {
    Generate(Work, Sender<Outcome>),
    Reload(PathBuf, Option<String>, Sender<Result<String, String>>),
}

/// A handle to the engine thread (cheap to clone, one per HTTP worker).
#[derive(Clone)]
pub(crate) struct Engine {
    tx: Sender<Message>,
}

impl Engine {
    /// Starts the engine thread on `model`; its batches stay within `limits`.
    pub(crate) fn start(model: CausalLm<Cpu>, tokenizer: LmTokenizer, window: Duration, limits: RequestLimits) -> Self {
        let (tx, rx) = channel();
        std::thread::Builder::new()
            .name("rein-serve-engine".into())
            .spawn(move || EngineLoop::new(model, tokenizer, limits).run(rx, window))
            .expect("the engine thread starts");
        Self { tx }
    }

    /// The completions of `work` (`None` if the engine is gone).
    pub(crate) fn generate(&self, work: Work) -> Option<Outcome> {
        let (reply, done) = channel();
        self.tx.send(Message::Generate(work, reply)).ok()?;
        done.recv().ok()
    }

    /// Loads the checkpoint or LoRA adapter in `path`; returns the new weight version.
    pub(crate) fn reload(&self, path: PathBuf, version: Option<String>) -> Result<String, String> {
        let (reply, done) = channel();
        (self.tx.send(Message::Reload(path, version, reply))).map_err(|_| "the engine stopped".to_string())?;
        done.recv().map_err(|_| "the engine stopped".to_string())?
    }
}

struct EngineLoop {
    /// The model loaded at start, onto which adapters are merged.
    base: CausalLm<Cpu>,
    model: CausalLm<Cpu>,
    tokenizer: LmTokenizer,
    pad: u32,
    version: String,
    reloads: u64,
    limits: RequestLimits,
}

impl EngineLoop {
    fn new(model: CausalLm<Cpu>, tokenizer: LmTokenizer, limits: RequestLimits) -> Self {
        Self {
            limits,
            base: model.clone(),
            model,
            pad: tokenizer.pad_id().unwrap_or(0),
            tokenizer,
            version: "0".into(),
            reloads: 0,
        }
    }

    fn run(mut self, rx: Receiver<Message>, window: Duration) {
        while let Ok(first) = rx.recv() {
            // Gather until no request came for `window` (clients sending a burst of requests
            // connect one after another), for at most ten windows.
            let mut batch = vec![first];
            let deadline = Instant::now() + window * 10;
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                match rx.recv_timeout(left.min(window)) {
                    Ok(message) => batch.push(message),
                    Err(_) => break,
                }
            }
            let mut pending: Vec<(Work, Sender<Outcome>)> = Vec::new();
            for message in batch {
                match message {
                    Message::Generate(work, reply) => pending.push((work, reply)),
                    Message::Reload(path, version, reply) => {
                        self.decode(std::mem::take(&mut pending));
                        let _ = reply.send(self.reload(&path, version));
                    }
                }
            }
            self.decode(pending);
        }
    }

    /// Decodes the requests, those with equal settings together as long as the batch stays
    /// within `--max-num-seqs` sequences and `--max-kv-cache-bytes` (each request alone does:
    /// the API checked it).
    fn decode(&self, mut pending: Vec<(Work, Sender<Outcome>)>) {
        while !pending.is_empty() {
            let key = settings_key(&pending[0].0);
            let mut group = Vec::new();
            let mut rest = Vec::new();
            let (mut prompts, mut sequences, mut longest) = (0, 0, 0);
            for item in pending {
                let work = &item.0;
                let (p, s) = (work.prompts.len(), work.prompts.len() * work.config.n.max(1));
                let l = longest.max(work.prompts.iter().map(Vec::len).max().unwrap_or(0));
                let fits = sequences + s <= self.limits.max_num_seqs
                    && self
                        .limits
                        .kv_bytes(prompts + p, sequences + s, l, work.config.max_new_tokens)
                        <= self.limits.max_kv_cache_bytes;
                if settings_key(work) == key && (group.is_empty() || fits) {
                    (prompts, sequences, longest) = (prompts + p, sequences + s, l);
                    group.push(item);
                } else {
                    rest.push(item);
                }
            }
            self.decode_group(group);
            pending = rest;
        }
    }

    /// Decodes one batch; a panic while decoding fails the batch's requests with its message and
    /// leaves the engine serving.
    fn decode_group(&self, group: Vec<(Work, Sender<Outcome>)>) {
        let works: Vec<&Work> = group.iter().map(|(work, _)| work).collect();
        let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.decode_works(&works)));
        match decoded {
            Ok(done) => {
                for ((_, reply), done) in group.into_iter().zip(done) {
                    let _ = reply.send(Ok(done));
                }
            }
            Err(panic) => {
                let message = (panic.downcast_ref::<String>().map(String::as_str))
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("a panic");
                eprintln!("rein serve: a batch of {} requests failed: {message}", group.len());
                for (_, reply) in group {
                    let _ = reply.send(Err(format!("generation failed inside the server: {message}")));
                }
            }
        }
    }

    fn decode_works(&self, group: &[&Work]) -> Vec<Done> {
        let started = Instant::now();
        let config = group[0].config.clone();
        let n = config.n.max(1);
        let mut prompts = Vec::new();
        let mut seeds = Vec::new();
        let mut owner = Vec::new();
        for (i, work) in group.iter().enumerate() {
            prompts.extend(work.prompts.iter().cloned());
            seeds.extend(&work.seeds);
            owner.extend(std::iter::repeat_n(i, work.prompts.len()));
        }
        let device = Default::default();
        let generations = {
            let mut checks: Vec<_> = group.iter().map(|w| stop_check(&self.tokenizer, &w.stops)).collect();
            let mut stop = |seq: usize, tokens: &[u32]| checks[owner[seq / n]](seq, tokens);
            generate_seeded(&self.model, &prompts, &seeds, &config, self.pad, &mut stop, &device)
        };
        // `echo`: one teacher-forced pass over each prompt of the requests that asked.
        let scored: Vec<Vec<Vec<ScoredToken>>> = (group.iter())
            .map(|work| match work.score_prompts {
                true => (work.prompts.iter())
                    .map(|p| prompt_logprobs(&self.model, p, config.temperature, config.top_logprobs, &device))
                    .collect(),
                false => Vec::new(),
            })
            .collect();
        let tokens: usize = generations.iter().map(|g| g.tokens.len()).sum();
        let seconds = started.elapsed().as_secs_f64();
        eprintln!(
            "batch of {} requests ({} sequences): {tokens} tokens in {seconds:.2} s ({:.0} tokens/s)",
            group.len(),
            generations.len(),
            tokens as f64 / seconds.max(1e-9)
        );
        let mut generations = generations.into_iter();
        (group.iter().zip(scored))
            .map(|(work, prompt_logprobs)| Done {
                generations: renumber(generations.by_ref().take(work.prompts.len() * n).collect(), n),
                version: self.version.clone(),
                prompt_logprobs,
            })
            .collect()
    }

    fn reload(&mut self, path: &Path, version: Option<String>) -> Result<String, String> {
        let device = Default::default();
        let model = match path.join("adapter_config.json").is_file() {
            true => rein_model::lm::peft::load_adapter(self.base.clone(), path, &device).map(|m| m.merged()),
            false => load::<Cpu>(path, &device),
        }
        .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
        let (old, new) = (self.model.config(), model.config());
        if (old.vocab_size, old.hidden_size, old.num_hidden_layers)
            != (new.vocab_size, new.hidden_size, new.num_hidden_layers)
        {
            return Err(format!(
                "{} is another architecture (vocab {}, hidden {}, {} layers; serving vocab {}, hidden {}, {} layers)",
                path.display(),
                new.vocab_size,
                new.hidden_size,
                new.num_hidden_layers,
                old.vocab_size,
                old.hidden_size,
                old.num_hidden_layers
            ));
        }
        self.model = model.with_dtype(self.model.dtype());
        self.reloads += 1;
        self.version = version.unwrap_or_else(|| self.reloads.to_string());
        Ok(self.version.clone())
    }
}

/// Generations renumbered within their own request: prompt `i / n`, sample `i % n`.
fn renumber(generations: Vec<Generation>, n: usize) -> Vec<Generation> {
    (generations.into_iter().enumerate())
        .map(|(i, g)| Generation {
            prompt: i / n,
            sample: i % n,
            ..g
        })
        .collect()
}

/// The settings that must be equal for requests to decode together.
fn settings_key(work: &Work) -> String {
    let c = &work.config;
    format!(
        "{} {} {:?} {:?} {:?} {} {:?} {}",
        c.max_new_tokens,
        c.temperature.to_bits(),
        c.top_k,
        c.top_p.map(f32::to_bits),
        c.min_p.map(f32::to_bits),
        c.n,
        c.stop_token_ids,
        c.top_logprobs
    )
}
