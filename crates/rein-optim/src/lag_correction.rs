//! Correcting the loss for completions another policy sampled: an older version (asynchronous
//! training) or the same weights in another engine (an inference server's kernels).
//!
//! ```text
//! ρ_it = π_trainer(y_t|…) / π_sampler(y_t|…)          token level
//! ρ_i  = Π_t ρ_it  (for every token of completion i)    sequence level
//! TIS:    ℓ_it ← min(ρ, C) · ℓ_it                        (Yao et al. 2025, truncated importance sampling)
//! IcePop: ℓ_it ← 1[low ≤ ρ ≤ high] · ℓ_it                (Ling team 2025, masked importance sampling)
//! ```
//! With a correction the PPO ratio's denominator becomes the trainer's own log-probabilities
//! before the update (π_trainer, "proximal"), so clipping bounds the update and ρ bounds the
//! off-policyness (decoupled PPO, AReaL). The weight is non-negative, so it multiplies the
//! advantages: `min(w·ρA, clip(w)·ρA) = ρ·min(w·A, clip(w)·A)`.
//!
//! Whatever the correction, the mismatch is measured: k3 of KL(π_sampler ‖ π_trainer) on the
//! sampled tokens, `mean(ρ − 1 − log ρ)`, and the shares of tokens masked or capped.

use rein_core::{LagCorrection, RatioLevel};

/// The correction's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Correction {
    /// None, TIS or IcePop.
    pub kind: LagCorrection,
    /// Token or sequence ratios.
    pub level: RatioLevel,
    /// TIS's cap C.
    pub tis_cap: f32,
    /// IcePop's `[low, high]`.
    pub icepop_bounds: [f32; 2],
}

/// Per-token factors for a batch and what they say about the mismatch.
#[derive(Debug, Clone, PartialEq)]
pub struct Corrected {
    /// Multiplies each token's advantage (`[rows, width]`, 1 without TIS).
    pub weights: Vec<f32>,
    /// Multiplies the loss mask (`[rows, width]`, 0 where IcePop masks).
    pub keep: Vec<f32>,
    /// k3 estimate of KL(π_sampler ‖ π_trainer) per token.
    pub mismatch_kl: f64,
    /// Share of the masked-in tokens IcePop masked out.
    pub masked_frac: f64,
    /// Share of the masked-in tokens whose TIS weight was capped.
    pub capped_frac: f64,
}

