//! Choosing the next token from a row of logits, as transformers does: temperature, then top-k,
//! top-p and min-p filtering, then a draw from the sequence's own seeded stream (so a
//! sequence's tokens do not depend on what else is in the batch). The returned log-probability
//! of each sampled token is under the temperature-scaled distribution before filtering,
//! `log softmax(z / T)`, which is what a policy-gradient loss recomputes.

use rein_core::SeededRng;

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
