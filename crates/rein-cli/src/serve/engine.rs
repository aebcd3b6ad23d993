//! The serving engine: one thread owns the model and shares itself out between the requests in
//! flight.
//!
//! Requests that arrive together are grouped: when the engine is idle, until none came for
//! `window` (at most ten windows); when it is busy, whatever queued during the last round. Those
//! with the same sampling settings decode as one batch ([`Decoding`]), each prompt with its own
//! seed, so a prompt draws the same tokens whether it came alone or with 63 others (and as it
//! would in a native trainer's batch with the same seed). The batches in flight share the engine
//! by time: each slice of [`SLICE`] (at least one step) goes to the batch that has had the least
//! of it, and a new batch starts as soon as the slice it arrived during ends, so a short request
//! waits for a step of a long one, not for all of it. Slicing changes nothing a batch draws. A
//! batch with a prompt longer than [`ONE_PASS_PREFILL`] tokens is prefilled [`PREFILL_CHUNK`]
//! positions a step, so a long prompt's prefill is shared out too.
//!
//! A batch starts once the sequences and the keys and values of every batch in flight stay
//! within `--max-num-seqs` and `--max-kv-cache-bytes` (first come, first started). Requests with
//! `echo` also get one teacher-forced pass over each prompt ([`prompt_logprobs`]). A weight
//! reload is a barrier: requests before it finish on the old weights, requests after it start
//! on the new ones.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};
use std::time::{Duration, Instant};

use rein_model::Cpu;
use rein_model::lm::{CausalLm, LmTokenizer, load};
use rein_model::vision::{ImageSide, ProcessedImage, is_idefics3, is_qwen2_vl};
use rein_sampler::{Decoding, Generation, GenerationConfig, PromptImages, ScoredToken, prompt_logprobs, stop_check};

use super::limits::RequestLimits;

/// How long a batch runs before the engine picks the next (see [`EngineLoop::serve`]).
const SLICE: Duration = Duration::from_millis(20);

/// Batches whose prompts are all this many tokens or fewer are prefilled in one pass, as the
/// native sampler prefills them (the same bits).
const ONE_PASS_PREFILL: usize = 256;

/// Positions of a longer batch's left-padded prompts prefilled per step (the same logits within
/// float rounding).
const PREFILL_CHUNK: usize = 64;

/// How much of the engine's time a new batch may have before those already in flight get theirs
/// back: enough for a short request to finish in one go.
const NEW_BATCH_CREDIT: Duration = Duration::from_millis(500);

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
    /// The prompts' images, in order (a vision-language model's).
    pub images: Vec<ProcessedImage>,
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

/// A request and where its answer goes.
type Request = (Work, Sender<Outcome>);

/// A weight reload: the checkpoint or adapter, its version name, where the answer goes.
type Reload = (PathBuf, Option<String>, Sender<Result<String, String>>);

enum Message {
    Generate(Work, Sender<Outcome>),
    Reload(Reload),
}

/// A handle to the engine thread (cheap to clone, one per HTTP worker).
#[derive(Clone)]
pub(crate) struct Engine {
    tx: Sender<Message>,
}

impl Engine {
    /// Starts the engine thread on `model` (a vision-language model's decoder with its `vision`
    /// encoding the requests' images as their batch starts); its batches stay within `limits`.
    pub(crate) fn start(
        model: CausalLm<Cpu>,
        vision: Option<ImageSide<Cpu>>,
        tokenizer: LmTokenizer,
        window: Duration,
        limits: RequestLimits,
    ) -> Self {
        Self::with_slice(model, vision, tokenizer, window, limits, SLICE)
    }

    /// [`Engine::start`] with each batch's turn `slice` long (at least one token).
    fn with_slice(
        model: CausalLm<Cpu>,
        vision: Option<ImageSide<Cpu>>,
        tokenizer: LmTokenizer,
        window: Duration,
        limits: RequestLimits,
        slice: Duration,
    ) -> Self {
        let (tx, rx) = channel();
        std::thread::Builder::new()
            .name("rein-serve-engine".into())
            .spawn(move || EngineLoop::new(model, vision, tokenizer, limits, slice).run(rx, window))
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
        (self.tx.send(Message::Reload((path, version, reply)))).map_err(|_| "the engine stopped".to_string())?;
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
    /// How long a batch decodes before the next takes its turn.
    slice: Duration,
    /// A vision-language model's encoder of the requests' images.
    vision: Option<ImageSide<Cpu>>,
}

impl EngineLoop {
    fn new(
        model: CausalLm<Cpu>,
        vision: Option<ImageSide<Cpu>>,
        tokenizer: LmTokenizer,
        limits: RequestLimits,
        slice: Duration,
    ) -> Self {
        Self {
            limits,
            slice,
            base: model.clone(),
            model,
            pad: tokenizer.pad_id().unwrap_or(0),
            tokenizer,
            version: "0".into(),
            reloads: 0,
            vision,
        }
    }