/// The correction for `[rows, width]` log-probabilities of the trainer and the sampler over
/// the tokens where `mask` is 1.
pub fn lag_correction(trainer: &[f32], sampler: &[f32], mask: &[f32], width: usize, c: &Correction) -> Corrected {
    let width = width.max(1);
    let log_ratio: Vec<f64> = (trainer.iter().zip(sampler).zip(mask))
        .map(|((&t, &s), &m)| if m > 0.0 { f64::from(t) - f64::from(s) } else { 0.0 })
        .collect();
    let tokens = mask.iter().filter(|&&m| m > 0.0).count().max(1) as f64;
    let mismatch_kl = log_ratio.iter().map(|&l| l.exp() - 1.0 - l).sum::<f64>() / tokens;
    let level_log_ratio: Vec<f64> = match c.level {
        RatioLevel::Token => log_ratio,
        RatioLevel::Sequence => log_ratio
            .chunks(width)
            .flat_map(|row| std::iter::repeat_n(row.iter().sum::<f64>(), row.len()))
            .collect(),
    };
    let mut out = Corrected {
        weights: vec![1.0; mask.len()],
        keep: vec![1.0; mask.len()],
        mismatch_kl,
        masked_frac: 0.0,
        capped_frac: 0.0,
    };
    let (mut masked, mut capped) = (0usize, 0usize);
    for (i, &l) in level_log_ratio.iter().enumerate() {
        if mask[i] <= 0.0 {
            continue;
        }
        let ratio = l.exp();
        match c.kind {
            LagCorrection::None => {}
            LagCorrection::Tis => {
                let cap = f64::from(c.tis_cap);
                capped += usize::from(ratio > cap);
                out.weights[i] = ratio.min(cap) as f32;
            }
            LagCorrection::Icepop => {
                let [low, high] = c.icepop_bounds.map(f64::from);
                if !(low..=high).contains(&ratio) {
                    out.keep[i] = 0.0;
                    masked += 1;
                }
            }
        }
    }
    out.masked_frac = masked as f64 / tokens;
    out.capped_frac = capped as f64 / tokens;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn correction(kind: LagCorrection, level: RatioLevel) -> Correction {
        Correction {
            kind,
            level,
            tis_cap: 2.0,
            icepop_bounds: [0.5, 2.0],
        }
    }

    /// Hand calculation: ratios e^{ln 3} = 3, e^0 = 1, e^{ln 0.25} = 0.25 on one row.
    #[test]
    fn tis_caps_and_icepop_masks_token_ratios() {
        let trainer = [3f32.ln(), 0.0, 0.25f32.ln(), 9.0];
        let sampler = [0.0; 4];
        let mask = [1.0, 1.0, 1.0, 0.0];
        let tis = lag_correction(
            &trainer,
            &sampler,
            &mask,
            4,
            &correction(LagCorrection::Tis, RatioLevel::Token),
        );
        assert_eq!(tis.weights, vec![2.0, 1.0, 0.25, 1.0]);
        assert_eq!(tis.keep, vec![1.0; 4]);
        assert!((tis.capped_frac - 1.0 / 3.0).abs() < 1e-12);
        let pop = lag_correction(
            &trainer,
            &sampler,
            &mask,
            4,
            &correction(LagCorrection::Icepop, RatioLevel::Token),
        );
        assert_eq!(pop.weights, vec![1.0; 4]);
        assert_eq!(pop.keep, vec![0.0, 1.0, 0.0, 1.0]);
        assert!((pop.masked_frac - 2.0 / 3.0).abs() < 1e-12);
        // k3 = mean(ρ − 1 − ln ρ) over the three tokens.
        let k3 = ((3.0 - 1.0 - 3f64.ln()) + 0.0 + (0.25 - 1.0 - 0.25f64.ln())) / 3.0;
        assert!((tis.mismatch_kl - k3).abs() < 1e-6, "{} vs {k3}", tis.mismatch_kl);
    }

    /// A sequence's ratio is the product of its tokens' (padding excluded).
    #[test]
    fn sequence_ratios_multiply_over_the_completion() {
        let trainer = [0.5f32.ln(), 0.5f32.ln(), 0.0, 2f32.ln()];
        let sampler = [0.0; 4];
        let mask = [1.0, 1.0, 0.0, 1.0];
        let c = correction(LagCorrection::Tis, RatioLevel::Sequence);
        let out = lag_correction(&trainer, &sampler, &mask, 2, &c);
        assert!((out.weights[0] - 0.25).abs() < 1e-6 && (out.weights[1] - 0.25).abs() < 1e-6);
        assert!((out.weights[3] - 2.0).abs() < 1e-6);
    }

    proptest! {
        /// Identical policies: nothing is corrected and the mismatch is 0.
        #[test]
        fn identical_policies_need_no_correction(lp in prop::collection::vec(-20f32..0.0, 1..64)) {
            for kind in [LagCorrection::None, LagCorrection::Tis, LagCorrection::Icepop] {
                let mask = vec![1.0; lp.len()];
                let out = lag_correction(&lp, &lp, &mask, lp.len(), &correction(kind, RatioLevel::Token));
                prop_assert!(out.weights.iter().all(|&w| w == 1.0));
                prop_assert!(out.keep.iter().all(|&k| k == 1.0));
                prop_assert_eq!(out.mismatch_kl, 0.0);
            }
        }

        /// TIS weights never exceed the cap, IcePop keeps exactly the in-bound ratios, k3 ≥ 0.
        #[test]
        fn weights_respect_their_bounds(
            pairs in prop::collection::vec((-10f32..0.0, -10f32..0.0, prop::bool::ANY), 1..64),
        ) {
            let trainer: Vec<f32> = pairs.iter().map(|p| p.0).collect();
            let sampler: Vec<f32> = pairs.iter().map(|p| p.1).collect();
            let mask: Vec<f32> = pairs.iter().map(|p| f32::from(u8::from(p.2))).collect();
            let tis = lag_correction(&trainer, &sampler, &mask, 8, &correction(LagCorrection::Tis, RatioLevel::Token));
            prop_assert!(tis.weights.iter().all(|&w| (0.0..=2.0).contains(&w)));
            prop_assert!(tis.mismatch_kl >= 0.0);
            let pop = lag_correction(&trainer, &sampler, &mask, 8, &correction(LagCorrection::Icepop, RatioLevel::Token));
            for i in 0..pairs.len() {
                let ratio = (f64::from(trainer[i]) - f64::from(sampler[i])).exp();
                let kept = mask[i] == 0.0 || (0.5..=2.0).contains(&ratio);
                prop_assert_eq!(pop.keep[i] == 1.0, kept);
            }
        }
    }
}
