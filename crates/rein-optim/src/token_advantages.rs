//! PPO's advantages over the tokens of language-model completions, as InstructGPT (Ouyang et
//! al. 2022, <https://arxiv.org/abs/2203.02155>) and TRL's `PPOTrainer` / OpenRLHF compute them.
//! Completion `i` has `T_i` counted tokens, a sequence score `s_i` (the reward model's or the
//! reward plugins'), per-token KL estimates `KL_it` to the reference policy and values `V_it`
//! (the critic's estimate before token `t` is sampled):
//!
//! ```text
//! r_it = −β KL_it + [t = T_i − 1] s_i          the score on the last token
//! A_i  = GAE(r_i, V_i; γ, λ), V_i,T_i = 0       the completion ends after its last token
//! R_i  = A_i + V_i                              the critic's targets
//! Â    = whiten(A) over the batch's counted tokens
//! whiten(x) = (x − mean x) / √(var x + 10⁻⁸)    unbiased variance (TRL's `masked_whiten`)
//! ```
//!
//! TRL pads completions with the end-of-sequence token and counts it as padding in the policy
//! loss, so it puts the score one index past its last counted token (`sequence_lengths_p1`):
//! on the end-of-sequence token. rein counts that token (the model sampled it), so the same
//! place is its last counted token.
//!
//! Everything is laid out `[rows, width]`: row `i`'s counted tokens are the first `T_i` columns
//! where `mask` is 1, and every value after them is 0.

use crate::gae;

/// The per-token rewards: `−β KL_t` on every counted token plus `scores[i]` on row `i`'s last.
/// `kl` holds the per-token estimates already (`[rows, width]`; nothing is added where `mask`
/// is 0).
pub fn token_rewards(scores: &[f32], kl: &[f32], mask: &[f32], width: usize, kl_coef: f32) -> Vec<f32> {
    check_layout("token_rewards", &[kl.len()], mask, width, scores.len());
    let mut rewards: Vec<f32> = (kl.iter().zip(mask))
        .map(|(&kl, &m)| if m > 0.0 { -kl_coef * kl } else { 0.0 })
        .collect();
    for (row, &score) in scores.iter().enumerate() {
        if let Some(last) = counted_len(&mask[row * width..(row + 1) * width]).checked_sub(1) {
            rewards[row * width + last] += score;
        }
    }
    rewards
}

/// GAE over each row's counted tokens ([`gae`] with the episode terminated after the last
/// one), and the returns `A + V`. Both are 0 after a row's counted tokens.
pub fn token_gae(
    rewards: &[f32],
    values: &[f32],
    mask: &[f32],
    width: usize,
    gamma: f32,
    lambda: f32,
) -> TokenAdvantages {
    let rows = mask.len() / width.max(1);
    check_layout("token_gae", &[rewards.len(), values.len()], mask, width, rows);
    let mut out = TokenAdvantages {
        advantages: vec![0.0; mask.len()],
        returns: vec![0.0; mask.len()],
    };
    for row in 0..rows {
        let start = row * width;
        let len = counted_len(&mask[start..start + width]);
        if len == 0 {
            continue;
        }
        let (r, v) = (&rewards[start..start + len], &values[start..start + len]);
        let next: Vec<f32> = (0..len).map(|t| v.get(t + 1).copied().unwrap_or(0.0)).collect();
        let mut terminated = vec![false; len];
        terminated[len - 1] = true;
        let advantages = gae(r, v, &next, &terminated, &vec![false; len], 1, gamma, lambda);
        for (t, a) in advantages.into_iter().enumerate() {
            out.advantages[start + t] = a;
            out.returns[start + t] = a + v[t];
        }
    }
    out
}

/// [`token_gae`]'s result, `[rows, width]` each.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenAdvantages {
    /// `A`, before whitening.
    pub advantages: Vec<f32>,
    /// `R = A + V`.
    pub returns: Vec<f32>,
}

