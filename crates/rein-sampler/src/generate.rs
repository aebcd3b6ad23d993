//! Batched generation from a [`CausalLm`] with a KV cache.
//!
//! Prompts of different lengths are left-padded into one batch (each row's positions start at 0
//! on its first real token, so padding never changes a sequence's result). Each prompt is
//! prefilled once and its cache rows copied for its `n` samples (the GRPO group). Decoding then
//! feeds one token per live sequence; sequences that finish are dropped from the batch and the
//! cache, so they stop costing compute.
//!
//! Token choice, per sequence, in transformers' order: temperature, then top-k, top-p and min-p
//! filtering, then a draw from the sequence's own seeded stream (so a sequence's tokens do not
//! depend on what else is in the batch). The returned log-probability of each sampled token is
//! under the temperature-scaled distribution before filtering, `log softmax(z / T)`, which is
//! what a policy-gradient loss recomputes.

use burn::tensor::{Int, Tensor, TensorData};
use rayon::prelude::*;
use rein_model::Backend;
use rein_model::lm::{CausalLm, Context, FusedProjections, KvCache, Rope};

use crate::rng::SeededRng;

/// How to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationConfig {
    /// Most tokens to generate per sequence.
    pub max_new_tokens: usize,
    /// Softmax temperature; `0` means greedy.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches `p`.
    pub top_p: Option<f32>,
    /// Keep tokens at least `min_p` times as likely as the most likely one.
    pub min_p: Option<f32>,
    /// Samples per prompt.
    pub n: usize,
    /// Tokens that end a sequence (kept as its last token).
    pub stop_token_ids: Vec<u32>,
    /// Seed of every sequence's stream.
    pub seed: u64,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        Self {
            max_new_tokens: 64,
            temperature: 1.0,
            top_k: None,
            top_p: None,
            min_p: None,
            n: 1,
            stop_token_ids: Vec::new(),
            seed: 0,
        }
    }
}

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// It produced a stop token (the last token).
    StopToken,
    /// The caller's stop check matched (e.g. a stop string).
    StopCondition,
    /// It reached `max_new_tokens`.
    Length,
}

/// One generated sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Index of its prompt.
    pub prompt: usize,
    /// Which of the prompt's `n` samples it is.
    pub sample: usize,
    /// The generated tokens (not the prompt).
    pub tokens: Vec<u32>,
    /// Log-probability of each generated token (see the module docs).
    pub logprobs: Vec<f32>,
    /// Why it ended.
    pub finish: FinishReason,
}

