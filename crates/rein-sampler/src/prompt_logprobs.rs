//! Teacher-forced log-probabilities of a prompt's own tokens: what OpenAI's `echo` with
//! `logprobs` returns and what lm-evaluation-harness's loglikelihood tasks sum. One forward pass
//! over the prompt (no cache), its logits read a few rows at a time, each row scored on the host
//! as [`crate::choose`] scores a sampled token.

use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, HEAD_CHUNK_BYTES};

use crate::token_choice::token_logprob_with_top;

/// One prompt token scored given the tokens before it.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoredToken {
    /// Its log-probability under `softmax(z / T)` (`T = 1` when greedy).
    pub logprob: f32,
    /// The most likely tokens at its position, with their log-probabilities (see
    /// [`crate::top_logprobs`]); empty when none were asked for.
    pub top: Vec<(u32, f32)>,
}

/// Scores tokens `1..` of `prompt` (the first has nothing before it to be predicted from), with
/// the `top` most likely tokens at each position, under `softmax(z / temperature)`.
pub fn prompt_logprobs<B: ReinBackend>(
    model: &CausalLm<B>,
    prompt: &[u32],
    temperature: f32,
    top: usize,
    device: &B::Device,
) -> Vec<ScoredToken> {
    let len = prompt.len();
    if len < 2 {
        return Vec::new();
    }
    let hidden = model.padded_hidden(&[prompt], 0, device);
    // Rows 0..len-1 predict tokens 1..len; a chunk's logits are at most HEAD_CHUNK_BYTES.
    let vocab = model.config().vocab_size;
    let chunk = (HEAD_CHUNK_BYTES / (4 * vocab.max(1))).max(1);
    let mut scored = Vec::with_capacity(len - 1);
    for start in (0..len - 1).step_by(chunk) {
        let rows = chunk.min(len - 1 - start);
        let logits = model.logits(hidden.clone().narrow(1, start, rows));
        let logits = logits.into_data().convert::<f32>().to_vec::<f32>().unwrap_or_default();
        for (r, row) in logits.chunks_exact(vocab).enumerate() {
            let target = prompt[start + r + 1];
            let (logprob, top) = token_logprob_with_top(row, temperature, target, top);
            scored.push(ScoredToken { logprob, top });
        }
    }
    scored
}
