//! Reducing a `[batch, tokens]` loss to a scalar over the completion tokens.
//!
//! ```text
//! token-mean                (DAPO, Yu et al. 2025):      Σ_i Σ_t m_it ℓ_it / Σ_i Σ_t m_it
//! seq-mean-token-mean       (GRPO, Shao et al. 2024):    1/B Σ_i (Σ_t m_it ℓ_it / Σ_t m_it)
//! seq-mean-token-sum-norm   (Dr. GRPO, Liu et al. 2025): Σ_i Σ_t m_it ℓ_it / (B · L_max)
//! ```
//! These are TRL's `dapo`, `grpo` and `dr_grpo` loss types.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use rein_core::Aggregation;

/// Aggregates `loss` over the tokens where `mask` is 1.
///
/// # Shapes
/// - `loss`, `mask`: `[batch, tokens]` → `[1]`; `max_len` is `L_max` for `SeqMeanTokenSumNorm`.
pub fn aggregate<B: Backend>(loss: Tensor<B, 2>, mask: Tensor<B, 2>, how: Aggregation, max_len: usize) -> Tensor<B, 1> {
    let [batch, _] = loss.dims();
    let masked = loss * mask.clone();
    match how {
        Aggregation::TokenMean => masked.sum().div(mask.sum().clamp_min(1.0)),
        Aggregation::SeqMeanTokenMean => {
            let per_seq = masked.sum_dim(1).div(mask.sum_dim(1).clamp_min(1.0));
            per_seq.mean().reshape([1])
        }
        Aggregation::SeqMeanTokenSumNorm => masked.sum().div_scalar((batch * max_len.max(1)) as f32),
    }
}

/// The sizes of a batch, or of a share of its rows, that [`share_weight`] reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Counted {
    /// Rows (completions).
    pub rows: usize,
    /// Σ m: the tokens that count in the loss.
    pub tokens: f32,
}

/// The weight that makes a share of a batch's rows add up to the batch: for shares `s` that
/// partition the rows, `Σ_s share_weight(how, s, whole) · aggregate(loss_s, mask_s, how, L)`
/// is `aggregate(loss, mask, how, L)`, up to the order of the additions. Token-mean shares weigh
/// their counted tokens (`Σ m_s / Σ m`); the two sequence means weigh their rows (`B_s / B`).
/// This is how a batch split across devices keeps the one-device loss and gradient.
pub fn share_weight(how: Aggregation, share: Counted, whole: Counted) -> f32 {
    match how {
        Aggregation::TokenMean => share.tokens / whole.tokens.max(1.0),
        Aggregation::SeqMeanTokenMean | Aggregation::SeqMeanTokenSumNorm => {
            share.rows as f32 / whole.rows.max(1) as f32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::TensorData;
    use proptest::prelude::*;

    type B = Flex;

    fn tensor(values: &[f32], rows: usize) -> Tensor<B, 2> {
        Tensor::from_data(
            TensorData::new(values.to_vec(), [rows, values.len() / rows]),
            &Default::default(),
        )
    }

    fn scalar(t: Tensor<B, 1>) -> f32 {
        t.into_data().to_vec::<f32>().unwrap()[0]
    }

    /// Hand calculation, two rows of three tokens, the second row's last token masked:
    /// token-mean (1+2+3+4+5)/5 = 3; seq-mean (2 + 4.5)/2 = 3.25; sum-norm 15/(2·4) = 1.875.
    #[test]
    fn each_aggregation_matches_its_equation() {
        let (loss, mask) = (
            tensor(&[1., 2., 3., 4., 5., 6.], 2),
            tensor(&[1., 1., 1., 1., 1., 0.], 2),
        );
        let value = |how| scalar(aggregate(loss.clone(), mask.clone(), how, 4));
        assert_eq!(value(Aggregation::TokenMean), 3.0);
        assert_eq!(value(Aggregation::SeqMeanTokenMean), 3.25);
        assert_eq!(value(Aggregation::SeqMeanTokenSumNorm), 1.875);
    }

    proptest! {
        /// Any split of the rows into contiguous shares, each aggregated alone and weighted by
        /// `share_weight`, adds up to the whole batch's aggregate (rows with no counted token
        /// included).
        #[test]
        fn weighted_shares_add_up_to_the_whole_batch(
            rows in 1usize..9,
            width in 1usize..6,
            cuts in proptest::collection::vec(0usize..9, 0..4),
            seed in any::<u64>(),
        ) {
            let mut state = seed | 1;
            let mut next = || { state ^= state << 13; state ^= state >> 7; state ^= state << 17; state };
            let loss: Vec<f32> = (0..rows * width).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
            let mask: Vec<f32> = (0..rows * width).map(|_| (next() % 3).min(1) as f32).collect();
            let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c % (rows + 1)).chain([0, rows]).collect();
            bounds.sort_unstable();
            bounds.dedup();
            let counted = |r: std::ops::Range<usize>| Counted {
                rows: r.len(),
                tokens: mask[r.start * width..r.end * width].iter().sum(),
            };
            for how in [Aggregation::TokenMean, Aggregation::SeqMeanTokenMean, Aggregation::SeqMeanTokenSumNorm] {
                let whole = scalar(aggregate(tensor(&loss, rows), tensor(&mask, rows), how, 7));
                let shares: f32 = bounds.windows(2).map(|b| {
                    let (r, cells) = (b[0]..b[1], b[0] * width..b[1] * width);
                    let value = aggregate(tensor(&loss[cells.clone()], r.len()), tensor(&mask[cells], r.len()), how, 7);
                    scalar(value) * share_weight(how, counted(r), counted(0..rows))
                }).sum();
                prop_assert!((whole - shares).abs() <= 1e-5 * whole.abs().max(1.0), "{how:?}: {whole} vs {shares} over {bounds:?}");
            }
        }
    }
}