/// Generates `config.n` continuations of each prompt. `pad_id` fills left padding (any id
/// works; padding is masked). `stop(seq_index, tokens)` may end a sequence early (stop strings);
/// `seq_index` is `prompt * n + sample`.
pub fn generate<B: Backend>(
    model: &CausalLm<B>,
    prompts: &[Vec<u32>],
    config: &GenerationConfig,
    pad_id: u32,
    stop: &mut dyn FnMut(usize, &[u32]) -> bool,
    device: &B::Device,
) -> Vec<Generation> {
    let n = config.n.max(1);
    let mut out: Vec<Generation> = (0..prompts.len() * n)
        .map(|i| Generation {
            prompt: i / n,
            sample: i % n,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            finish: FinishReason::Length,
        })
        .collect();
    if prompts.is_empty() || config.max_new_tokens == 0 {
        return out;
    }
    let width = prompts.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let rope = model.rope(width + config.max_new_tokens, device);
    let fused = model.fused_projections();
    let mut cache = KvCache::new(model.config(), prompts.len(), width + config.max_new_tokens, device);

    // Prefill every prompt once, left-padded.
    let (tokens, positions, padding) = left_pad(prompts, width, pad_id);
    let any_padding = padding.iter().any(|&p| p);
    let p = prompts.len();
    let ctx = Context {
        rope: &rope,
        positions: Tensor::from_data(TensorData::new(positions, [p, width]), device),
        padding: any_padding.then(|| {
            Tensor::<B, 2, Int>::from_data(
                TensorData::new(padding.iter().map(|&b| i64::from(b)).collect::<Vec<_>>(), [p, width]),
                device,
            )
            .bool()
        }),
        fused: Some(&fused),
    };
    let hidden = model.hidden(
        Tensor::from_data(TensorData::new(tokens, [p, width]), device),
        &ctx,
        Some(&mut cache),
    );
    let last = model.logits(hidden.narrow(1, width - 1, 1));
    let last: Vec<f32> = last.into_data().convert::<f32>().to_vec().unwrap_or_default();
    let vocab = model.config().vocab_size;

    // One cache row per sequence.
    let rows: Vec<usize> = (0..p * n).map(|i| i / n).collect();
    if n > 1 {
        cache.retain(&rows);
    }
    let logits: Vec<f32> = rows
        .iter()
        .flat_map(|&r| last[r * vocab..(r + 1) * vocab].iter().copied())
        .collect();
    let positions: Vec<i64> = rows.iter().map(|&r| prompts[r].len() as i64).collect();
    let mut rngs: Vec<SeededRng> = (0..p * n).map(|i| sequence_rng(config.seed, i / n, i % n)).collect();
    let mut shards = Shard::split(
        cache,
        (0..p * n).collect(),
        positions,
        logits,
        vocab,
        B::decode_shards(p * n),
    );

    for step in 0..config.max_new_tokens {
        for shard in &mut shards {
            let mut keep = Vec::with_capacity(shard.seqs.len());
            shard.next.clear();
            for (row, &seq) in shard.seqs.iter().enumerate() {
                let (token, logprob) = choose(&shard.logits[row * vocab..(row + 1) * vocab], config, &mut rngs[seq]);
                let g = &mut out[seq];
                g.tokens.push(token);
                g.logprobs.push(logprob);
                let finish = if config.stop_token_ids.contains(&token) {
                    Some(FinishReason::StopToken)
                } else if stop(seq, &g.tokens) {
                    Some(FinishReason::StopCondition)
                } else if step + 1 == config.max_new_tokens {
                    Some(FinishReason::Length)
                } else {
                    None
                };
                match finish {
                    Some(reason) => g.finish = reason,
                    None => {
                        shard.next.push(i64::from(token));
                        keep.push(row);
                    }
                }
            }
            shard.keep(&keep);
        }
        shards.retain(|shard| !shard.seqs.is_empty());
        if shards.is_empty() {
            break;
        }
        let decode = |shard: &mut Shard<B>| shard.decode(model, &rope, &fused, device);
        if shards.len() > 1 {
            shards.par_iter_mut().for_each(decode);
        } else {
            shards.iter_mut().for_each(decode);
        }
    }
    out
}

/// A slice of the live sequences with its own key/value cache, decoded on its own thread when
/// the backend asks for more than one (see [`Backend::decode_shards`]).
struct Shard<B: Backend> {
    /// Sequence indices, one per cache row.
    seqs: Vec<usize>,
    /// Position of each row's next token.
    positions: Vec<i64>,
    /// The next token of each row.
    next: Vec<i64>,
    /// `[rows, vocab]`, row-major: the logits of each row's next token.
    logits: Vec<f32>,
    cache: KvCache<B>,
}

impl<B: Backend> Shard<B> {
    /// Splits the rows of `cache` (sequences `seqs`) into at most `count` shards of
    /// contiguous rows.
    fn split(
        cache: KvCache<B>,
        seqs: Vec<usize>,
        positions: Vec<i64>,
        logits: Vec<f32>,
        vocab: usize,
        count: usize,
    ) -> Vec<Self> {
        let rows = seqs.len();
        let count = count.clamp(1, rows.max(1));
        if count == 1 {
            return vec![Self {
                seqs,
                positions,
                next: Vec::new(),
                logits,
                cache,
            }];
        }
        let size = rows.div_ceil(count);
        (0..rows)
            .step_by(size)
            .map(|start| {
                let range = start..(start + size).min(rows);
                let mut shard_cache = cache.clone();
                shard_cache.retain(&range.clone().collect::<Vec<_>>());
                Self {
                    seqs: seqs[range.clone()].to_vec(),
                    positions: positions[range.clone()].to_vec(),
                    next: Vec::new(),
                    logits: logits[range.start * vocab..range.end * vocab].to_vec(),
                    cache: shard_cache,
                }
            })
            .collect()
    }

    /// Keeps only the rows at `keep` (finished sequences leave the cache).
    fn keep(&mut self, keep: &[usize]) {
        if keep.len() != self.seqs.len() {
            self.cache.retain(keep);
            self.seqs = keep.iter().map(|&r| self.seqs[r]).collect();
            self.positions = keep.iter().map(|&r| self.positions[r]).collect();
        }
    }

