//! Generalised advantage estimation (Schulman et al. 2016, <https://arxiv.org/abs/1506.02438>).
//!
//! ```text
//! δ_t = r_t + γ (1 − terminated_t) V'_t − V(s_t)
//! A_t = δ_t + γ λ (1 − ended_t) A_{t+1}
//! ```
//!
//! `V'_t` is the value of the state the step led to: `V(s_{t+1})` normally, the value of the
//! final observation when the episode was truncated (time limits bootstrap, Pardo et al. 2018),
//! ignored when it terminated. `ended_t = terminated_t ∨ truncated_t` stops the recursion at
//! episode boundaries. Without truncations this is exactly CleanRL's `ppo.py` loop.

/// Advantages for one environment's trajectory of `T` steps (or `T × N` steps laid out
/// time-major with `stride = N`: element `t * stride + i` is env `i` at step `t`).
///
/// - `rewards[t]`: reward of step `t`;
/// - `values[t]`: `V(s_t)`;
/// - `next_values[t]`: `V'_t` as above (for the last step of the rollout, the value of the
///   observation after it);
/// - `terminated[t]`, `truncated[t]`: Gymnasium's flags for step `t`.
///
/// Returns `A_t` in the same layout. Returns (the critic's targets) are `A_t + V(s_t)`.
#[allow(clippy::too_many_arguments)]
pub fn gae(
    rewards: &[f32],
    values: &[f32],
    next_values: &[f32],
    terminated: &[bool],
    truncated: &[bool],
    stride: usize,
    gamma: f32,
    lambda: f32,
) -> Vec<f32> {
    let len = rewards.len();
    assert!(
        [values.len(), next_values.len(), terminated.len(), truncated.len()]
            .iter()
            .all(|&l| l == len),
        "gae: every input needs {len} entries"
    );
    assert!(
        stride > 0 && len.is_multiple_of(stride),
        "gae: {len} entries do not split into rows of {stride}"
    );
    let mut advantages = vec![0.0; len];
    for env in 0..stride {
        let mut next_advantage = 0.0;
        for t in (0..len / stride).rev() {
            let k = t * stride + env;
            let not_terminated = if terminated[k] { 0.0 } else { 1.0 };
            let continues = if terminated[k] || truncated[k] { 0.0 } else { 1.0 };
            let delta = rewards[k] + gamma * not_terminated * next_values[k] - values[k];
            next_advantage = delta + gamma * lambda * continues * next_advantage;
            advantages[k] = next_advantage;
        }
    }
    advantages
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_three_step_episode_by_hand() {
        // One env, rewards 1, values 0.5, terminated on the last step; γ = 0.5, λ = 1.
        let a = gae(
            &[1.0; 3],
            &[0.5; 3],
            &[0.5, 0.5, 9.9],
            &[false, false, true],
            &[false; 3],
            1,
            0.5,
            1.0,
        );
        // δ = [1 + .25 − .5, 1 + .25 − .5, 1 − .5] = [.75, .75, .5]; A₂ = .5, A₁ = .75 + .25, A₀ = .75 + .5
        assert_eq!(a, vec![1.25, 1.0, 0.5]);
    }

    #[test]
    fn truncation_bootstraps_but_does_not_leak_across_episodes() {
        // Step 0 is truncated with a final-state value of 2; step 1 starts a new episode.
        let a = gae(
            &[1.0, 1.0],
            &[0.0, 0.0],
            &[2.0, 10.0],
            &[false, false],
            &[true, false],
            1,
            0.9,
            0.95,
        );
        assert!(
            (a[0] - (1.0 + 0.9 * 2.0)).abs() < 1e-6,
            "bootstrapped from the final value only"
        );
        assert!((a[1] - (1.0 + 0.9 * 10.0)).abs() < 1e-6);
    }

    /// A literal transcription of CleanRL's `ppo.py` GAE loop (no truncation there): `dones`
    /// are the next step's done flags, `next_value` the value after the rollout.
    fn cleanrl(
        rewards: &[f32],
        values: &[f32],
        dones: &[bool],
        next_value: f32,
        next_done: bool,
        gamma: f32,
        lambda: f32,
    ) -> Vec<f32> {
        let n = rewards.len();
        let mut advantages = vec![0.0; n];
        let mut lastgaelam = 0.0;
        for t in (0..n).rev() {
            let (nextnonterminal, nextvalues) = if t == n - 1 {
                (1.0 - f32::from(u8::from(next_done)), next_value)
            } else {
                (1.0 - f32::from(u8::from(dones[t + 1])), values[t + 1])
            };
            let delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t];
            lastgaelam = delta + gamma * lambda * nextnonterminal * lastgaelam;
            advantages[t] = lastgaelam;
        }
        advantages
    }

    /// The definition, written forward: A_t = Σ_k (γλ)^k δ_{t+k} until the episode ends.
    fn forward_sum(
        r: &[f32],
        v: &[f32],
        nv: &[f32],
        term: &[bool],
        trunc: &[bool],
        gamma: f32,
        lambda: f32,
    ) -> Vec<f32> {
        (0..r.len())
            .map(|t| {
                let mut total = 0.0f64;
                let mut weight = 1.0f64;
                for k in t..r.len() {
                    let delta = r[k] + gamma * if term[k] { 0.0 } else { nv[k] } - v[k];
                    total += weight * f64::from(delta);
                    if term[k] || trunc[k] {
                        break;
                    }
                    weight *= f64::from(gamma * lambda);
                }
                total as f32
            })
            .collect()
    }

    proptest! {
        #[test]
        fn equals_the_forward_definition(
            steps in prop::collection::vec((-5.0f32..5.0, -5.0f32..5.0, -5.0f32..5.0, 0u8..10), 1..60),
            gamma in 0.5f32..1.0,
            lambda in 0.0f32..1.0,
        ) {
            let r: Vec<f32> = steps.iter().map(|s| s.0).collect();
            let v: Vec<f32> = steps.iter().map(|s| s.1).collect();
            let nv: Vec<f32> = steps.iter().map(|s| s.2).collect();
            let term: Vec<bool> = steps.iter().map(|s| s.3 == 0).collect();
            let trunc: Vec<bool> = steps.iter().map(|s| s.3 == 1).collect();
            let got = gae(&r, &v, &nv, &term, &trunc, 1, gamma, lambda);
            let want = forward_sum(&r, &v, &nv, &term, &trunc, gamma, lambda);
            for (g, w) in got.iter().zip(&want) {
                prop_assert!((g - w).abs() <= 1e-3 * (1.0 + w.abs()), "{got:?} vs {want:?}");
            }
        }

        #[test]
        fn equals_cleanrl_without_truncation(
            steps in prop::collection::vec((-5.0f32..5.0, -5.0f32..5.0, prop::bool::weighted(0.1)), 2..60),
            next_value in -5.0f32..5.0,
            gamma in 0.5f32..1.0,
            lambda in 0.0f32..1.0,
        ) {
            // CleanRL stores done flags on the step *after* an episode ends; ours on the step itself.
            let r: Vec<f32> = steps.iter().map(|s| s.0).collect();
            let v: Vec<f32> = steps.iter().map(|s| s.1).collect();
            let ended: Vec<bool> = steps.iter().map(|s| s.2).collect();
            let n = r.len();
            let cleanrl_dones: Vec<bool> = (0..n).map(|t| t > 0 && ended[t - 1]).collect();
            let want = cleanrl(&r, &v, &cleanrl_dones, next_value, ended[n - 1], gamma, lambda);
            let nv: Vec<f32> = (0..n).map(|t| if t + 1 < n { v[t + 1] } else { next_value }).collect();
            let got = gae(&r, &v, &nv, &ended, &vec![false; n], 1, gamma, lambda);
            for (g, w) in got.iter().zip(&want) {
                prop_assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()));
            }
        }

        #[test]
        fn envs_in_a_batch_are_independent(
            steps in prop::collection::vec((-5.0f32..5.0, -5.0f32..5.0, -5.0f32..5.0, 0u8..8), 3..45),
        ) {
            let stride = 3;
            let steps = &steps[..steps.len() / stride * stride];
            let r: Vec<f32> = steps.iter().map(|s| s.0).collect();
            let v: Vec<f32> = steps.iter().map(|s| s.1).collect();
            let nv: Vec<f32> = steps.iter().map(|s| s.2).collect();
            let term: Vec<bool> = steps.iter().map(|s| s.3 == 0).collect();
            let trunc: Vec<bool> = steps.iter().map(|s| s.3 == 1).collect();
            let batched = gae(&r, &v, &nv, &term, &trunc, stride, 0.99, 0.95);
            for env in 0..stride {
                let f32s = |xs: &[f32]| xs.iter().skip(env).step_by(stride).copied().collect::<Vec<f32>>();
                let bools = |xs: &[bool]| xs.iter().skip(env).step_by(stride).copied().collect::<Vec<bool>>();
                let alone = gae(&f32s(&r), &f32s(&v), &f32s(&nv), &bools(&term), &bools(&trunc), 1, 0.99, 0.95);
                prop_assert_eq!(f32s(&batched), alone);
            }
        }
    }
}
