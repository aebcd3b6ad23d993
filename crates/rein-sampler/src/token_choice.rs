//! Choosing the next token from a row of logits, as transformers does: temperature, then top-k,
//! top-p and min-p filtering, then a draw from the sequence's own seeded stream (so a
//! sequence's tokens do not depend on what else is in the batch). The returned log-probability
//! of each sampled token is under the temperature-scaled distribution before filtering,
//! `log softmax(z / T)`, which is what a policy-gradient loss recomputes.

use rein_core::{SamplerPrecision, SeededRng};

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
    /// How many of the most likely tokens to record, with their log-probabilities, at each
    /// generated position (0: none; see [`top_logprobs`]).
    pub top_logprobs: usize,
    /// How products with weights kept as quantised codes are computed (exact by default).
    pub precision: SamplerPrecision,
    /// Record each generated position's [`TokenCertainty`] (the sampler's own statistics that
    /// label-free rewards are computed from).
    pub certainty: bool,
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
            top_logprobs: 0,
            precision: SamplerPrecision::Exact,
            certainty: false,
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

/// How sure the model was at one generated position, from the distribution the token was drawn
/// from, `p = softmax(z / T)` (`T = 1` when greedy), over a vocabulary of `V` tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenCertainty {
    /// Its entropy `H(p) = −Σ_j p_j log p_j`, in nats (RENT's signal).
    pub entropy: f32,
    /// Its self-certainty `log Σ_j exp(z_j/T) − (1/V) Σ_j z_j/T`, which is `KL(U ‖ p) + log V`
    /// (Intuitor's `self_certainty_from_logits`: how far `p` is from the uniform `U`, up to the
    /// constant `log V`).
    pub self_certainty: f32,
}

/// The [`TokenCertainty`] of one row of logits at `temperature`.
pub fn token_certainty(logits: &[f32], temperature: f32) -> TokenCertainty {
    Distribution::new(logits, temperature).certainty()
}

/// Picks the next token from one row of logits, returning it and its log-probability under
/// `softmax(z / T)` (`T = 1` when greedy).
pub fn choose(logits: &[f32], config: &GenerationConfig, rng: &mut SeededRng) -> (u32, f32) {
    Distribution::new(logits, config.temperature).choose(config, rng)
}

/// One position's draw and what the config asks to record of it.
pub(crate) struct Choice {
    /// The token and its log-probability ([`choose`]).
    pub(crate) sampled: (u32, f32),
    /// The `config.top_logprobs` most likely tokens ([`top_logprobs`]).
    pub(crate) top: Vec<(u32, f32)>,
    /// With `config.certainty`, how sure the model was.
    pub(crate) certainty: Option<TokenCertainty>,
}

/// The [`Choice`] at one row of logits, from one softmax over it.
pub(crate) fn choose_with_extras(logits: &[f32], config: &GenerationConfig, rng: &mut SeededRng) -> Choice {
    let distribution = Distribution::new(logits, config.temperature);
    Choice {
        sampled: distribution.choose(config, rng),
        top: distribution.top(config.top_logprobs),
        certainty: config.certainty.then(|| distribution.certainty()),
    }
}

/// The `k` most likely tokens of a row of logits, most likely first (ties: the lower id), with
/// their log-probabilities under `softmax(z / T)` (`T = 1` when greedy) — the same numbers
/// [`choose`] gives the token it samples, so the sampled token's entry equals its log-probability.
pub fn top_logprobs(logits: &[f32], temperature: f32, k: usize) -> Vec<(u32, f32)> {
    match k.min(logits.len()) {
        0 => Vec::new(),
        k => Distribution::new(logits, temperature).top(k),
    }
}

/// The log-probability of `token` under `softmax(z / T)` (`T = 1` when greedy), as [`choose`]
/// computes it: what a teacher-forced pass reports for a token it did not sample.
pub fn token_logprob(logits: &[f32], temperature: f32, token: u32) -> f32 {
    Distribution::new(logits, temperature).logprob(token as usize)
}

/// [`token_logprob`] and [`top_logprobs`] of one row, from one pass over it.
pub(crate) fn token_logprob_with_top(logits: &[f32], temperature: f32, token: u32, k: usize) -> (f32, Vec<(u32, f32)>) {
    let distribution = Distribution::new(logits, temperature);
    (distribution.logprob(token as usize), distribution.top(k))
}

/// A row of logits as the distribution tokens are drawn from: `z / T` (`T = 1` when greedy), the
/// unnormalised weights `exp(z / T − max)` and the log-partition `log Σ exp(z / T)`, in f64.
struct Distribution {
    greedy: bool,
    scaled: Vec<f32>,
    weights: Vec<f64>,
    log_z: f64,
}