    /// Feeds each row's next token and stores the logits that follow.
    fn decode(&mut self, model: &CausalLm<B>, rope: &Rope<B>, fused: &FusedProjections<B>, device: &B::Device) {
        let rows = self.seqs.len();
        let ctx = Context {
            rope,
            positions: Tensor::from_data(TensorData::new(self.positions.clone(), [rows, 1]), device),
            padding: None,
            fused: Some(fused),
        };
        let tokens = Tensor::from_data(TensorData::new(std::mem::take(&mut self.next), [rows, 1]), device);
        let logits = model.forward(tokens, &ctx, Some(&mut self.cache));
        self.logits = logits.into_data().convert::<f32>().to_vec().unwrap_or_default();
        for position in &mut self.positions {
            *position += 1;
        }
    }
}

/// Left-pads `prompts` to `width`: tokens, positions (0 at each row's first real token) and
/// the padding flags, all `[prompts, width]` row-major.
fn left_pad(prompts: &[Vec<u32>], width: usize, pad_id: u32) -> (Vec<i64>, Vec<i64>, Vec<bool>) {
    let mut tokens = Vec::with_capacity(prompts.len() * width);
    let mut positions = Vec::with_capacity(prompts.len() * width);
    let mut padding = Vec::with_capacity(prompts.len() * width);
    for prompt in prompts {
        let pad = width - prompt.len();
        for j in 0..width {
            tokens.push(i64::from(if j < pad { pad_id } else { prompt[j - pad] }));
            positions.push(j.saturating_sub(pad) as i64);
            padding.push(j < pad);
        }
    }
    (tokens, positions, padding)
}

