//! Diagonal Gaussian distributions with a state-independent log standard deviation.
//!
//! ```text
//! log π(a) = Σ_d [ −(a_d − μ_d)² / (2σ_d²) − log σ_d − ½ log 2π ]        H = Σ_d [ ½ + ½ log 2π + log σ_d ]
//! ```

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use rein_core::SeededRng;

const HALF_LOG_2PI: f64 = 0.918_938_533_204_672_7;

/// Samples an action from means `mean` and log standard deviations `log_std` (one per
/// dimension), writing it into `out`, and returns its log-probability. `greedy` returns the mean.
pub fn sample_gaussian(mean: &[f32], log_std: &[f32], rng: &mut SeededRng, greedy: bool, out: &mut Vec<f32>) -> f32 {
    let mut logp = 0.0f64;
    for (&mu, &ls) in mean.iter().zip(log_std) {
        let noise = if greedy { 0.0 } else { rng.normal() };
        out.push((f64::from(mu) + f64::from(ls).exp() * noise) as f32);
        logp += -0.5 * noise * noise - f64::from(ls) - HALF_LOG_2PI;
    }
    logp as f32
}

/// Log-probabilities of `actions`.
///
/// # Shapes
/// - `mean`: `[batch, d]`, `log_std`: `[d]`, `actions`: `[batch, d]` → `[batch]`
pub fn gaussian_log_prob<B: Backend>(mean: Tensor<B, 2>, log_std: Tensor<B, 1>, actions: Tensor<B, 2>) -> Tensor<B, 1> {
    let log_std = log_std.unsqueeze_dim::<2>(0);
    let z = (actions - mean) * log_std.clone().neg().exp();
    (z.powi_scalar(2).mul_scalar(-0.5) - log_std.add_scalar(HALF_LOG_2PI))
        .sum_dim(1)
        .squeeze_dim(1)
}

/// Entropy (the same for every state).
///
/// # Shapes
/// - `log_std`: `[d]` → `[1]`
pub fn gaussian_entropy<B: Backend>(log_std: Tensor<B, 1>) -> Tensor<B, 1> {
    log_std.add_scalar(0.5 + HALF_LOG_2PI).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use proptest::prelude::*;

    type B = Flex;

    #[test]
    fn samples_have_the_right_moments() {
        let mut rng = SeededRng::new(0);
        let (mean, log_std) = ([1.0f32, -2.0], [0.0f32, (0.5f32).ln()]);
        let n = 100_000;
        let mut sums = [0.0f64; 2];
        let mut squares = [0.0f64; 2];
        for _ in 0..n {
            let mut a = Vec::new();
            sample_gaussian(&mean, &log_std, &mut rng, false, &mut a);
            for d in 0..2 {
                sums[d] += f64::from(a[d]);
                squares[d] += f64::from(a[d] - mean[d]).powi(2);
            }
        }
        assert!((sums[0] / n as f64 - 1.0).abs() < 0.02 && (sums[1] / n as f64 + 2.0).abs() < 0.02);
        assert!((squares[0] / n as f64 - 1.0).abs() < 0.02 && (squares[1] / n as f64 - 0.25).abs() < 0.01);
        let mut greedy = Vec::new();
        sample_gaussian(&mean, &log_std, &mut rng, true, &mut greedy);
        assert_eq!(greedy, mean.to_vec());
    }

    #[test]
    fn entropy_matches_the_closed_form() {
        let device = Default::default();
        let h = gaussian_entropy(Tensor::<B, 1>::from_floats([0.0, 1.0], &device)).into_scalar();
        let expected = 2.0 * (0.5 + HALF_LOG_2PI) + 1.0;
        assert!((f64::from(h) - expected).abs() < 1e-5);
    }

    proptest! {
        #[test]
        fn sampled_log_prob_equals_the_tensor_log_prob(
            mean in prop::collection::vec(-3.0f32..3.0, 1..4),
            log_std_base in -2.0f32..1.0,
            seed in 0u64..1000,
        ) {
            let d = mean.len();
            let log_std: Vec<f32> = (0..d).map(|i| log_std_base + 0.1 * i as f32).collect();
            let mut action = Vec::new();
            let logp = sample_gaussian(&mean, &log_std, &mut SeededRng::new(seed), false, &mut action);
            let device = Default::default();
            let row = |v: Vec<f32>| Tensor::<B, 2>::from_data(burn::tensor::TensorData::new(v, [1, d]), &device);
            let expected = gaussian_log_prob(row(mean.clone()), Tensor::from_data(burn::tensor::TensorData::new(log_std, [d]), &device), row(action))
                .into_scalar();
            prop_assert!((logp - expected).abs() < 1e-3 * (1.0 + expected.abs()), "{logp} vs {expected}");
        }
    }
}