/// TRL's `masked_whiten`: `(x − mean) / √(var + 10⁻⁸)` over the entries where `mask` is 1, with
/// the unbiased variance (0 for fewer than two entries); with `shift_mean = false` the mean is
/// added back (only the scale changes). Entries where `mask` is 0 become 0.
pub fn masked_whiten(values: &[f32], mask: &[f32], shift_mean: bool) -> Vec<f32> {
    assert_eq!(
        values.len(),
        mask.len(),
        "masked_whiten: values and mask differ in length"
    );
    let counted = || {
        values
            .iter()
            .zip(mask)
            .filter(|(_, m)| **m > 0.0)
            .map(|(&x, _)| f64::from(x))
    };
    let n = counted().count();
    if n == 0 {
        return vec![0.0; values.len()];
    }
    let mean = counted().sum::<f64>() / n as f64;
    let var = match n {
        1 => 0.0,
        _ => counted().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64,
    };
    let scale = 1.0 / (var + 1e-8).sqrt();
    let shift = if shift_mean { 0.0 } else { mean };
    (values.iter().zip(mask))
        .map(|(&x, &m)| match m > 0.0 {
            true => ((f64::from(x) - mean) * scale + shift) as f32,
            false => 0.0,
        })
        .collect()
}

/// The number of counted tokens of a row: up to its last entry where `mask` is 1.
fn counted_len(row_mask: &[f32]) -> usize {
    row_mask.iter().rposition(|&m| m > 0.0).map_or(0, |last| last + 1)
}