    fn run(mut self, rx: Receiver<Message>, window: Duration) {
        while let Some((path, version, reply)) = self.serve(&rx, window) {
            let _ = reply.send(self.reload(&path, version));
        }
    }

    /// Serves generation requests until one asks for a reload, which it returns once every
    /// request before it has been answered, or until every handle is gone (`None`).
    ///
    /// Between slices it takes what has arrived; each slice goes to the batch in flight that has
    /// had the least of the engine's time, as Linux's fair scheduler picks the task with the
    /// least run time. A step that took long (a chunk of a long prompt's prefill) is paid back
    /// by its batch waiting while the others catch up.
    fn serve(&self, rx: &Receiver<Message>, window: Duration) -> Option<Reload> {
        let mut queue: VecDeque<Request> = VecDeque::new();
        let mut flight: Vec<Batch<'_>> = Vec::new();
        let mut reload: Option<Reload> = None;
        loop {
            if reload.is_none() {
                let idle = flight.is_empty() && queue.is_empty();
                match receive(rx, idle, window, &mut queue) {
                    Received::Requests => {}
                    Received::Reload(r) => reload = Some(r),
                    Received::Closed if idle => return None,
                    Received::Closed => {}
                }
            }
            self.start_batches(&mut queue, &mut flight);
            if flight.is_empty()
                && let Some(r) = reload.take()
            {
                return Some(r);
            }
            // The batch that has had the least of the engine's time runs for a slice.
            let Some(next) = (0..flight.len()).min_by_key(|&i| flight[i].used) else {
                continue;
            };
            let mut batch = flight.remove(next);
            let started = Instant::now();
            let sliced = self.decode_slice(&mut batch);
            batch.used += started.elapsed();
            match sliced {
                Ok(false) => flight.push(batch),
                Ok(true) => {
                    for (outcome, reply) in self.answers(batch) {
                        let _ = reply.send(outcome);
                    }
                }
                Err(message) => fail(batch.requests, &message),
            }
        }
    }

    /// Starts the queued requests as batches while everything in flight stays within
    /// `--max-num-seqs` and `--max-kv-cache-bytes`, the first in the queue first, and with it
    /// the later ones that have its settings and fit (each request alone fits an idle engine:
    /// the API checked it).
    fn start_batches<'m>(&'m self, queue: &mut VecDeque<Request>, flight: &mut Vec<Batch<'m>>) {
        // A new batch counts as having had a little less time than the least served one in
        // flight: it runs next, but cannot claim the time the others had before it came.
        let used = (flight.iter().map(|b| b.used).min())
            .map_or(Duration::ZERO, |least| least.saturating_sub(NEW_BATCH_CREDIT));
        while let Some(first) = queue.pop_front() {
            let in_flight = (flight.iter()).fold((0, 0), |(s, b), batch| (s + batch.sequences, b + batch.kv_bytes));
            let mut group = Group::default();
            if !(flight.is_empty() || group.fits(&first.0, in_flight, &self.limits)) {
                queue.push_front(first); // it waits for room, and those behind it
                return;
            }
            let key = settings_key(&first.0);
            group.push(first, &self.limits);
            let mut rest = VecDeque::new();
            for item in queue.drain(..) {
                if settings_key(&item.0) == key && group.fits(&item.0, in_flight, &self.limits) {
                    group.push(item, &self.limits);
                } else {
                    rest.push_back(item);
                }
            }
            *queue = rest;
            if let Some(mut batch) = self.start(group) {
                batch.used = used;
                flight.push(batch);
            }
        }
    }