/// The stream of sample `sample` of prompt `prompt`: independent of batch composition.
fn sequence_rng(seed: u64, prompt: usize, sample: usize) -> SeededRng {
    SeededRng::new(
        seed ^ (prompt as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (sample as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F).rotate_left(17),
    )
}

/// Picks the next token from one row of logits, returning it and its log-probability under
/// `softmax(z / T)` (`T = 1` when greedy).
pub fn choose(logits: &[f32], config: &GenerationConfig, rng: &mut SeededRng) -> (u32, f32) {
    let greedy = config.temperature <= 0.0;
    let t = if greedy { 1.0 } else { config.temperature };
    let scaled: Vec<f32> = logits.iter().map(|&z| z / t).collect();
    let max = scaled.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = scaled.iter().map(|&z| f64::from(z - max).exp()).collect();
    let log_z = max as f64 + weights.iter().sum::<f64>().ln();
    let token = if greedy {
        scaled
            .iter()
            .enumerate()
            .fold(0, |best, (i, &z)| if z > scaled[best] { i } else { best })
    } else if filters(config, scaled.len()) {
        draw(allowed_tokens(&scaled, config).into_iter(), &weights, rng)
    } else {
        // Nothing is filtered out: draw in vocabulary order, without sorting.
        draw(0..scaled.len(), &weights, rng)
    };
    (token as u32, (f64::from(scaled[token]) - log_z) as f32)
}

/// Whether top-k, top-p or min-p can remove any of `vocab` tokens.
fn filters(config: &GenerationConfig, vocab: usize) -> bool {
    config.top_k.is_some_and(|k| k < vocab)
        || config.top_p.is_some_and(|p| p < 1.0)
        || config.min_p.is_some_and(|p| p > 0.0)
}

/// Draws one of `tokens` with probability proportional to its weight.
fn draw(tokens: impl Iterator<Item = usize> + Clone, weights: &[f64], rng: &mut SeededRng) -> usize {
    let mut u = rng.uniform() * tokens.clone().map(|i| weights[i]).sum::<f64>();
    let mut chosen = 0;
    for i in tokens {
        chosen = i;
        u -= weights[i];
        if u < 0.0 {
            break;
        }
    }
    chosen
}

/// The tokens that survive top-k, top-p and min-p filtering (in that order) of temperature-
/// scaled logits, most likely first. Never empty: the most likely token always survives.
pub fn allowed_tokens(scaled: &[f32], config: &GenerationConfig) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scaled.len()).collect();
    order.sort_by(|&a, &b| scaled[b].total_cmp(&scaled[a]).then(a.cmp(&b)));
    if let Some(k) = config.top_k {
        order.truncate(k.max(1));
    }
    let max = scaled[order[0]];
    let probs: Vec<f64> = {
        let w: Vec<f64> = order.iter().map(|&i| f64::from(scaled[i] - max).exp()).collect();
        let total: f64 = w.iter().sum();
        w.into_iter().map(|x| x / total).collect()
    };
    let mut keep = order.len();
    if let Some(p) = config.top_p {
        let mut cumulative = 0.0;
        for (i, q) in probs.iter().enumerate() {
            cumulative += q;
            if cumulative >= f64::from(p) {
                keep = keep.min(i + 1);
                break;
            }
        }
    }
    if let Some(min_p) = config.min_p {
        let threshold = f64::from(min_p) * probs[0];
        keep = keep.min(probs.iter().take_while(|&&q| q >= threshold).count().max(1));
    }
    order.truncate(keep.max(1));
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config() -> GenerationConfig {
        GenerationConfig::default()
    }

    #[test]
    fn filters_keep_what_they_promise() {
        let logits = [3.0f32, 2.0, 1.0, 0.0, -1.0];
        let top2 = allowed_tokens(
            &logits,
            &GenerationConfig {
                top_k: Some(2),
                ..config()
            },
        );
        assert_eq!(top2, vec![0, 1]);
        // p = [0.636, 0.234, 0.086, 0.032, 0.012]
        let top_p = allowed_tokens(
            &logits,
            &GenerationConfig {
                top_p: Some(0.8),
                ..config()
            },
        );
        assert_eq!(top_p, vec![0, 1]);
        let min_p = allowed_tokens(
            &logits,
            &GenerationConfig {
                min_p: Some(0.1),
                ..config()
            },
        );
        assert_eq!(min_p, vec![0, 1, 2]);
        let everything = allowed_tokens(&logits, &config());
        assert_eq!(everything.len(), 5);
    }

    #[test]
    fn greedy_takes_the_argmax_with_its_log_prob() {
        let logits = [0.0f32, 2.0, 1.0];
        let (token, logprob) = choose(
            &logits,
            &GenerationConfig {
                temperature: 0.0,
                ..config()
            },
            &mut SeededRng::new(0),
        );
        assert_eq!(token, 1);
        let expected = 2.0 - (1.0f64 + 2f64.exp() + 1f64.exp()).ln();
        assert!((f64::from(logprob) - expected).abs() < 1e-6);
    }

    proptest! {
        #[test]
        fn samples_never_leave_the_filtered_set(
            logits in prop::collection::vec(-8.0f32..8.0, 2..64),
            top_k in prop::option::of(1usize..10),
            top_p in prop::option::of(0.05f32..1.0),
            min_p in prop::option::of(0.0f32..0.5),
            temperature in 0.1f32..2.0,
            seed in 0u64..1000,
        ) {
            let config = GenerationConfig { temperature, top_k, top_p, min_p, ..config() };
            let scaled: Vec<f32> = logits.iter().map(|z| z / temperature).collect();
            let allowed = allowed_tokens(&scaled, &config);
            prop_assert!(!allowed.is_empty());
            if let Some(k) = top_k { prop_assert!(allowed.len() <= k); }
            let mut rng = SeededRng::new(seed);
            for _ in 0..20 {
                let (token, logprob) = choose(&logits, &config, &mut rng);
                prop_assert!(allowed.contains(&(token as usize)), "{token} not in {allowed:?}");
                prop_assert!(logprob <= 1e-6);
            }
        }

        #[test]
        fn log_probs_are_log_softmax_of_scaled_logits(
            logits in prop::collection::vec(-8.0f32..8.0, 2..64),
            temperature in 0.1f32..2.0,
            seed in 0u64..1000,
        ) {
            let config = GenerationConfig { temperature, ..config() };
            let (token, logprob) = choose(&logits, &config, &mut SeededRng::new(seed));
            let scaled: Vec<f64> = logits.iter().map(|&z| f64::from(z / temperature)).collect();
            let log_z = scaled.iter().map(|z| z.exp()).sum::<f64>().ln();
            prop_assert!((f64::from(logprob) - (scaled[token as usize] - log_z)).abs() < 1e-4);
        }
    }
}
