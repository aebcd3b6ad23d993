//! Categorical distributions over logits.
//!
//! ```text
//! π(a) = softmax(z)_a        log π(a) = z_a − logsumexp(z)        H = −Σ_a π(a) log π(a)
//! ```

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, activation};

use rein_core::SeededRng;

/// Samples an action from one row of logits and returns it with its log-probability.
/// `greedy` takes the most likely action instead (ties go to the lowest index).
pub fn sample_categorical(logits: &[f32], rng: &mut SeededRng, greedy: bool) -> (u32, f32) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&z| f64::from(z - max).exp()).sum();
    let log_z = f64::from(max) + sum.ln();
    let action = if greedy {
        logits
            .iter()
            .enumerate()
            .fold(0, |best, (i, &z)| if z > logits[best] { i } else { best })
    } else {
        let mut u = rng.uniform() * sum;
        let mut chosen = logits.len() - 1;
        for (i, &z) in logits.iter().enumerate() {
            u -= f64::from(z - max).exp();
            if u < 0.0 {
                chosen = i;
                break;
            }
        }
        chosen
    };
    (action as u32, (f64::from(logits[action]) - log_z) as f32)
}

/// Log-probabilities of `actions` under `logits`.
///
/// # Shapes
/// - `logits`: `[batch, n]`, `actions`: `[batch]` → `[batch]`
pub fn categorical_log_prob<B: Backend>(logits: Tensor<B, 2>, actions: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    activation::log_softmax(logits, 1)
        .gather(1, actions.unsqueeze_dim(1))
        .squeeze_dim(1)
}

/// Entropy of each row.
///
/// # Shapes
/// - `logits`: `[batch, n]` → `[batch]`
pub fn categorical_entropy<B: Backend>(logits: Tensor<B, 2>) -> Tensor<B, 1> {
    let log_p = activation::log_softmax(logits, 1);
    (log_p.clone().exp() * log_p).sum_dim(1).squeeze_dim(1).neg()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use proptest::prelude::*;

    type B = Flex;

    #[test]
    fn frequencies_follow_the_softmax() {
        let logits = [0.0f32, (2.0f32).ln(), (3.0f32).ln()]; // probabilities 1/6, 2/6, 3/6
        let mut rng = SeededRng::new(0);
        let mut counts = [0usize; 3];
        for _ in 0..60_000 {
            let (a, logp) = sample_categorical(&logits, &mut rng, false);
            counts[a as usize] += 1;
            let expected = ((a + 1) as f32 / 6.0).ln();
            assert!((logp - expected).abs() < 1e-5);
        }
        for (i, c) in counts.iter().enumerate() {
            let expected = 10_000.0 * (i + 1) as f64;
            assert!((*c as f64 - expected).abs() < 0.03 * expected, "{counts:?}");
        }
        assert_eq!(sample_categorical(&logits, &mut rng, true).0, 2);
    }

    #[test]
    fn tensor_log_prob_and_entropy_match_the_definitions() {
        let device = Default::default();
        let logits = Tensor::<B, 2>::from_floats([[0.0, (2.0f32).ln(), (3.0f32).ln()], [0.0, 0.0, 0.0]], &device);
        let actions = Tensor::<B, 1, Int>::from_ints([1, 2], &device);
        let logp = categorical_log_prob(logits.clone(), actions)
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        assert!((logp[0] - (2.0f32 / 6.0).ln()).abs() < 1e-6);
        assert!((logp[1] - (1.0f32 / 3.0).ln()).abs() < 1e-6);
        let h = categorical_entropy(logits).into_data().to_vec::<f32>().unwrap();
        let p = [1.0f32 / 6.0, 2.0 / 6.0, 3.0 / 6.0];
        assert!((h[0] - -p.iter().map(|p| p * p.ln()).sum::<f32>()).abs() < 1e-6);
        assert!((h[1] - 3.0f32.ln()).abs() < 1e-6);
    }

    proptest! {
        #[test]
        fn sampled_log_prob_equals_the_tensor_log_prob(
            logits in prop::collection::vec(-10.0f32..10.0, 2..8),
            seed in 0u64..1000,
        ) {
            let mut rng = SeededRng::new(seed);
            let (a, logp) = sample_categorical(&logits, &mut rng, false);
            prop_assert!((a as usize) < logits.len());
            let device = Default::default();
            let t = Tensor::<B, 2>::from_data(burn::tensor::TensorData::new(logits.clone(), [1, logits.len()]), &device);
            let expected = categorical_log_prob(t, Tensor::from_ints([a as i32], &device)).into_scalar();
            prop_assert!((logp - expected).abs() < 1e-4, "{logp} vs {expected}");
        }
    }
}
