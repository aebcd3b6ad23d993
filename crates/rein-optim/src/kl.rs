//! Per-token estimators of KL(π_θ ‖ π_ref) from samples of π_θ (Schulman 2020,
//! <http://joschu.net/blog/kl-approx.html>), with `log r = log π_ref − log π_θ`:
//!
//! ```text
//! k1 = −log r            (unbiased, can be negative)
//! k2 = ½ (log r)²        (biased, low variance)
//! k3 = r − 1 − log r     (unbiased, always ≥ 0; GRPO's choice)
//! ```

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use rein_core::KlEstimator;

/// The per-token KL estimate.
///
/// # Shapes
/// - `log_prob`, `ref_log_prob`: `[batch, tokens]` → same
pub fn kl_estimate<B: Backend, const D: usize>(
    log_prob: Tensor<B, D>,
    ref_log_prob: Tensor<B, D>,
    estimator: KlEstimator,
) -> Tensor<B, D> {
    let log_r = ref_log_prob - log_prob;
    match estimator {
        KlEstimator::K1 => log_r.neg(),
        KlEstimator::K2 => log_r.powi_scalar(2).mul_scalar(0.5),
        KlEstimator::K3 => log_r.clone().exp() - log_r - 1.0,
    }
}

/// The same estimators on plain numbers (for folding KL into rewards).
pub fn kl_estimate_scalar(log_prob: f32, ref_log_prob: f32, estimator: KlEstimator) -> f32 {
    let log_r = ref_log_prob - log_prob;
    match estimator {
        KlEstimator::K1 => -log_r,
        KlEstimator::K2 => 0.5 * log_r * log_r,
        KlEstimator::K3 => log_r.exp() - 1.0 - log_r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::TensorData;
    use proptest::prelude::*;

    fn t(v: &[f32]) -> Tensor<Flex, 1> {
        Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), &Default::default())
    }

    proptest! {
        #[test]
        fn k3_is_non_negative_and_all_vanish_when_policies_match(
            logp in prop::collection::vec(-10.0f32..0.0, 1..32),
            shift in prop::collection::vec(-3.0f32..3.0, 32),
        ) {
            let reference: Vec<f32> = logp.iter().zip(&shift).map(|(a, b)| a + b).collect();
            let k3: Vec<f32> = kl_estimate(t(&logp), t(&reference), KlEstimator::K3).into_data().to_vec().unwrap();
            prop_assert!(k3.iter().all(|&k| k >= -1e-6), "{k3:?}");
            for estimator in [KlEstimator::K1, KlEstimator::K2, KlEstimator::K3] {
                let same: Vec<f32> = kl_estimate(t(&logp), t(&logp), estimator).into_data().to_vec().unwrap();
                prop_assert!(same.iter().all(|&k| k == 0.0), "{estimator:?}: {same:?}");
                prop_assert_eq!(kl_estimate_scalar(logp[0], logp[0], estimator), 0.0);
            }
            for (i, &k) in k3.iter().enumerate() {
                prop_assert!((k - kl_estimate_scalar(logp[i], reference[i], KlEstimator::K3)).abs() < 1e-4);
            }
        }
    }
}
