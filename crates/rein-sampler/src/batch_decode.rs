//! Batched generation from a [`CausalLm`] with a KV cache.
//!
//! Prompts of different lengths are left-padded into one batch (each row's positions start at 0
//! on its first real token, so padding never changes a sequence's result). Each prompt is
//! prefilled once and its cache rows copied for its `n` samples (the GRPO group). Decoding then
//! feeds one token per live sequence; sequences that finish are dropped from the batch and the
//! cache, so they stop costing compute. Single-turn generation is one turn of a
//! [`crate::Session`], which multi-turn rollouts drive turn by turn; tokens are chosen as
//! [`crate::choose`] says. [`Decoding`] is the same generation taken a few steps at a time.

use rein_model::ReinBackend;
use rein_model::lm::CausalLm;

use crate::session::{AfterTurn, Prefill, PromptImages, Session, Turn, TurnOutput, prompt_seed};
use crate::token_choice::{FinishReason, GenerationConfig};

/// One generated sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Index of its prompt.
    pub prompt: usize,
    /// Which of the prompt's `n` samples it is.
    pub sample: usize,
    /// The generated tokens (not the prompt).
    pub tokens: Vec<u32>,
    /// Log-probability of each generated token (see [`crate::choose`]).
    pub logprobs: Vec<f32>,
    /// The most likely tokens at each generated position, when `top_logprobs` was asked for
    /// (see [`crate::top_logprobs`]); empty otherwise.
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    /// How sure the model was at each generated position, when `certainty` was asked for (see
    /// [`crate::TokenCertainty`]); empty otherwise, and from a server.
    pub certainty: Vec<crate::TokenCertainty>,
    /// Why it ended.
    pub finish: FinishReason,
    /// A mixture of experts' routing of the tokens the sampler fed through the model — the
    /// prompt, then every generated token but the last — per decoder layer (`tokens × k`, empty
    /// for dense layers); `None` for a dense model or a sampler that does not report it (a server).
    pub routes: Option<Vec<Vec<u32>>>,
}

/// Generates `config.n` continuations of each prompt: one turn of a [`Session`], each sequence
/// leaving the cache as it finishes. `pad_id` fills left padding (any id works; padding is
/// masked). `stop(seq_index, tokens)` may end a sequence early (stop strings); `seq_index` is
/// `prompt * n + sample`.
pub fn generate<B: ReinBackend>(
    model: &CausalLm<B>,
    prompts: &[Vec<u32>],
    config: &GenerationConfig,
    pad_id: u32,
    stop: &mut dyn FnMut(usize, &[u32]) -> bool,
    device: &B::Device,
) -> Vec<Generation> {
    let seeds: Vec<u64> = (0..prompts.len()).map(|p| prompt_seed(config.seed, p)).collect();
    generate_seeded(model, prompts, &seeds, config, pad_id, stop, device)
}

/// [`generate`] with each prompt's own seed (see [`Session::start_seeded`]): what a server
/// batching several requests together runs.
pub fn generate_seeded<B: ReinBackend>(
    model: &CausalLm<B>,
    prompts: &[Vec<u32>],
    seeds: &[u64],
    config: &GenerationConfig,
    pad_id: u32,
    stop: &mut dyn FnMut(usize, &[u32]) -> bool,
    device: &B::Device,
) -> Vec<Generation> {
    let mut decoding = Decoding::in_chunks(model, prompts, seeds, config, pad_id, usize::MAX, device);
    decoding.advance(usize::MAX, stop);
    decoding.into_generations()
}

/// [`generate`] for a vision-language model's decoder: the prompts' image tokens read `images`'
/// features (from the model's vision encoder) as they are prefilled. An error when the prompts
/// hold a different number of image tokens than there are features.
pub fn generate_with_images<B: ReinBackend>(
    model: &CausalLm<B>,
    prompts: &[Vec<u32>],
    images: PromptImages<B>,
    config: &GenerationConfig,
    pad_id: u32,
    stop: &mut dyn FnMut(usize, &[u32]) -> bool,
    device: &B::Device,
) -> Result<Vec<Generation>, String> {
    let seeds: Vec<u64> = (0..prompts.len()).map(|p| prompt_seed(config.seed, p)).collect();
    let mut decoding =
        Decoding::in_chunks(model, prompts, &seeds, config, pad_id, usize::MAX, device).with_images(images)?;
    decoding.advance(usize::MAX, stop);
    Ok(decoding.into_generations())
}

