//! Advantages from rewards on tokens rather than on whole completions — process rewards at the
//! end of each step, an implicit PRM's reward on every token — as PRIME computes them (Cui et al.
//! 2025, "Process Reinforcement through Implicit Rewards"; verl's `recipe/prime`,
//! `compute_rloo_advantage_return`), with no critic.
//!
//! Each source `k` of rewards puts values `r_it` on some tokens of each completion (its mask
//! `M_k`: every token for an implicit PRM, the step ends for step scores, the last token for the
//! outcome). Within each group of `G` completions of one prompt, a source is made relative by
//! leaving one out (RLOO): with `m_i` the mean of completion `i`'s masked values,
//!
//! ```text
//! r̃_it = r_it · G/(G−1) − (Σ_j m_j)/(G−1)          on the masked tokens, 0 elsewhere
//! ```
//!
//! (for one value per completion, the outcome, this is `r_i − mean_{j≠i} r_j`). The sources are
//! summed with their weights (PRIME's `reward_dpo_coef` and `reward_gt_coef`), turned into
//! returns over each completion's tokens, and whitened over the batch's tokens:
//!
//! ```text
//! R_it = Σ_{t' ≥ t} γ^{t'−t} Σ_k w_k r̃^k_it'       (γ = 1 in PRIME)
//! A    = whiten(R) over the batch's counted tokens  (unbiased variance, as `masked_whiten`)
//! ```
//!
//! So a reward at token `t` reaches the advantages of token `t` and the tokens before it, not
//! those after: credit for a step goes to the tokens that led to it.
//!
//! Everything is laid out `[rows, width]`, the rows in groups of `G` consecutive completions.

use crate::masked_whiten;

/// One source of token rewards and its weight in the sum.
#[derive(Debug, Clone, Copy)]
pub struct TokenRewards<'a> {
    /// `[rows, width]` values, read where `mask` is 1.
    pub rewards: &'a [f32],
    /// `[rows, width]`, 1 on the tokens this source rewards.
    pub mask: &'a [f32],
    /// Its weight `w_k`.
    pub weight: f32,
}

/// A source's rewards made relative within each group of `g` rows by leaving one out (see the
/// module docs); 0 off its mask. A row with no masked token counts with a mean of 0, as verl's
/// `mean` of nothing would not: such a row should not be in a batch.
pub fn leave_one_out(rewards: &[f32], mask: &[f32], width: usize, g: usize) -> Vec<f32> {
    assert_eq!(
        rewards.len(),
        mask.len(),
        "leave_one_out: rewards and mask differ in length"
    );
    assert!(
        g >= 2 && rewards.len().is_multiple_of(width * g),
        "leave_one_out: rows come in groups of g ≥ 2"
    );
    let (gf, mut out) = (g as f64, vec![0.0; rewards.len()]);
    let chunks = rewards.chunks(width * g).zip(mask.chunks(width * g));
    for ((group, mask), out) in chunks.zip(out.chunks_mut(width * g)) {
        let means: f64 = (group.chunks(width).zip(mask.chunks(width)))
            .map(|(row, m)| {
                let (sum, n) = (row.iter().zip(m))
                    .filter(|(_, m)| **m > 0.0)
                    .fold((0.0, 0usize), |(s, n), (&r, _)| (s + f64::from(r), n + 1));
                if n == 0 { 0.0 } else { sum / n as f64 }
            })
            .sum();
        let baseline = means / (gf - 1.0);
        for ((o, &r), &m) in out.iter_mut().zip(group).zip(mask) {
            if m > 0.0 {
                *o = (f64::from(r) * gf / (gf - 1.0) - baseline) as f32;
            }
        }
    }
    out
}

/// Each row's discounted returns `R_t = Σ_{t' ≥ t} γ^{t'−t} r_t'` over the tokens `mask`
/// counts (0 elsewhere).
pub fn token_returns(rewards: &[f32], mask: &[f32], width: usize, gamma: f32) -> Vec<f32> {
    assert_eq!(
        rewards.len(),
        mask.len(),
        "token_returns: rewards and mask differ in length"
    );
    let mut out = vec![0.0; rewards.len()];
    for ((row, m), out) in rewards.chunks(width).zip(mask.chunks(width)).zip(out.chunks_mut(width)) {
        let mut running = 0.0f64;
        for t in (0..width).rev() {
            let r = if m[t] > 0.0 { f64::from(row[t]) } else { 0.0 };
            running = r + f64::from(gamma) * running;
            out[t] = if m[t] > 0.0 { running as f32 } else { 0.0 };
        }
    }
    out
}

/// PRIME's advantages and returns from `sources` (see the module docs): each source made
/// relative within its group of `g` rows, weighted and summed, discounted by `gamma` into returns
/// over the tokens `mask` counts, whitened over the batch.
pub fn process_advantages(
    sources: &[TokenRewards<'_>],
    mask: &[f32],
    width: usize,
    g: usize,
    gamma: f32,
) -> (Vec<f32>, Vec<f32>) {
    let mut total = vec![0.0f32; mask.len()];
    for source in sources {
        let relative = leave_one_out(source.rewards, source.mask, width, g);
        for (t, r) in total.iter_mut().zip(relative) {
            *t += source.weight * r;
        }
    }
    let returns = token_returns(&total, mask, width, gamma);
    (masked_whiten(&returns, mask, true), returns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn one_value_per_completion_leaves_the_others_mean_out() {
        // Two groups of 3 completions, 2 tokens each, the outcome on the last token.
        let rewards = [0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 2.0, 0.0, 4.0, 0.0, 9.0];
        let mask = [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0];
        let out = leave_one_out(&rewards, &mask, 2, 3);
        let expected = [0.0, 0.5, 0.0, -1.0, 0.0, 0.5, 0.0, -4.5, 0.0, -1.5, 0.0, 6.0];
        for (o, e) in out.iter().zip(expected) {
            assert!((o - e).abs() < 1e-6, "{out:?}");
        }
    }

    #[test]
    fn returns_discount_later_rewards_and_stop_at_the_mask() {
        let rewards = [1.0, 0.0, 2.0, 5.0];
        let mask = [1.0, 1.0, 1.0, 0.0];
        let returns = token_returns(&rewards, &mask, 4, 0.5);
        assert_eq!(returns, [1.5, 1.0, 2.0, 0.0]);
    }

    proptest! {
        /// With γ = 1, a reward on token `t` changes the returns of token `t` and the tokens
        /// before it in its own completion, and nothing else.
        #[test]
        fn a_reward_reaches_its_own_and_earlier_tokens_only(
            rewards in prop::collection::vec(-3.0f32..3.0, 12),
            t in 0usize..12, delta in 0.1f32..2.0,
        ) {
            let (width, mask) = (6, vec![1.0; 12]);
            let before = token_returns(&rewards, &mask, width, 1.0);
            let mut changed = rewards.clone();
            changed[t] += delta;
            let after = token_returns(&changed, &mask, width, 1.0);
            for i in 0..12 {
                let reached = i / width == t / width && i <= t;
                prop_assert_eq!((after[i] - before[i]).abs() > 1e-4, reached, "token {} after a change at {}", i, t);
            }
        }

        /// Relative rewards sum to zero over a group when every completion has as many masked
        /// tokens (each completion's mean is compared with the others').
        #[test]
        fn leave_one_out_centres_each_group(values in prop::collection::vec(-5.0f32..5.0, 8)) {
            let mask = vec![1.0; 8];
            let out = leave_one_out(&values, &mask, 2, 4);
            prop_assert!(out.iter().map(|&x| f64::from(x)).sum::<f64>().abs() < 1e-4);
        }
    }
}
