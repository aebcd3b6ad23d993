//! Rewards with no labels: the host scores each completion by how sure the policy was while it
//! sampled it, from the sampler's own statistics of every generated position
//! ([`rein_sampler::TokenCertainty`], over `p = softmax(z / T)`).
//!
//! ```text
//! self_certainty(y)   = (1/|y|) Σ_t (log Σ_j exp(z_tj/T) − (1/V) Σ_j z_tj/T)     (Intuitor)
//! negative_entropy(y) = −(1/|y|) Σ_t H(p_t)                                      (RENT)
//! ```
//!
//! Intuitor (Zhao et al. 2025, "Learning to Reason without External Rewards") rewards the first,
//! which is the mean `KL(U ‖ p_t)` plus the constant `log V`, as its code computes it; RENT
//! (Prabhudesai et al. 2025, "Maximizing Confidence Alone Improves Reasoning") the second. Both
//! are a completion's mean over its generated tokens; within a group the constant cancels in
//! GRPO's advantages. Majority vote, the third label-free signal, is a plugin (`majority-vote`).

use rein_core::SamplerSignal;
use rein_sampler::TokenCertainty;

use crate::rewards::GroupReward;

/// A signal in the reward sum (`[[reward]] signal = …`).
#[derive(Debug, Clone, PartialEq)]
pub struct SignalReward {
    /// Its name in metrics (`reward[i].name`, default the signal's).
    pub name: String,
    /// Its weight in the sum.
    pub weight: f64,
    /// Which statistic.
    pub signal: SamplerSignal,
}

/// `signal` of one completion from the certainty of each of its tokens (see the module docs);
/// `None` for a completion with no token.
pub fn signal_score(signal: SamplerSignal, tokens: &[TokenCertainty]) -> Option<f64> {
    if tokens.is_empty() {
        return None;
    }
    let mean = |value: fn(&TokenCertainty) -> f32| {
        tokens.iter().map(|t| f64::from(value(t))).sum::<f64>() / tokens.len() as f64
    };
    Some(match signal {
        SamplerSignal::SelfCertainty => mean(|t| t.self_certainty),
        SamplerSignal::NegativeEntropy => -mean(|t| t.entropy),
    })
}

/// Adds each signal's weighted score to the totals of `scores` (one per group of `g`
/// completions, in the order of `certainty`), and its value to the components under its name.
pub(crate) fn add_signal_rewards<'a>(
    scores: &mut [GroupReward],
    certainty: impl Iterator<Item = &'a [TokenCertainty]>,
    g: usize,
    signals: &[SignalReward],
) {
    let certainty: Vec<&[TokenCertainty]> = certainty.collect();
    for (scored, group) in scores.iter_mut().zip(certainty.chunks(g)) {
        for reward in signals {
            let values = (scored.components)
                .entry(reward.name.clone())
                .or_insert_with(|| vec![f64::NAN; group.len()]);
            for (c, tokens) in group.iter().enumerate() {
                if let Some(v) = signal_score(reward.signal, tokens) {
                    values[c] = v;
                    scored.total[c] += reward.weight * v;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(entropy: f32, self_certainty: f32) -> TokenCertainty {
        TokenCertainty {
            entropy,
            self_certainty,
        }
    }

    #[test]
    fn each_signal_is_a_mean_over_the_completions_tokens() {
        let tokens = [token(1.0, 5.0), token(3.0, 7.0)];
        assert_eq!(signal_score(SamplerSignal::SelfCertainty, &tokens), Some(6.0));
        assert_eq!(signal_score(SamplerSignal::NegativeEntropy, &tokens), Some(-2.0));
        assert_eq!(signal_score(SamplerSignal::SelfCertainty, &[]), None);
    }

    #[test]
    fn signals_add_their_weighted_scores_and_log_their_values() {
        let completions = [
            vec![token(1.0, 5.0)],
            vec![],
            vec![token(0.5, 6.0)],
            vec![token(2.0, 4.0)],
        ];
        let mut scores: Vec<GroupReward> = (0..2)
            .map(|_| GroupReward {
                total: vec![1.0; 2],
                ..GroupReward::default()
            })
            .collect();
        let signals = [
            SignalReward {
                name: "sure".into(),
                weight: 0.5,
                signal: SamplerSignal::SelfCertainty,
            },
            SignalReward {
                name: "calm".into(),
                weight: 2.0,
                signal: SamplerSignal::NegativeEntropy,
            },
        ];
        add_signal_rewards(&mut scores, completions.iter().map(Vec::as_slice), 2, &signals);
        assert_eq!(scores[0].total, [1.0 + 2.5 - 2.0, 1.0]);
        assert_eq!(scores[1].total, [1.0 + 3.0 - 1.0, 1.0 + 2.0 - 4.0]);
        assert!(scores[0].components["sure"][1].is_nan(), "no token, no score");
        assert_eq!(scores[1].components["calm"], [-0.5, -2.0]);
    }
}
