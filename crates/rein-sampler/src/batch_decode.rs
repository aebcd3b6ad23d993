//! Batched generation from a [`CausalLm`] with a KV cache.
//!
//! Prompts of different lengths are left-padded into one batch (each row's positions start at 0
//! on its first real token, so padding never changes a sequence's result). Each prompt is
//! prefilled once and its cache rows copied for its `n` samples (the GRPO group). Decoding then
//! feeds one token per live sequence; sequences that finish are dropped from the batch and the
//! cache, so they stop costing compute. Single-turn generation is one turn of a
//! [`crate::Session`], which multi-turn rollouts drive turn by turn; tokens are chosen as
//! [`crate::choose`] says.

use rein_model::ReinBackend;
use rein_model::lm::CausalLm;

use crate::session::{AfterTurn, Session, TurnOutput, prompt_seed};
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
    let n = config.n.max(1);
    let mut routes: Vec<Option<Vec<Vec<u32>>>> = Vec::new();
    let mut turns = match prompts.is_empty() || config.max_new_tokens == 0 {
        true => Vec::new(),
        false => {
            let mut session = Session::start_seeded(model, prompts, seeds, config, pad_id, device);
            let all: Vec<usize> = (0..session.len()).collect();
            let turns = session.turn(&all, AfterTurn::End, stop);
            let moe = model.config().moe().is_some();
            routes = all
                .iter()
                .map(|&seq| moe.then(|| session.routes(seq).to_vec()))
                .collect();
            turns
        }
    }
    .into_iter();
    let mut routes = routes.into_iter();
    (0..prompts.len() * n)
        .map(|i| {
            let turn = turns.next().unwrap_or(TurnOutput {
                tokens: Vec::new(),
                logprobs: Vec::new(),
                top_logprobs: Vec::new(),
                finish: FinishReason::Length,
            });
            Generation {
                prompt: i / n,
                sample: i % n,
                tokens: turn.tokens,
                logprobs: turn.logprobs,
                top_logprobs: turn.top_logprobs,
                finish: turn.finish,
                routes: routes.next().flatten(),
            }
        })
        .collect()
}
