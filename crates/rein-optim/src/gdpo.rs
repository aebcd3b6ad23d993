//! GDPO's advantages for several rewards (Liu et al. 2026, "GDPO: Group reward-Decoupled
//! Normalization Policy Optimization for Multi-reward RL Optimization"; TRL's
//! `multi_objective_aggregation = "normalize_then_sum"`).
//!
//! GRPO sums the weighted rewards and normalises the sum within each group, so a reward with a
//! wide spread drowns the others. GDPO normalises each reward within its group first, then sums:
//!
//! ```text
//! z_{i,k} = (r_{i,k} − mean_g r_{·,k}) / (std_g r_{·,k} + ε)      each reward k, within i's group g
//! s_i     = Σ_k w_k · z_{i,k}                                     the weighted sum of z-scores
//! A_i     = (s_i − mean_batch s) / (std_batch s + ε)              whitened over the batch
//! ```
//!
//! A reward that does not apply to a completion (NaN) is left out of its group's mean and
//! standard deviation and of that completion's sum; a completion no reward applies to has no
//! sum, is left out of the batch's statistics, and gets advantage 0. Standard deviations are
//! unbiased, and undefined (so the term counts as nothing) for a single value, as TRL's `nanstd`.

/// ε in the denominators, as TRL uses.
const EPS: f64 = 1e-4;

/// Mean and unbiased standard deviation of the values that are not NaN: `(NaN, NaN)` for none,
/// a NaN deviation for one.
fn nan_mean_std(values: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let present = values.filter(|v| !v.is_nan());
    let count = present.clone().count();
    if count == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = present.clone().sum::<f64>() / count as f64;
    if count == 1 {
        return (mean, f64::NAN);
    }
    let squares: f64 = present.map(|v| (v - mean).powi(2)).sum();
    (mean, (squares / (count - 1) as f64).sqrt())
}

/// GDPO's advantage of each completion. `rewards[k][i]` is reward `k` of completion `i` (NaN:
/// it does not apply), completions in groups of `group_size` one after another; `weights[k]`
/// is reward `k`'s weight.
pub fn decoupled_normalized(rewards: &[Vec<f64>], weights: &[f64], group_size: usize) -> Vec<f32> {
    assert_eq!(rewards.len(), weights.len(), "one weight per reward");
    let n = rewards.first().map_or(0, Vec::len);
    assert!(
        group_size > 0 && n.is_multiple_of(group_size) && rewards.iter().all(|r| r.len() == n),
        "every reward needs one value per completion, in groups of {group_size}"
    );
    // s_i, NaN for a completion no reward applies to.
    let mut sums = vec![f64::NAN; n];
    for (column, &weight) in rewards.iter().zip(weights) {
        for (group, group_sums) in column.chunks(group_size).zip(sums.chunks_mut(group_size)) {
            // One completion per group has no deviation to normalise by (TRL: a zero std).
            let (mean, std) = match group_size {
                1 => (nan_mean_std(group.iter().copied()).0, 0.0),
                _ => nan_mean_std(group.iter().copied()),
            };
            for (&r, sum) in group.iter().zip(group_sums) {
                if r.is_nan() {
                    continue;
                }
                let z = weight * (r - mean) / (std + EPS);
                *sum = if sum.is_nan() { 0.0 } else { *sum };
                if !z.is_nan() {
                    *sum += z;
                }
            }
        }
    }
    let (mean, std) = match n {
        0 | 1 => (nan_mean_std(sums.iter().copied()).0, 0.0),
        _ => nan_mean_std(sums.iter().copied()),
    };
    sums.iter()
        .map(|&s| {
            let a = (s - mean) / (std + EPS);
            if a.is_nan() { 0.0 } else { a as f32 }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group_normalized;
    use proptest::prelude::*;
    use rein_core::StdScaling;

    fn whiten(xs: &[f64]) -> Vec<f64> {
        let (m, s) = nan_mean_std(xs.iter().copied());
        xs.iter().map(|x| (x - m) / (s + EPS)).collect()
    }

    #[test]
    fn one_reward_is_grpo_then_batch_whitening() {
        let r = vec![3.0, 0.0, 6.0, 1.0, 1.0, 4.0];
        let grpo: Vec<f64> = group_normalized(&r.iter().map(|&x| x as f32).collect::<Vec<_>>(), 3, StdScaling::Group)
            .into_iter()
            .map(f64::from)
            .collect();
        let got = decoupled_normalized(&[r], &[1.0], 3);
        for (g, w) in got.iter().zip(whiten(&grpo)) {
            assert!((f64::from(*g) - w).abs() < 1e-5, "{got:?}");
        }
    }

    #[test]
    fn a_wide_reward_no_longer_drowns_a_narrow_one() {
        // Completion 2 is second on the wide reward and tied first on the narrow one; completion
        // 0 is first on the wide reward and last on the narrow one. Summed first (GRPO), the
        // wide reward's spread decides: 0 ranks first. Normalised first (GDPO), both rewards
        // count alike: 2 ranks first, 1 last.
        let (wide, narrow) = (vec![100.0, 0.0, 50.0], vec![0.0, 1.0, 1.0]);
        let summed: Vec<f32> = wide.iter().zip(&narrow).map(|(a, b)| (a + b) as f32).collect();
        let grpo = group_normalized(&summed, 3, StdScaling::Group);
        assert!(grpo[0] > grpo[2] && grpo[2] > grpo[1], "{grpo:?}");
        let gdpo = decoupled_normalized(&[wide, narrow], &[1.0, 1.0], 3);
        assert!(gdpo[2] > gdpo[0] && gdpo[0] > gdpo[1], "{gdpo:?}");
    }

    #[test]
    fn a_completion_no_reward_applies_to_gets_zero_and_is_left_out() {
        let with_gap = decoupled_normalized(&[vec![1.0, 0.0, f64::NAN, 2.0, 0.0, 1.0]], &[1.0], 3);
        assert_eq!(with_gap[2], 0.0);
        // Group 0 without the gap is [1, 0]: mean ½, deviation 1/√2, so z = ±1/√2.
        let (m, s) = nan_mean_std([1.0, 0.0].into_iter());
        let z0 = (1.0 - m) / (s + EPS);
        assert!((z0 - std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-3, "{z0}");
        assert!(with_gap[0] > 0.0 && with_gap[1] < 0.0, "{with_gap:?}");
    }

    proptest! {
        #[test]
        fn advantages_are_whitened_and_blind_to_each_rewards_offset_per_group(
            (rewards, g) in (2usize..6, 1usize..5).prop_flat_map(|(g, n)| {
                (prop::collection::vec(prop::collection::vec(-5.0f64..5.0, g * n), 1..4), Just(g))
            }),
            offsets in prop::collection::vec(-50.0f64..50.0, 4),
        ) {
            let weights: Vec<f64> = (0..rewards.len()).map(|k| 1.0 + k as f64).collect();
            let a = decoupled_normalized(&rewards, &weights, g);
            let (m, _) = nan_mean_std(a.iter().map(|&x| f64::from(x)));
            prop_assert!(m.abs() < 1e-4, "mean {m}");
            // A constant added to one reward across a group moves its group mean, not its z-scores.
            let mut shifted = rewards.clone();
            for (j, group) in shifted[0].chunks_mut(g).enumerate() {
                group.iter_mut().for_each(|x| *x += offsets[j % offsets.len()]);
            }
            let b = decoupled_normalized(&shifted, &weights, g);
            for (x, y) in a.iter().zip(&b) {
                prop_assert!((x - y).abs() < 1e-4, "{a:?} vs {b:?}");
            }
        }
    }
}