    /// A batch ready to be prefilled (`None` when setting it up failed: its requests have been
    /// answered 500).
    fn start(&self, group: Group) -> Option<Batch<'_>> {
        let Group {
            requests,
            sequences,
            kv_bytes,
            ..
        } = group;
        let config = requests[0].0.config.clone();
        let mut prompts = Vec::new();
        let mut seeds = Vec::new();
        let mut owner = Vec::new();
        for (i, (work, _)) in requests.iter().enumerate() {
            prompts.extend(work.prompts.iter().cloned());
            seeds.extend(&work.seeds);
            owner.extend(std::iter::repeat_n(i, work.prompts.len()));
        }
        let started = Instant::now();
        let device = Default::default();
        let chunk = match prompts.iter().map(Vec::len).max().unwrap_or(0) <= ONE_PASS_PREFILL {
            true => usize::MAX,
            false => PREFILL_CHUNK,
        };
        // A request's images are its first prompt's (a chat request has one prompt).
        let images: Vec<&[ProcessedImage]> = (requests.iter())
            .flat_map(|(work, _)| (0..work.prompts.len()).map(|k| if k == 0 { &work.images[..] } else { &[][..] }))
            .collect();
        let set_up = || {
            let decoding = Decoding::in_chunks(&self.model, &prompts, &seeds, &config, self.pad, chunk, &device);
            match PromptImages::of_prompts(self.vision.as_ref(), &prompts, &images, &device)? {
                Some(images) => decoding.with_images(images),
                None => Ok(decoding),
            }
        };
        match catching(set_up).and_then(|decoding| decoding) {
            Ok(decoding) => Some(Batch {
                requests,
                decoding,
                owner,
                n: config.n.max(1),
                sequences,
                kv_bytes,
                started,
                used: Duration::ZERO,
            }),
            Err(message) => {
                fail(requests, &message);
                None
            }
        }
    }

    /// Prefills and decodes `batch` for a slice; says whether it has finished.
    fn decode_slice(&self, batch: &mut Batch<'_>) -> Result<bool, String> {
        let until = Instant::now() + self.slice;
        let mut checks: Vec<_> = (batch.requests.iter())
            .map(|(work, _)| stop_check(&self.tokenizer, &work.stops))
            .collect();
        let (owner, n) = (&batch.owner, batch.n);
        let mut stop = |seq: usize, tokens: &[u32]| checks[owner[seq / n]](seq, tokens);
        let decoding = &mut batch.decoding;
        catching(|| {
            loop {
                if decoding.advance(1, &mut stop) {
                    break true;
                }
                if Instant::now() >= until {
                    break false;
                }
            }
        })
    }

    /// A finished batch's answers: each request's generations, and with `echo` one
    /// teacher-forced pass over each of its prompts.
    fn answers(&self, batch: Batch<'_>) -> Vec<(Outcome, Sender<Outcome>)> {
        let generations = batch.decoding.into_generations();
        let tokens: usize = generations.iter().map(|g| g.tokens.len()).sum();
        let seconds = batch.started.elapsed().as_secs_f64();
        eprintln!(
            "batch of {} requests ({} sequences): {tokens} tokens in {seconds:.2} s ({:.0} tokens/s)",
            batch.requests.len(),
            generations.len(),
            tokens as f64 / seconds.max(1e-9)
        );
        let device = Default::default();
        let mut generations = generations.into_iter();
        (batch.requests.into_iter())
            .map(|(work, reply)| {
                let own = renumber(
                    generations.by_ref().take(work.prompts.len() * batch.n).collect(),
                    batch.n,
                );
                let scored = catching(|| match work.score_prompts {
                    true => (work.prompts.iter())
                        .map(|p| {
                            let c = &work.config;
                            prompt_logprobs(&self.model, p, c.temperature, c.top_logprobs, &device)
                        })
                        .collect(),
                    false => Vec::new(),
                });
                let outcome = scored.map(|prompt_logprobs| Done {
                    generations: own,
                    version: self.version.clone(),
                    prompt_logprobs,
                });
                (outcome, reply)
            })
            .collect()
    }

    fn reload(&mut self, path: &Path, version: Option<String>) -> Result<String, String> {
        let device = Default::default();
        let cannot = |e: rein_model::lm::LoadError| format!("cannot load {}: {e}", path.display());
        // A vision-language checkpoint replaces the image side too; a decoder alone keeps it.
        let vlm = is_idefics3(path) || is_qwen2_vl(path);
        let (model, vision) = match (path.join("adapter_config.json").is_file(), vlm) {
            (true, _) => {
                let adapted = rein_model::lm::peft::load_adapter(self.base.clone(), path, &device).map_err(cannot)?;
                (adapted.merged(), None)
            }
            (false, true) if self.vision.is_none() => {
                return Err(format!(
                    "{} is a vision-language model; this server serves a language model",
                    path.display()
                ));
            }
            (false, _) => {
                let mut model = load::<Cpu>(path, &device).map_err(cannot)?;
                let vision = model.vision.take();
                (model, vision)
            }
        };
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
        if let Some(vision) = vision {
            self.vision = Some(vision);
        }
        self.reloads += 1;
        self.version = version.unwrap_or_else(|| self.reloads.to_string());
        Ok(self.version.clone())
    }
}

