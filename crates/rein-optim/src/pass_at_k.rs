//! Advantages that train for pass@k, the chance that one of k samples is right, rather than for
//! each sample on its own (pass@1), so that a group keeps exploring.
//!
//! ```text
//! best of group (Mahdavi et al. 2025; verl's `grpo_passk`):
//!   A_best = (r_max − r_second) / (std_g r + ε),   every other completion 0         ε = 1e-6
//!
//! pass@k (Chen et al. 2025, "Pass@k Training for Adaptively Balancing Exploration and
//! Exploitation"), from the c correct completions of a group of n:
//!   R = 1 − C(n − c, k) / C(n, k)                    the group's pass@k
//!   σ = √(R (1 − R))
//!   A_correct = (1 − R) / (σ + ε)
//!   A_wrong   = (1 − R − C(n − c − 1, k − 1) / C(n − 1, k − 1)) / (σ + ε)
//! ```
//!
//! With k = 1 the pass@k advantages are GRPO's for 0/1 rewards (population standard deviation).
//! For every k a group's advantages sum to 0; as k grows, a group with some right completions
//! counts as solved more often (R rises) and its advantages shrink, so the signal goes to the
//! groups that still fail k times in k.

/// ε of both estimators, as verl and the pass@k paper's code use.
const EPS: f64 = 1e-6;

/// verl's `grpo_passk`: the best completion of each group gets the margin over the second best
/// (divided by the group's unbiased standard deviation with `scale_by_std`), the others 0.
pub fn best_of_group(rewards: &[f32], group_size: usize, scale_by_std: bool) -> Vec<f32> {
    assert!(
        group_size >= 2 && rewards.len().is_multiple_of(group_size),
        "the best of a group needs groups of at least 2, got {} rewards in groups of {group_size}",
        rewards.len()
    );
    let mut advantages = vec![0.0; rewards.len()];
    for (group, out) in rewards.chunks(group_size).zip(advantages.chunks_mut(group_size)) {
        let r: Vec<f64> = group.iter().map(|&x| f64::from(x)).collect();
        // The first of the largest: on a tie the margin is 0, whichever is chosen.
        let best = (0..r.len()).fold(0, |b, i| if r[i] > r[b] { i } else { b });
        let second = (0..r.len())
            .filter(|&i| i != best)
            .map(|i| r[i])
            .fold(f64::NEG_INFINITY, f64::max);
        let mut margin = r[best] - second;
        if scale_by_std {
            margin /= crate::group_advantages::std(group) + EPS;
        }
        out[best] = margin as f32;
    }
    advantages
}

/// C(n, k) as a float (0 when k > n); exact for the group sizes sampling uses.
fn choose(n: usize, k: usize) -> f64 {
    if k > n {
        return 0.0;
    }
    (0..k).fold(1.0, |c, i| c * (n - i) as f64 / (i + 1) as f64)
}

/// The pass@k paper's advantages: `correct[i]` says whether completion `i` is right, groups of
/// `group_size` one after another, `1 ≤ k ≤ group_size`.
pub fn pass_at_k(correct: &[bool], group_size: usize, k: usize) -> Vec<f32> {
    assert!(
        (1..=group_size).contains(&k) && correct.len().is_multiple_of(group_size),
        "pass@{k} needs 1 ≤ k ≤ the group size {group_size}"
    );
    let n = group_size;
    correct
        .chunks(n)
        .flat_map(|group| {
            let c = group.iter().filter(|&&ok| ok).count();
            let pass = 1.0 - choose(n - c, k) / choose(n, k);
            let sigma = (pass * (1.0 - pass)).max(0.0).sqrt();
            let right = (1.0 - pass) / (sigma + EPS);
            // The share of k-subsets holding a given wrong completion that are all wrong.
            let all_wrong_with_it = match c < n {
                true => choose(n - c - 1, k - 1) / choose(n - 1, k - 1),
                false => 0.0,
            };
            let wrong = (1.0 - pass - all_wrong_with_it) / (sigma + EPS);
            group.iter().map(move |&ok| if ok { right } else { wrong } as f32)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn only_the_best_of_each_group_learns() {
        let a = best_of_group(&[0.2, 0.9, 0.5, 1.0, 1.0, 0.0], 3, false);
        assert!((a[1] - 0.4).abs() < 1e-6, "{a:?}");
        assert_eq!([a[0], a[2]], [0.0, 0.0]);
        assert_eq!(&a[3..], &[0.0, 0.0, 0.0], "a tie for the best has no margin");
        let scaled = best_of_group(&[0.2, 0.9, 0.5], 3, true);
        let std = (((0.2f64 - 0.5333).powi(2) + (0.9f64 - 0.5333).powi(2) + (0.5f64 - 0.5333).powi(2)) / 2.0).sqrt();
        assert!((f64::from(scaled[1]) - 0.4 / std).abs() < 1e-3, "{scaled:?}");
    }

    #[test]
    fn pass_at_1_is_grpo_on_binary_rewards() {
        // c = 1 of n = 4: R = 1/4, σ = √(3/16); right (3/4)/σ, wrong (3/4 − 1)/σ.
        let a = pass_at_k(&[true, false, false, false], 4, 1);
        let sigma = (3.0f64 / 16.0).sqrt();
        assert!((f64::from(a[0]) - 0.75 / sigma).abs() < 1e-4, "{a:?}");
        assert!((f64::from(a[1]) + 0.25 / sigma).abs() < 1e-4, "{a:?}");
    }

    #[test]
    fn groups_all_right_or_all_wrong_teach_nothing() {
        assert!(pass_at_k(&[true; 4], 4, 2).iter().all(|a| a.abs() < 1e-6));
        assert!(pass_at_k(&[false; 4], 4, 2).iter().all(|a| a.abs() < 1e-6));
    }

    proptest! {
        #[test]
        fn advantages_sum_to_zero_and_shrink_as_k_grows(
            correct in prop::collection::vec(any::<bool>(), 8),
            k in 1usize..8,
        ) {
            let (a, b) = (pass_at_k(&correct, 8, k), pass_at_k(&correct, 8, k + 1));
            let sum: f64 = a.iter().map(|&x| f64::from(x)).sum();
            prop_assert!(sum.abs() < 1e-3, "{a:?}");
            for (x, y) in a.iter().zip(&b) {
                prop_assert!(y.abs() <= x.abs() + 1e-5, "pass@{k} {a:?}, pass@{} {b:?}", k + 1);
            }
        }
    }
}
