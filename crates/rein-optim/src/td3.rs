//! TD3's losses (Fujimoto et al. 2018, "Addressing Function Approximation Error in Actor-Critic
//! Methods", <https://arxiv.org/abs/1802.09477>), as CleanRL's `td3_continuous_action.py`
//! computes them:
//!
//! ```text
//! smoothing  a' = clip( μ̄(s') + s_a · clip(σ̃ ε, −c, c), low, high ),   ε ~ N(0, 1)
//! critic     y = r + γ (1 − d) min(Q̄₁, Q̄₂)(s', a')
//!            L_Q = mean((Q₁(s, a) − y)²) + mean((Q₂(s, a) − y)²)       (twin_critic_loss)
//! actor      L_μ = −mean(Q₁(s, μ(s)))                                  (every `policy_frequency` updates)
//! ```
//!
//! CleanRL clips `a'` to the box's first bound (`low[0]`, `high[0]`); here each dimension is
//! clipped to its own, which is the same wherever the bounds are equal across dimensions.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// Target policy smoothing: `clip(a + s_a · clip(σ̃ ε, −c, c), low, high)` (no gradient).
///
/// # Shapes
/// `target_actions`, `noise`: `[batch, act]`; `scale`, `low`, `high`: `[act]`.
pub fn smoothed_target_actions<B: Backend>(
    target_actions: Tensor<B, 2>,
    noise: Tensor<B, 2>,
    policy_noise: f32,
    noise_clip: f32,
    scale: Tensor<B, 1>,
    low: Tensor<B, 1>,
    high: Tensor<B, 1>,
) -> Tensor<B, 2> {
    let clipped = (noise * policy_noise).clamp(-noise_clip, noise_clip) * scale.unsqueeze::<2>();
    let shifted = target_actions + clipped;
    let [rows, cols] = shifted.dims();
    let low = low.unsqueeze::<2>().expand([rows, cols]);
    let high = high.unsqueeze::<2>().expand([rows, cols]);
    shifted.max_pair(low).min_pair(high).detach()
}

/// The clipped double-Q target `y = r + γ (1 − d) min(Q̄₁, Q̄₂)` (no gradient).
///
/// # Shapes
/// All `[batch]`.
pub fn clipped_double_q_target<B: Backend>(
    rewards: Tensor<B, 1>,
    dones: Tensor<B, 1>,
    gamma: f32,
    target_q1: Tensor<B, 1>,
    target_q2: Tensor<B, 1>,
) -> Tensor<B, 1> {
    (rewards + (-dones + 1.0) * target_q1.min_pair(target_q2) * gamma).detach()
}

/// The deterministic actor's loss `−mean(Q₁(s, μ(s)))`.
///
/// # Shapes
/// `[batch]` → `[1]`.
pub fn deterministic_actor_loss<B: Backend>(q1: Tensor<B, 1>) -> Tensor<B, 1> {
    -q1.mean()
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::TensorData;

    use super::*;

    type B = Flex;

    fn t1(v: &[f32]) -> Tensor<B, 1> {
        Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), &Default::default())
    }

    fn t2(v: &[f32], cols: usize) -> Tensor<B, 2> {
        Tensor::from_data(TensorData::new(v.to_vec(), [v.len() / cols, cols]), &Default::default())
    }

    fn values<const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
        t.into_data().to_vec().expect("f32 values")
    }

    #[test]
    fn smoothing_clips_the_noise_then_the_action() {
        let a = values(smoothed_target_actions(
            t2(&[0.0, 1.9, -1.0, 0.5], 1),
            t2(&[1.0, 1.0, -10.0, 10.0], 1),
            0.2,
            0.5,
            t1(&[2.0]),
            t1(&[-2.0]),
            t1(&[2.0]),
        ));
        // 0 + 2·0.2; 1.9 + 0.4 → 2 (box); −1 + 2·(−0.5) (noise clip); 0.5 + 2·0.5.
        let expected = [0.4, 2.0, -2.0, 1.5];
        for (x, e) in a.iter().zip(expected) {
            assert!((x - e).abs() < 1e-6, "{a:?}");
        }
    }

    #[test]
    fn target_takes_the_smaller_critic() {
        let y = values(clipped_double_q_target(
            t1(&[1.0, -1.0]),
            t1(&[0.0, 1.0]),
            0.5,
            t1(&[4.0, 9.0]),
            t1(&[2.0, 3.0]),
        ));
        assert!((y[0] - 2.0).abs() < 1e-6 && (y[1] + 1.0).abs() < 1e-6, "{y:?}");
    }

    #[test]
    fn actor_loss_is_the_negated_mean_value() {
        assert!((values(deterministic_actor_loss(t1(&[1.0, 3.0])))[0] + 2.0).abs() < 1e-6);
    }
}