/// [`generate_seeded`] a few steps at a time: a server decoding several batches in turn, so a
/// long one does not hold up the others. The slices draw the same tokens as one call; a
/// prefill in chunks ([`Decoding::in_chunks`]) computes the same logits within float rounding.
pub struct Decoding<'m, B: ReinBackend> {
    stage: Stage<'m, B>,
    prompts: usize,
    n: usize,
    /// Whether the model is a mixture of experts (its routing is reported).
    moe: bool,
}

enum Stage<'m, B: ReinBackend> {
    Prefill(Prefill<'m, B>),
    /// With the turn under way.
    Turn(Session<'m, B>, Turn),
    /// Nothing to decode (no prompts, or no new tokens).
    Empty,
}

impl<'m, B: ReinBackend> Decoding<'m, B> {
    /// A generation whose prompts (left-padded into one batch) [`Decoding::advance`] prefills
    /// `chunk` columns per step before it decodes: prompts up to `chunk` tokens (all of them
    /// with `usize::MAX`) in one pass, as [`Session::start_seeded`] does.
    pub fn in_chunks(
        model: &'m CausalLm<B>,
        prompts: &[Vec<u32>],
        seeds: &[u64],
        config: &GenerationConfig,
        pad_id: u32,
        chunk: usize,
        device: &B::Device,
    ) -> Self {
        let stage = match prompts.is_empty() || config.max_new_tokens == 0 {
            true => Stage::Empty,
            false => Stage::Prefill(Prefill::new(model, prompts, seeds, config, pad_id, chunk, device)),
        };
        Self {
            stage,
            prompts: prompts.len(),
            n: config.n.max(1),
            moe: model.config().moe().is_some(),
        }
    }

    /// The same generation with `images` in its prompts ([`Prefill::with_images`]); an error
    /// when the prompts hold a different number of image tokens than there are features.
    pub fn with_images(mut self, images: PromptImages<B>) -> Result<Self, String> {
        if let Stage::Prefill(prefill) = self.stage {
            self.stage = Stage::Prefill(prefill.with_images(images)?);
        }
        Ok(self)
    }

    /// Runs at most `steps` more steps — a chunk of the prefill, or one new token of every
    /// sequence not yet finished — and says whether all have finished. `stop` as in [`generate`].
    pub fn advance(&mut self, steps: usize, stop: &mut dyn FnMut(usize, &[u32]) -> bool) -> bool {
        let mut left = steps;
        while left > 0 {
            match &mut self.stage {
                Stage::Prefill(prefill) => {
                    left -= 1;
                    if prefill.advance() {
                        self.begin_turn();
                    }
                }
                Stage::Turn(session, turn) => return session.continue_turn(turn, left, AfterTurn::End, stop),
                Stage::Empty => return true,
            }
        }
        false
    }

    /// From the prefill (fed whole, if it is not yet) to the turn; nothing at a later stage.
    fn begin_turn(&mut self) {
        self.stage = match std::mem::replace(&mut self.stage, Stage::Empty) {
            Stage::Prefill(prefill) => {
                let session = prefill.into_session();
                let turn = session.begin_turn(&(0..session.len()).collect::<Vec<_>>());
                Stage::Turn(session, turn)
            }
            later => later,
        };
    }

    /// The generations, in the order `prompt * n + sample` (cut short where not finished).
    pub fn into_generations(mut self) -> Vec<Generation> {
        self.begin_turn();
        let (turns, routes) = match self.stage {
            Stage::Turn(session, turn) => {
                let routes: Vec<_> = (0..session.len())
                    .map(|seq| self.moe.then(|| session.routes(seq).to_vec()))
                    .collect();
                (turn.into_outputs(), routes)
            }
            _ => (Vec::new(), Vec::new()),
        };
        let (mut turns, mut routes) = (turns.into_iter(), routes.into_iter());
        (0..self.prompts * self.n)
            .map(|i| {
                let turn = turns.next().unwrap_or(TurnOutput {
                    tokens: Vec::new(),
                    logprobs: Vec::new(),
                    top_logprobs: Vec::new(),
                    certainty: Vec::new(),
                    finish: FinishReason::Length,
                });
                Generation {
                    prompt: i / self.n,
                    sample: i % self.n,
                    tokens: turn.tokens,
                    logprobs: turn.logprobs,
                    top_logprobs: turn.top_logprobs,
                    certainty: turn.certainty,
                    finish: turn.finish,
                    routes: routes.next().flatten(),
                }
            })
            .collect()
    }
}
