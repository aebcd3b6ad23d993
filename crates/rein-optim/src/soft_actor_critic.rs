//! Soft actor-critic's losses (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and
//! Applications", <https://arxiv.org/abs/1812.05905>), as CleanRL's `sac_continuous_action.py`
//! computes them:
//!
//! ```text
//! policy   log σ = log σ_min + ½(log σ_max − log σ_min)(tanh(ℓ) + 1)      (ℓ: the actor's raw output)
//!          u = μ + σ ε,  ε ~ N(0, 1)                                        (reparameterised)
//!          a = s_a tanh(u) + b_a                                            (scaled to the action box)
//!          log π(a|s) = Σⱼ [ log N(uⱼ; μⱼ, σⱼ) − log(s_a (1 − tanh²(uⱼ)) + 10⁻⁶) ]
//! critic   y = r + γ (1 − d) ( min(Q̄₁, Q̄₂)(s', a') − α log π(a'|s') ),   a' ~ π(·|s')
//!          L_Q = mean((Q₁(s, a) − y)²) + mean((Q₂(s, a) − y)²)
//! actor    L_π = mean( α log π(ã|s) − min(Q₁, Q₂)(s, ã) ),               ã ~ π(·|s)
//! alpha    L_α = mean( −exp(log α) (log π(ã|s) + H̄) ),                    H̄ = −dim(A)
//! ```
//!
//! `log N(u; μ, σ) = −ε²/2 − log σ − ½ log 2π`: `(u − μ)/σ` is `ε` exactly, so this is the
//! density PyTorch's `Normal.log_prob(rsample())` computes, without the round trip. The noise
//! `ε` is an argument: the trainer draws it, a parity test gives CleanRL's.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// CleanRL's (and SpinUp's) bounds on the policy's log standard deviation.
pub const LOG_STD_MIN: f32 = -5.0;
/// See [`LOG_STD_MIN`].
pub const LOG_STD_MAX: f32 = 2.0;

/// `½ log 2π`.
pub(crate) const HALF_LOG_TWO_PI: f32 = 0.918_938_5;

/// An action drawn from the tanh-squashed Gaussian policy, with its log-probability.
#[derive(Debug, Clone)]
pub struct SquashedSample<B: Backend> {
    /// `a = s_a tanh(u) + b_a`, inside the action box. `[batch, act]`
    pub action: Tensor<B, 2>,
    /// `log π(a|s)`, summed over action dimensions. `[batch]`
    pub log_prob: Tensor<B, 1>,
}

/// `log σ` from the actor's raw output `ℓ`: `log σ_min + ½(log σ_max − log σ_min)(tanh(ℓ) + 1)`.
pub fn bounded_log_std<B: Backend>(raw: Tensor<B, 2>) -> Tensor<B, 2> {
    (raw.tanh() + 1.0) * (0.5 * (LOG_STD_MAX - LOG_STD_MIN)) + LOG_STD_MIN
}

/// Draws `a = s_a tanh(μ + σ ε) + b_a` and its log-probability under the squashed Gaussian.
///
/// # Shapes
/// `mean`, `log_std`, `eps`: `[batch, act]`; `scale`, `bias`: `[act]` (half the box's width
/// and its centre).
pub fn squashed_gaussian<B: Backend>(
    mean: Tensor<B, 2>,
    log_std: Tensor<B, 2>,
    eps: Tensor<B, 2>,
    scale: Tensor<B, 1>,
    bias: Tensor<B, 1>,
) -> SquashedSample<B> {
    let u = mean + log_std.clone().exp() * eps.clone();
    let y = u.tanh();
    let scale = scale.unsqueeze::<2>();
    let action = y.clone() * scale.clone() + bias.unsqueeze::<2>();
    let gaussian = eps.powi_scalar(2) * -0.5 - log_std - HALF_LOG_TWO_PI;
    let jacobian = ((-y.powi_scalar(2) + 1.0) * scale + 1e-6).log();
    let log_prob = (gaussian - jacobian).sum_dim(1).squeeze_dim::<1>(1);
    SquashedSample { action, log_prob }
}

/// The soft Bellman target `y = r + γ (1 − d) (min(Q̄₁, Q̄₂) − α log π(a'|s'))` (no gradient
/// flows through it).
///
/// # Shapes
/// All `[batch]`; `dones` is 1 where the transition terminated (not where it was truncated).
pub fn soft_q_target<B: Backend>(
    rewards: Tensor<B, 1>,
    dones: Tensor<B, 1>,
    gamma: f32,
    target_q1: Tensor<B, 1>,
    target_q2: Tensor<B, 1>,
    alpha: f32,
    next_log_prob: Tensor<B, 1>,
) -> Tensor<B, 1> {
    let soft_value = target_q1.min_pair(target_q2) - next_log_prob * alpha;
    (rewards + (-dones + 1.0) * soft_value * gamma).detach()
}

/// The twin critics' loss: `mean((Q₁ − y)²) + mean((Q₂ − y)²)`, and its two parts.
///
/// # Shapes
/// All `[batch]` → `[1]` each.
pub fn twin_critic_loss<B: Backend>(
    q1: Tensor<B, 1>,
    q2: Tensor<B, 1>,
    target: Tensor<B, 1>,
) -> (Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>) {
    let q1_loss = (q1 - target.clone()).powi_scalar(2).mean();
    let q2_loss = (q2 - target).powi_scalar(2).mean();
    (q1_loss.clone() + q2_loss.clone(), q1_loss, q2_loss)
}

