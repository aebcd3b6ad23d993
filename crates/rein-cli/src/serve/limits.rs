//! What one generation request may ask for: the limits `rein serve`'s flags set, which the APIs
//! check before any work and the engine keeps its batches within.

use rein_model::lm::{LmConfig, kv_cache_bytes};

/// What one generation request may ask for, each limit named by its flag in the refusal.
#[derive(Clone, Debug)]
pub(crate) struct RequestLimits {
    /// Most tokens of a prompt and its completion together (`--max-model-len`).
    pub max_model_len: usize,
    /// Most sequences (prompts × `n`) in one request, and in flight (`--max-num-seqs`).
    pub max_num_seqs: usize,
    /// Most stop strings, and most stop token ids, in one request (`--max-stop-strings`).
    pub max_stop_strings: usize,
    /// Most bytes of one request's stop strings together (`--max-stop-bytes`).
    pub max_stop_bytes: usize,
    /// Most bytes of keys and values one request, and the batches in flight together, may hold
    /// (`--max-kv-cache-bytes`).
    pub max_kv_cache_bytes: u64,
    /// The served model's shapes, which size its cache.
    pub model: LmConfig,
}

impl RequestLimits {
    /// The keys and values `sequences` sequences of `prompts` prompts, the longest `longest`
    /// tokens, take with `max_new_tokens` new tokens each (the prompts' own prefill rows too).
    pub(crate) fn kv_bytes(&self, prompts: usize, sequences: usize, longest: usize, max_new_tokens: usize) -> u64 {
        let capacity = longest.max(1).saturating_add(max_new_tokens.max(1));
        kv_cache_bytes(&self.model, prompts.saturating_add(sequences), capacity)
    }
}
