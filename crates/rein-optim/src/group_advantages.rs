//! Outcome advantages for groups of completions (one scalar reward per completion, G
//! completions per prompt, groups laid out one after another).
//!
//! ```text
//! GRPO (Shao et al. 2024):   A_i = (r_i − mean_g r) / (std + ε)     std over the group, the batch, or 1 (Dr. GRPO, Liu et al. 2025)
//! RLOO (Ahmadian et al. 2024): A_i = r_i − 1/(G−1) Σ_{j≠i} r_j
//! REINFORCE++ (Hu 2025):     A_i = (x_i − mean_batch x) / (std_batch x + ε),   x_i = r_i − mean_g r (with baseline) or r_i
//! ```

use rein_core::StdScaling;

/// ε in the denominators, as TRL uses.
pub(crate) const EPS: f64 = 1e-4;

fn mean(xs: &[f32]) -> f64 {
    xs.iter().map(|&x| f64::from(x)).sum::<f64>() / xs.len().max(1) as f64
}

/// Unbiased standard deviation (`torch.std`), 0 for fewer than two values.
pub(crate) fn std(xs: &[f32]) -> f64 {
    if xs.len() < 2 {
        return 0.0;
    }
    let m = mean(xs);
    (xs.iter().map(|&x| (f64::from(x) - m).powi(2)).sum::<f64>() / (xs.len() - 1) as f64).sqrt()
}

/// GRPO's group-normalised advantages.
pub fn group_normalized(rewards: &[f32], group_size: usize, scaling: StdScaling) -> Vec<f32> {
    assert!(
        group_size > 0 && rewards.len().is_multiple_of(group_size),
        "{} rewards do not split into groups of {group_size}",
        rewards.len()
    );
    let batch_std = std(rewards);
    rewards
        .chunks(group_size)
        .flat_map(|group| {
            let m = mean(group);
            let scale = match scaling {
                StdScaling::Group => std(group) + EPS,
                StdScaling::Batch => batch_std + EPS,
                StdScaling::None => 1.0,
            };
            group.iter().map(move |&r| ((f64::from(r) - m) / scale) as f32)
        })
        .collect()
}

/// RLOO: each completion's baseline is the mean reward of the *other* completions of its group.
pub fn rloo(rewards: &[f32], group_size: usize) -> Vec<f32> {
    assert!(
        group_size > 1 && rewards.len().is_multiple_of(group_size),
        "RLOO needs groups of at least 2"
    );
    rewards
        .chunks(group_size)
        .flat_map(|group| {
            let sum: f64 = group.iter().map(|&r| f64::from(r)).sum();
            group
                .iter()
                .map(move |&r| (f64::from(r) - (sum - f64::from(r)) / (group_size - 1) as f64) as f32)
        })
        .collect()
}

/// REINFORCE++: global batch normalisation, optionally after subtracting the group mean.
pub fn reinforce_pp(rewards: &[f32], group_size: usize, group_baseline: bool) -> Vec<f32> {
    let centred: Vec<f32> = if group_baseline {
        group_normalized(rewards, group_size, StdScaling::None)
    } else {
        rewards.to_vec()
    };
    let (m, s) = (mean(&centred), std(&centred));
    centred
        .iter()
        .map(|&x| ((f64::from(x) - m) / (s + EPS)) as f32)
        .collect()
}

