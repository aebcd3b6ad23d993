//! SAC's squashed Gaussian ([`squashed_gaussian`](crate::squashed_gaussian)) on one row of
//! plain values, with its gradient by hand, for networks trained without autodiff:
//!
//! ```text
//! log σ = log σ_min + ½(log σ_max − log σ_min)(tanh(ℓ) + 1)
//! u = μ + σ ε,   y = tanh(u),   a = s_a y + b_a
//! log π = Σⱼ [ −εⱼ²/2 − log σⱼ − ½ log 2π − log(s_a (1 − yⱼ²) + 10⁻⁶) ]
//! ```
//!
//! and, for upstream gradients `∂a` and `∂log π` (ε is a constant: the reparameterisation),
//!
//! ```text
//! ∂u = ∂a s_a (1 − y²) + ∂log π · 2 s_a y (1 − y²) / (s_a (1 − y²) + 10⁻⁶)
//! ∂μ = ∂u,   ∂log σ = ∂u σ ε − ∂log π,   ∂ℓ = ∂log σ · ½(log σ_max − log σ_min)(1 − tanh²(ℓ))
//! ```

use crate::soft_actor_critic::{HALF_LOG_TWO_PI, LOG_STD_MAX, LOG_STD_MIN};

/// One row's draw: the action into `action` (`[act]`), and `log π(a|s)`.
///
/// `mean`, `raw_log_std`, `eps`, `scale`, `bias`, `action`: one value per action dimension.
pub fn squashed_gaussian_row(
    mean: &[f32],
    raw_log_std: &[f32],
    eps: &[f32],
    [scale, bias]: [&[f32]; 2],
    action: &mut [f32],
) -> f32 {
    let mut log_prob = 0.0;
    for j in 0..mean.len() {
        let log_std = bounded(raw_log_std[j]);
        let y = (mean[j] + log_std.exp() * eps[j]).tanh();
        action[j] = y * scale[j] + bias[j];
        let gaussian = eps[j] * eps[j] * -0.5 - log_std - HALF_LOG_TWO_PI;
        let jacobian = ((-(y * y) + 1.0) * scale[j] + 1e-6).ln();
        log_prob += gaussian - jacobian;
    }
    log_prob
}

/// The gradient of one row's draw with respect to the actor's outputs: given `∂a` (`d_action`)
/// and `∂log π` (`d_log_prob`), writes `∂μ` into `d_mean` and `∂ℓ` into `d_raw`.
pub fn squashed_gaussian_row_backward(
    mean: &[f32],
    raw_log_std: &[f32],
    eps: &[f32],
    scale: &[f32],
    (d_action, d_log_prob): (&[f32], f32),
    [d_mean, d_raw]: [&mut [f32]; 2],
) {
    for j in 0..mean.len() {
        let t = raw_log_std[j].tanh();
        let log_std = bounded(raw_log_std[j]);
        let std = log_std.exp();
        let y = (mean[j] + std * eps[j]).tanh();
        let slope = 1.0 - y * y;
        let d_u = d_action[j] * scale[j] * slope + d_log_prob * 2.0 * scale[j] * y * slope / (scale[j] * slope + 1e-6);
        d_mean[j] = d_u;
        let d_log_std = d_u * std * eps[j] - d_log_prob;
        d_raw[j] = d_log_std * (0.5 * (LOG_STD_MAX - LOG_STD_MIN)) * (1.0 - t * t);
    }
}

/// [`bounded_log_std`](crate::bounded_log_std) of one value.
fn bounded(raw: f32) -> f32 {
    (raw.tanh() + 1.0) * (0.5 * (LOG_STD_MAX - LOG_STD_MIN)) + LOG_STD_MIN
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{Tensor, TensorData};
    use proptest::prelude::*;

    use super::*;
    use crate::{bounded_log_std, squashed_gaussian};

    type A = Autodiff<Flex>;

    fn t2(v: &[f32], cols: usize) -> Tensor<A, 2> {
        Tensor::from_data(TensorData::new(v.to_vec(), [v.len() / cols, cols]), &Default::default())
    }

    fn t1(v: &[f32]) -> Tensor<A, 1> {
        Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), &Default::default())
    }

    fn close(a: f32, b: f32) -> bool {
        (a - b).abs() <= 2e-5 * (1.0 + b.abs())
    }

    proptest! {
        /// The row functions give the tensor functions' action and log-probability, and the
        /// gradient burn's autodiff takes of `Σ c ⊙ a + k log π` through them.
        #[test]
        fn equal_the_tensor_functions_and_their_autodiff(
            row in proptest::collection::vec((-3.0f32..3.0, -4.0f32..4.0, -2.5f32..2.5, 0.2f32..3.0, -1.0f32..1.0), 1..4),
            c in proptest::collection::vec(-2.0f32..2.0, 3),
            k in -1.5f32..1.5,
        ) {
            let act = row.len();
            let field = |f: fn(&(f32, f32, f32, f32, f32)) -> f32| row.iter().map(f).collect::<Vec<f32>>();
            let (mean, raw, eps) = (field(|r| r.0), field(|r| r.1), field(|r| r.2));
            let (scale, bias) = (field(|r| r.3), field(|r| r.4));
            let c = &c[..act];

            let mean_t = t2(&mean, act).require_grad();
            let raw_t = t2(&raw, act).require_grad();
            let sample = squashed_gaussian(
                mean_t.clone(),
                bounded_log_std(raw_t.clone()),
                t2(&eps, act),
                t1(&scale),
                t1(&bias),
            );
            let loss = (sample.action.clone() * t2(c, act)).sum() + sample.log_prob.clone().sum() * k;
            let grads = loss.backward();
            let burn_action: Vec<f32> = sample.action.inner().into_data().to_vec().unwrap();
            let burn_log_prob: Vec<f32> = sample.log_prob.inner().into_data().to_vec().unwrap();
            let burn_d_mean: Vec<f32> = mean_t.grad(&grads).unwrap().into_data().to_vec().unwrap();
            let burn_d_raw: Vec<f32> = raw_t.grad(&grads).unwrap().into_data().to_vec().unwrap();

            let mut action = vec![0.0; act];
            let log_prob = squashed_gaussian_row(&mean, &raw, &eps, [&scale, &bias], &mut action);
            prop_assert!(close(log_prob, burn_log_prob[0]), "log π {log_prob} vs {}", burn_log_prob[0]);
            for j in 0..act {
                prop_assert!(close(action[j], burn_action[j]), "a[{j}] {} vs {}", action[j], burn_action[j]);
            }
            let (mut d_mean, mut d_raw) = (vec![0.0; act], vec![0.0; act]);
            squashed_gaussian_row_backward(&mean, &raw, &eps, &scale, (c, k), [&mut d_mean, &mut d_raw]);
            for j in 0..act {
                prop_assert!(close(d_mean[j], burn_d_mean[j]), "∂μ[{j}] {} vs {}", d_mean[j], burn_d_mean[j]);
                prop_assert!(close(d_raw[j], burn_d_raw[j]), "∂ℓ[{j}] {} vs {}", d_raw[j], burn_d_raw[j]);
            }
        }
    }
}