impl Distribution {
    fn new(logits: &[f32], temperature: f32) -> Self {
        let greedy = temperature <= 0.0;
        let t = if greedy { 1.0 } else { temperature };
        let scaled: Vec<f32> = logits.iter().map(|&z| z / t).collect();
        let max = scaled.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let weights: Vec<f64> = scaled.iter().map(|&z| f64::from(z - max).exp()).collect();
        let log_z = max as f64 + weights.iter().sum::<f64>().ln();
        Self {
            greedy,
            scaled,
            weights,
            log_z,
        }
    }

    /// `log softmax(z / T)` of token `i`.
    fn logprob(&self, i: usize) -> f32 {
        (f64::from(self.scaled[i]) - self.log_z) as f32
    }

    /// Entropy and self-certainty (see [`TokenCertainty`]), in f64 from the weights already
    /// computed: with `w_j = exp(s_j − max)` and `W = Σ w_j`, `p_j = w_j / W`, so
    /// `H = log Z − Σ_j p_j s_j`.
    fn certainty(&self) -> TokenCertainty {
        let total: f64 = self.weights.iter().sum();
        let expected: f64 = (self.weights.iter().zip(&self.scaled))
            .map(|(w, &s)| w * f64::from(s))
            .sum::<f64>()
            / total;
        let mean = self.scaled.iter().map(|&s| f64::from(s)).sum::<f64>() / self.scaled.len() as f64;
        TokenCertainty {
            entropy: (self.log_z - expected).max(0.0) as f32,
            self_certainty: (self.log_z - mean) as f32,
        }
    }

    fn choose(&self, config: &GenerationConfig, rng: &mut SeededRng) -> (u32, f32) {
        let scaled = &self.scaled;
        let token = if self.greedy {
            scaled
                .iter()
                .enumerate()
                .fold(0, |best, (i, &z)| if z > scaled[best] { i } else { best })
        } else if filters(config, scaled.len()) {
            draw(allowed_tokens(scaled, config).into_iter(), &self.weights, rng)
        } else {
            // Nothing is filtered out: draw in vocabulary order, without sorting.
            draw(0..scaled.len(), &self.weights, rng)
        };
        (token as u32, self.logprob(token))
    }

    fn top(&self, k: usize) -> Vec<(u32, f32)> {
        let k = k.min(self.scaled.len());
        if k == 0 {
            return Vec::new();
        }
        let scaled = &self.scaled;
        let more_likely = |a: &usize, b: &usize| scaled[*b].total_cmp(&scaled[*a]).then(a.cmp(b));
        let mut order: Vec<usize> = (0..scaled.len()).collect();
        if k < order.len() {
            order.select_nth_unstable_by(k - 1, more_likely);
            order.truncate(k);
        }
        order.sort_unstable_by(more_likely);
        order.into_iter().map(|i| (i as u32, self.logprob(i))).collect()
    }
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

        #[test]
        fn top_logprobs_are_the_k_largest_in_order_and_agree_with_choose(
            logits in prop::collection::vec(-8.0f32..8.0, 1..64),
            temperature in 0.0f32..2.0,
            k in 0usize..24,
            seed in 0u64..1000,
        ) {
            let top = top_logprobs(&logits, temperature, k);
            prop_assert_eq!(top.len(), k.min(logits.len()));
            // Sorted by log-probability (ties by id), and nothing left out beats the last kept.
            for pair in top.windows(2) {
                prop_assert!(pair[0].1 > pair[1].1 || (pair[0].1 == pair[1].1 && pair[0].0 < pair[1].0));
            }
            if let Some(&(_, last)) = top.last() {
                for (id, &_z) in logits.iter().enumerate() {
                    if !top.iter().any(|&(t, _)| t as usize == id) {
                        prop_assert!(token_logprob(&logits, temperature, id as u32) <= last);
                    }
                }
            }
            let total: f64 = top.iter().map(|&(_, lp)| f64::from(lp).exp()).sum();
            prop_assert!(total <= 1.0 + 1e-5);
            // The sampled token's log-probability is the same number in either place.
            let config = GenerationConfig { temperature, ..config() };
            let (token, logprob) = choose(&logits, &config, &mut SeededRng::new(seed));
            prop_assert_eq!(token_logprob(&logits, temperature, token), logprob);
            let everything = top_logprobs(&logits, temperature, logits.len());
            prop_assert!(everything.contains(&(token, logprob)));
            if temperature == 0.0 {
                prop_assert_eq!(everything[0].0, token, "greedy takes the most likely token");
            }
        }
    }
}