/// Whether a group's rewards are all equal (no learning signal: DAPO's dynamic sampling drops
/// such groups).
pub fn zero_variance(group: &[f32]) -> bool {
    group
        .windows(2)
        .all(|w| (w[0] - w[1]).abs() <= f32::EPSILON * w[0].abs().max(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn groups() -> impl Strategy<Value = (Vec<f32>, usize)> {
        (2usize..8, 1usize..6).prop_flat_map(|(g, n)| (prop::collection::vec(-5.0f32..5.0, g * n), Just(g)))
    }

    proptest! {
        #[test]
        fn group_advantages_have_zero_mean_per_group_and_unit_std_when_scaled((rewards, g) in groups()) {
            for scaling in [StdScaling::Group, StdScaling::Batch, StdScaling::None] {
                let a = group_normalized(&rewards, g, scaling);
                for (group, adv) in rewards.chunks(g).zip(a.chunks(g)) {
                    prop_assert!(mean(adv).abs() < 1e-4, "{scaling:?}: mean {}", mean(adv));
                    if scaling == StdScaling::Group && std(group) > 1e-2 {
                        prop_assert!((std(adv) - 1.0).abs() < 1e-2, "std {}", std(adv));
                    }
                }
            }
        }

        #[test]
        fn rloo_baseline_excludes_the_sample_itself((rewards, g) in groups()) {
            let a = rloo(&rewards, g);
            for (group, adv) in rewards.chunks(g).zip(a.chunks(g)) {
                for i in 0..g {
                    let others: f64 = (0..g).filter(|&j| j != i).map(|j| f64::from(group[j])).sum::<f64>() / (g - 1) as f64;
                    prop_assert!((f64::from(adv[i]) - (f64::from(group[i]) - others)).abs() < 1e-4);
                }
                prop_assert!(mean(adv).abs() < 1e-4, "RLOO advantages also average to zero");
            }
        }

        #[test]
        fn reinforce_pp_is_whitened_over_the_batch((rewards, g) in groups(), baseline in any::<bool>()) {
            let a = reinforce_pp(&rewards, g, baseline);
            prop_assert!(mean(&a).abs() < 1e-4);
            let spread = std(&if baseline { group_normalized(&rewards, g, StdScaling::None) } else { rewards.clone() });
            if spread > 1e-2 {
                prop_assert!((std(&a) - 1.0).abs() < 1e-2);
            }
        }
    }

    fn assert_close(got: &[f32], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((f64::from(*g) - w).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    }

    /// Two groups of three: [3, 0, 6] and [1, 1, 4].
    const REWARDS: [f32; 6] = [3.0, 0.0, 6.0, 1.0, 1.0, 4.0];

    #[test]
    fn rloo_by_hand() {
        // 3 − (0 + 6)/2, 0 − (3 + 6)/2, 6 − (3 + 0)/2; 1 − (1 + 4)/2, twice, 4 − (1 + 1)/2.
        assert_close(&rloo(&REWARDS, 3), &[0.0, -4.5, 4.5, -1.5, -1.5, 3.0]);
    }

    #[test]
    fn reinforce_pp_by_hand() {
        // Group means 3 and 2 → [0, −3, 3, −1, −1, 2]: batch mean 0, Σx² = 24, unbiased
        // std √(24/5).
        let s = (24.0f64 / 5.0).sqrt() + EPS;
        let want: Vec<f64> = [0.0, -3.0, 3.0, -1.0, -1.0, 2.0].iter().map(|x| x / s).collect();
        assert_close(&reinforce_pp(&REWARDS, 3, true), &want);
        // No group baseline: batch mean 2.5, deviations [0.5, −2.5, 3.5, −1.5, −1.5, 1.5],
        // Σ = 25.5, std √(25.5/5).
        let s = (25.5f64 / 5.0).sqrt() + EPS;
        let want: Vec<f64> = [0.5, -2.5, 3.5, -1.5, -1.5, 1.5].iter().map(|x| x / s).collect();
        assert_close(&reinforce_pp(&REWARDS, 3, false), &want);
    }

    #[test]
    fn grpo_by_hand() {
        // Group [3, 0, 6]: mean 3, unbiased std 3 → [0, −1, 1] (÷ (3 + ε)).
        let s = 3.0 + EPS;
        assert_close(
            &group_normalized(&REWARDS[..3], 3, StdScaling::Group),
            &[0.0, -3.0 / s, 3.0 / s],
        );
        assert_close(&group_normalized(&REWARDS[..3], 3, StdScaling::None), &[0.0, -3.0, 3.0]);
    }

    #[test]
    fn equal_rewards_give_zero_advantages_and_are_flagged() {
        let r = [1.0, 1.0, 1.0, 0.0, 1.0, 0.0];
        assert_eq!(&group_normalized(&r, 3, StdScaling::Group)[..3], &[0.0, 0.0, 0.0]);
        assert!(zero_variance(&r[..3]));
        assert!(!zero_variance(&r[3..]));
    }
}