/// A batch in flight: its requests and their generation under way.
struct Batch<'m> {
    requests: Vec<Request>,
    decoding: Decoding<'m, Cpu>,
    /// The request of each prompt.
    owner: Vec<usize>,
    /// Samples per prompt.
    n: usize,
    /// Its sequences and the bytes of its keys and values, counted against the limits.
    sequences: usize,
    kv_bytes: u64,
    started: Instant,
    /// The engine's time it has had (see [`EngineLoop::serve`]).
    used: Duration,
}

/// Requests gathered into one batch, and what it will hold.
#[derive(Default)]
struct Group {
    requests: Vec<Request>,
    prompts: usize,
    sequences: usize,
    /// The longest prompt.
    longest: usize,
    kv_bytes: u64,
}

impl Group {
    /// What the group holds with `work` added: prompts, sequences, longest prompt, KV bytes.
    fn with(&self, work: &Work, limits: &RequestLimits) -> (usize, usize, usize, u64) {
        let (prompts, sequences) = (
            self.prompts + work.prompts.len(),
            self.sequences + work.prompts.len() * work.config.n.max(1),
        );
        let longest = self.longest.max(work.prompts.iter().map(Vec::len).max().unwrap_or(0));
        (
            prompts,
            sequences,
            longest,
            limits.kv_bytes(prompts, sequences, longest, work.config.max_new_tokens),
        )
    }

    /// Whether `work` joins within the limits beside `in_flight` (sequences, KV bytes).
    fn fits(&self, work: &Work, in_flight: (usize, u64), limits: &RequestLimits) -> bool {
        let (_, sequences, _, kv_bytes) = self.with(work, limits);
        in_flight.0 + sequences <= limits.max_num_seqs && in_flight.1 + kv_bytes <= limits.max_kv_cache_bytes
    }

    fn push(&mut self, request: Request, limits: &RequestLimits) {
        (self.prompts, self.sequences, self.longest, self.kv_bytes) = self.with(&request.0, limits);
        self.requests.push(request);
    }
}

/// What [`receive`] took from the channel.
enum Received {
    /// Requests (or none), now in the queue.
    Requests,
    /// A reload; requests after it stay in the channel.
    Reload(Reload),
    /// Every handle is gone.
    Closed,
}

/// Moves arrived requests into `queue`, up to a reload. An `idle` engine waits for the first
/// and then gathers until none came for `window`, for at most ten windows (clients sending a
/// burst of requests connect one after another); a busy one takes what has arrived.
fn receive(rx: &Receiver<Message>, idle: bool, window: Duration, queue: &mut VecDeque<Request>) -> Received {
    let mut take = |message| match message {
        Message::Generate(work, reply) => {
            queue.push_back((work, reply));
            None
        }
        Message::Reload(reload) => Some(Received::Reload(reload)),
    };
    if idle {
        let Ok(first) = rx.recv() else {
            return Received::Closed;
        };
        if let Some(reload) = take(first) {
            return reload;
        }
        let deadline = Instant::now() + window * 10;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match rx.recv_timeout(left.min(window)) {
                Ok(message) => {
                    if let Some(reload) = take(message) {
                        return reload;
                    }
                }
                Err(_) => break,
            }
        }
        return Received::Requests;
    }
    loop {
        match rx.try_recv() {
            Ok(message) => {
                if let Some(reload) = take(message) {
                    return reload;
                }
            }
            Err(TryRecvError::Empty) => return Received::Requests,
            Err(TryRecvError::Disconnected) => return Received::Closed,
        }
    }
}

/// `work()`, or the message of its panic.
fn catching<T>(work: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).map_err(|panic| {
        (panic.downcast_ref::<String>().cloned())
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into())
    })
}

