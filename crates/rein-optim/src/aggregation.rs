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