fn check_layout(what: &str, lengths: &[usize], mask: &[f32], width: usize, rows: usize) {
    assert!(
        width > 0 && mask.len() == rows * width && lengths.iter().all(|&l| l == mask.len()),
        "{what}: every input needs {rows} rows of {width} entries ({} in the mask)",
        mask.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_score_and_a_kl_penalty_by_hand() {
        // Two rows of width 3: three tokens, then one token.
        let mask = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0];
        let kl = [0.5, -0.5, 1.0, 2.0, 9.0, 9.0];
        let rewards = token_rewards(&[1.0, -1.0], &kl, &mask, 3, 0.1);
        let want = [-0.05, 0.05, -0.1 + 1.0, -0.2 - 1.0, 0.0, 0.0];
        for (r, w) in rewards.iter().zip(want) {
            assert!((r - w).abs() < 1e-6, "{rewards:?}");
        }
        // γ = 1, λ = 1 and zero values: the advantage is the reward still to come.
        let values = [0.0; 6];
        let out = token_gae(&rewards, &values, &mask, 3, 1.0, 1.0);
        let want = [0.9, 0.95, 0.9, -1.2, 0.0, 0.0];
        for (a, w) in out.advantages.iter().zip(want) {
            assert!((a - w).abs() < 1e-6, "{:?}", out.advantages);
        }
        assert_eq!(out.advantages, out.returns);
    }

    #[test]
    fn the_last_token_does_not_bootstrap() {
        // V after the last token is 0: A_last = r_last − V_last, whatever γ and λ.
        let out = token_gae(&[0.0, 1.0], &[0.3, 0.7], &[1.0, 1.0], 2, 0.9, 0.5);
        assert!((out.advantages[1] - 0.3).abs() < 1e-6);
        // A_0 = δ_0 + γλ A_1 = (0 + 0.9 · 0.7 − 0.3) + 0.45 · 0.3.
        assert!((out.advantages[0] - (0.33 + 0.135)).abs() < 1e-6);
        assert!((out.returns[0] - (out.advantages[0] + 0.3)).abs() < 1e-6);
    }

    #[test]
    fn whitening_matches_trl_by_hand() {
        let x = [1.0, 2.0, 3.0, 100.0];
        let mask = [1.0, 1.0, 1.0, 0.0];
        // mean 2, unbiased variance 1.
        let w = masked_whiten(&x, &mask, true);
        let s = 1.0 / (1.0f64 + 1e-8).sqrt();
        assert_eq!(w, vec![(-s) as f32, 0.0, s as f32, 0.0]);
        let kept = masked_whiten(&x, &mask, false);
        assert_eq!(kept, vec![(2.0 - s) as f32, 2.0, (2.0 + s) as f32, 0.0]);
        assert_eq!(masked_whiten(&x, &[0.0; 4], true), vec![0.0; 4]);
    }

    /// Random rows: widths, counted lengths (possibly 0), values.
    fn rows() -> impl Strategy<Value = (usize, Vec<usize>, Vec<f32>, Vec<f32>)> {
        (1usize..8, 1usize..6).prop_flat_map(|(width, rows)| {
            (
                Just(width),
                prop::collection::vec(0..=width, rows),
                prop::collection::vec(-3.0f32..3.0, rows * width),
                prop::collection::vec(-3.0f32..3.0, rows * width),
            )
        })
    }

    fn mask_of(width: usize, lengths: &[usize]) -> Vec<f32> {
        (lengths.iter())
            .flat_map(|&len| (0..width).map(move |t| if t < len { 1.0 } else { 0.0 }))
            .collect()
    }

    proptest! {
        #[test]
        fn returns_with_lambda_one_are_the_rewards_to_go(
            (width, lengths, rewards, values) in rows(),
        ) {
            // λ = 1, γ = 1: A_t + V_t = Σ_{k ≥ t} r_k, whatever the critic says.
            let mask = mask_of(width, &lengths);
            let rewards: Vec<f32> = rewards.iter().zip(&mask).map(|(r, m)| r * m).collect();
            let out = token_gae(&rewards, &values, &mask, width, 1.0, 1.0);
            for (row, &len) in lengths.iter().enumerate() {
                for t in 0..width {
                    let k = row * width + t;
                    let to_go: f32 = if t < len { rewards[k..row * width + len].iter().sum() } else { 0.0 };
                    prop_assert!((out.returns[k] - to_go).abs() < 1e-4, "{:?} vs {to_go}", out.returns);
                }
            }
        }

        #[test]
        fn whitened_advantages_have_zero_mean_and_unit_variance(
            (width, lengths, values, _) in rows(),
        ) {
            let mask = mask_of(width, &lengths);
            let n = lengths.iter().sum::<usize>();
            prop_assume!(n >= 2);
            let counted: Vec<f64> = (values.iter().zip(&mask)).filter(|(_, m)| **m > 0.0).map(|(&v, _)| f64::from(v)).collect();
            let mean = counted.iter().sum::<f64>() / n as f64;
            prop_assume!(counted.iter().map(|v| (v - mean).powi(2)).sum::<f64>() > 1e-3);
            let mean_of = |x: &[f32]| x.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
            let w = masked_whiten(&values, &mask, true);
            prop_assert!(mean_of(&w).abs() < 1e-5);
            let var = w.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / (n - 1) as f64;
            prop_assert!((var - 1.0).abs() < 1e-3, "variance {var}");
            for (v, m) in w.iter().zip(&mask) {
                prop_assert!(*m > 0.0 || *v == 0.0);
            }
        }

        #[test]
        fn the_score_changes_only_the_advantages_before_it(
            (width, lengths, kl, values) in rows(),
            bonus in -2.0f32..2.0,
        ) {
            // Raising row 0's score by b raises its A_t by (γλ)^(T−1−t) b and nothing else.
            let mask = mask_of(width, &lengths);
            let rows = lengths.len();
            let scores = vec![0.5; rows];
            let mut raised = scores.clone();
            raised[0] += bonus;
            let (g, l) = (0.9, 0.8);
            let base = token_gae(&token_rewards(&scores, &kl, &mask, width, 0.1), &values, &mask, width, g, l);
            let more = token_gae(&token_rewards(&raised, &kl, &mask, width, 0.1), &values, &mask, width, g, l);
            let len = lengths[0];
            for k in 0..mask.len() {
                let want = if k < len { bonus * (g * l).powi((len - 1 - k) as i32) } else { 0.0 };
                prop_assert!((more.advantages[k] - base.advantages[k] - want).abs() < 1e-4);
            }
        }
    }
}