/// The actor's loss `mean(α log π(ã|s) − min(Q₁, Q₂)(s, ã))`.
///
/// # Shapes
/// All `[batch]` → `[1]`.
pub fn sac_actor_loss<B: Backend>(
    alpha: f32,
    log_prob: Tensor<B, 1>,
    q1: Tensor<B, 1>,
    q2: Tensor<B, 1>,
) -> Tensor<B, 1> {
    (log_prob * alpha - q1.min_pair(q2)).mean()
}

/// The entropy temperature's loss `mean(−exp(log α)(log π(ã|s) + H̄))`; `log_prob` carries no
/// gradient (CleanRL draws it under `no_grad`).
///
/// # Shapes
/// `log_alpha`: `[1]`; `log_prob`: `[batch]` → `[1]`.
pub fn temperature_loss<B: Backend>(
    log_alpha: Tensor<B, 1>,
    log_prob: Tensor<B, 1>,
    target_entropy: f32,
) -> Tensor<B, 1> {
    (-log_alpha.exp() * (log_prob.detach() + target_entropy)).mean()
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::TensorData;

    use super::*;

    type B = Flex;
    type A = Autodiff<Flex>;

    fn t1<B: Backend>(v: &[f32]) -> Tensor<B, 1> {
        Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), &Default::default())
    }

    fn t2<B: Backend>(v: &[f32], cols: usize) -> Tensor<B, 2> {
        Tensor::from_data(TensorData::new(v.to_vec(), [v.len() / cols, cols]), &Default::default())
    }

    fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
        t.into_data().to_vec().expect("f32 values")
    }

    #[test]
    fn log_std_spans_its_bounds() {
        let log_std = values(bounded_log_std(t2::<B>(&[-50.0, 0.0, 50.0], 1)));
        assert!((log_std[0] - LOG_STD_MIN).abs() < 1e-6);
        assert!((log_std[1] + 1.5).abs() < 1e-6, "midpoint {}", log_std[1]);
        assert!((log_std[2] - LOG_STD_MAX).abs() < 1e-6);
    }

    /// By hand: μ = 0.5, log σ = −1, ε = 0.3 on a box of half-width 2 centred at 0.
    #[test]
    fn squashed_gaussian_by_hand() {
        let (mu, log_std, eps, scale) = (0.5f64, -1.0f64, 0.3f64, 2.0f64);
        let u = mu + log_std.exp() * eps;
        let expected_action = scale * u.tanh();
        let expected_log_prob = -eps * eps / 2.0
            - log_std
            - 0.5 * (2.0 * std::f64::consts::PI).ln()
            - (scale * (1.0 - u.tanh().powi(2)) + 1e-6).ln();
        let sample = squashed_gaussian(
            t2::<B>(&[mu as f32], 1),
            t2::<B>(&[log_std as f32], 1),
            t2::<B>(&[eps as f32], 1),
            t1::<B>(&[scale as f32]),
            t1::<B>(&[0.0]),
        );
        assert!((f64::from(values(sample.action)[0]) - expected_action).abs() < 1e-6);
        assert!((f64::from(values(sample.log_prob)[0]) - expected_log_prob).abs() < 1e-5);
    }

    #[test]
    fn log_probabilities_sum_over_action_dimensions() {
        let one = |m: f32, s: f32, e: f32| {
            values(
                squashed_gaussian(
                    t2::<B>(&[m], 1),
                    t2::<B>(&[s], 1),
                    t2::<B>(&[e], 1),
                    t1(&[1.0]),
                    t1(&[0.0]),
                )
                .log_prob,
            )[0]
        };
        let both = squashed_gaussian(
            t2::<B>(&[0.1, -0.4], 2),
            t2::<B>(&[-0.5, 0.2], 2),
            t2::<B>(&[1.2, -0.7], 2),
            t1(&[1.0, 1.0]),
            t1(&[0.0, 0.0]),
        );
        let sum = one(0.1, -0.5, 1.2) + one(-0.4, 0.2, -0.7);
        assert!((values(both.log_prob)[0] - sum).abs() < 1e-5);
    }

    #[test]
    fn soft_target_bootstraps_only_live_transitions() {
        let y = values(soft_q_target(
            t1::<B>(&[1.0, 2.0]),
            t1(&[0.0, 1.0]),
            0.9,
            t1(&[5.0, 5.0]),
            t1(&[3.0, 7.0]),
            0.5,
            t1(&[-2.0, -2.0]),
        ));
        // 1 + 0.9 · (min(5, 3) − 0.5 · (−2)) = 4.6; the terminal one keeps its reward.
        assert!((y[0] - 4.6).abs() < 1e-6 && (y[1] - 2.0).abs() < 1e-6, "{y:?}");
    }

    #[test]
    fn temperature_rises_when_entropy_is_below_target() {
        // log π high (entropy low) ⇒ ∂L/∂log α = −α(log π + H̄) < 0: gradient descent raises α.
        let log_alpha = t1::<A>(&[0.0]).require_grad();
        let loss = temperature_loss(log_alpha.clone(), t1(&[2.0, 3.0]), -1.0);
        let grad = values(log_alpha.grad(&loss.backward()).expect("a gradient"));
        assert!((grad[0] + 1.5).abs() < 1e-6, "{grad:?}");
    }

    #[test]
    fn actor_loss_uses_the_smaller_critic() {
        let loss = values(sac_actor_loss(
            0.2,
            t1::<B>(&[-1.0, 1.0]),
            t1(&[4.0, 0.0]),
            t1(&[2.0, 1.0]),
        ));
        // mean(0.2·(−1) − 2, 0.2·1 − 0) = −1.0
        assert!((loss[0] + 1.0).abs() < 1e-6, "{loss:?}");
    }
}