/// Answers each of `requests` that the engine failed on them (500), and says so on stderr.
fn fail(requests: Vec<Request>, message: &str) {
    eprintln!("rein serve: a batch of {} requests failed: {message}", requests.len());
    for (_, reply) in requests {
        let _ = reply.send(Err(format!("generation failed inside the server: {message}")));
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

#[cfg(test)]
mod tests {
    use std::sync::mpsc::TryRecvError;

    use super::*;

    /// The tiny Llama fixture (512 positions).
    fn fixture_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lm/llama")
    }

    fn fixture() -> CausalLm<Cpu> {
        load::<Cpu>(&fixture_dir(), &Default::default()).unwrap()
    }

    fn engine(slice: Duration) -> (Engine, LmTokenizer) {
        let model = fixture();
        let tokenizer = LmTokenizer::load(&fixture_dir(), &model.config().eos_ids()).unwrap();
        let limits = RequestLimits {
            max_model_len: 512,
            max_num_seqs: 64,
            max_stop_strings: 4,
            max_stop_bytes: 64,
            max_kv_cache_bytes: u64::MAX,
            model: model.config().clone(),
        };
        let window = Duration::from_millis(200);
        (
            Engine::with_slice(model, None, tokenizer.clone(), window, limits, slice),
            tokenizer,
        )
    }

    fn work(tokenizer: &LmTokenizer, max_new_tokens: usize, n: usize, temperature: f32) -> Work {
        Work {
            prompts: vec![tokenizer.encode("The answer is").unwrap()],
            seeds: vec![5],
            config: GenerationConfig {
                max_new_tokens,
                temperature,
                n,
                ..GenerationConfig::default()
            },
            stops: Vec::new(),
            score_prompts: false,
            images: Vec::new(),
        }
    }

    /// A long request and a short one sent together: the batches in flight take turns, one
    /// token each here, so the short one is answered while the long one still decodes, with
    /// the tokens it gets alone. Decoding one batch to its end before the next would answer the
    /// short one last.
    #[test]
    fn a_short_request_is_answered_while_a_long_one_decodes() {
        let (engine, tokenizer) = engine(Duration::ZERO);
        let short = work(&tokenizer, 4, 1, 0.0);
        let alone = engine.generate(short.clone()).unwrap().unwrap().generations;
        assert_eq!(alone[0].tokens.len(), 4);
        let (long_reply, long_done) = channel();
        let (short_reply, short_done) = channel();
        engine
            .tx
            .send(Message::Generate(work(&tokenizer, 300, 8, 1.0), long_reply))
            .unwrap();
        engine.tx.send(Message::Generate(short, short_reply)).unwrap();
        let beside = short_done.recv().unwrap().unwrap().generations;
        assert!(
            matches!(long_done.try_recv(), Err(TryRecvError::Empty)),
            "the long request finished first"
        );
        assert_eq!(beside, alone);
        let long = long_done.recv().unwrap().unwrap().generations;
        assert!(long.len() == 8 && long.iter().all(|g| g.tokens.len() == 300));
    }

    /// A prompt past [`ONE_PASS_PREFILL`] tokens, prefilled [`PREFILL_CHUNK`] positions a step,
    /// gets the greedy tokens of the native sampler's one-pass prefill.
    #[test]
    fn a_long_prompt_prefilled_in_chunks_gets_the_one_pass_tokens() {
        let (engine, tokenizer) = engine(Duration::ZERO);
        let mut long = work(&tokenizer, 12, 1, 0.0);
        long.prompts[0] = (0..300).map(|i| 3 + (i * 7 % 200) as u32).collect();
        assert!(long.prompts[0].len() > ONE_PASS_PREFILL);
        let model = fixture();
        let native = rein_sampler::generate_seeded(
            &model,
            &long.prompts,
            &long.seeds,
            &long.config,
            tokenizer.pad_id().unwrap_or(0),
            &mut |_, _| false,
            &Default::default(),
        );
        let served = engine.generate(long).unwrap().unwrap().generations;
        assert_eq!(served[0].tokens.len(), 12);
        assert_eq!(served[0].tokens, native[0].tokens);
    }

    /// Batches that take turns draw what each draws alone: two requests with different
    /// settings, decoded side by side in slices of one token, against each on an idle engine.
    #[test]
    fn batches_taking_turns_draw_what_each_draws_alone() {
        let (engine, tokenizer) = engine(Duration::ZERO);
        let works = [work(&tokenizer, 40, 3, 1.0), work(&tokenizer, 30, 2, 0.7)];
        let alone: Vec<_> = (works.iter())
            .map(|w| engine.generate(w.clone()).unwrap().unwrap().generations)
            .collect();
        let replies: Vec<_> = (works.iter())
            .map(|w| {
                let (reply, done) = channel();
                engine.tx.send(Message::Generate(w.clone(), reply)).unwrap();
                done
            })
            .collect();
        for (done, alone) in replies.into_iter().zip(alone) {
            assert!(alone.iter().all(|g| g.tokens.len() >= 30));
            assert_eq!(done.recv().unwrap().unwrap().generations, alone);
        }
    }
}
