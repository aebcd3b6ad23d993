//! GiGPO's advantages for multi-turn episodes (Feng et al. 2025, "Group-in-Group Policy
//! Optimization for LLM Agent Training"), for one group of G episodes started from the same row.
//!
//! ```text
//! episode level:  A^E(τ_i)     = (R(τ_i) − mean_j R(τ_j)) / F                R(τ) = Σ_t r_t
//! step level:     A^S(a_t^i)   = (R_t^i − mean_{(j,k) ∈ G^S(s)} R_k^j) / F    R_t^i = Σ_{k≥t} γ^{k−t} r_k^i
//! combined:       A(a_t^i)     = A^E(τ_i) + ω · A^S(a_t^i)
//! ```
//!
//! `G^S(s)` is the anchor-state group of the state `s` turn t of episode i started from: every
//! turn of the group's episodes that started from the same state (the same state key). The
//! first turn of every episode starts from the row's initial state; later turns start from the
//! key the environment returned after the turn before (no key: the turn is in no step group and
//! its step advantage is 0). F is the group's standard deviation + ε, or 1 (`scale_by_std`
//! false, GiGPO's "mean-norm" variant).

use std::collections::HashMap;

/// ε in the denominators, as [`crate::group_normalized`] uses.
const EPS: f64 = 1e-4;

/// One turn of an episode: the reward given on it and the state key returned after it.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutcome {
    /// The reward given on this turn (0 when none).
    pub reward: f32,
    /// The environment's state after this turn, when it says.
    pub state_after: Option<String>,
}

/// GiGPO's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GigpoConfig {
    /// γ for the step-level discounted returns.
    pub gamma: f32,
    /// ω, the weight of the step-level advantage.
    pub step_weight: f32,
    /// Divide by the group's standard deviation (+ε); else by 1.
    pub scale_by_std: bool,
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

/// Unbiased standard deviation, 0 for fewer than two values.
fn std(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return 0.0;
    }
    let m = mean(xs);
    (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (xs.len() - 1) as f64).sqrt()
}

/// `(x − mean) / F` for each of `xs`.
fn normalized(xs: &[f64], scale_by_std: bool) -> Vec<f64> {
    let m = mean(xs);
    let f = if scale_by_std { std(xs) + EPS } else { 1.0 };
    xs.iter().map(|x| (x - m) / f).collect()
}

/// The advantage of every turn of every episode of one group: `result[i][t]` for turn t of
/// episode i.
pub fn gigpo_advantages(episodes: &[Vec<TurnOutcome>], config: GigpoConfig) -> Vec<Vec<f32>> {
    // Episode level.
    let returns: Vec<f64> = (episodes.iter())
        .map(|turns| turns.iter().map(|t| f64::from(t.reward)).sum())
        .collect();
    let episode_advantage = normalized(&returns, config.scale_by_std);

    // Step level: each turn's discounted return-to-go and the state it started from.
    let mut anchors: HashMap<Option<&str>, Vec<(usize, usize)>> = HashMap::new();
    let mut to_go: Vec<Vec<f64>> = Vec::with_capacity(episodes.len());
    for (i, turns) in episodes.iter().enumerate() {
        let mut g = vec![0.0f64; turns.len()];
        let mut acc = 0.0f64;
        for t in (0..turns.len()).rev() {
            acc = f64::from(turns[t].reward) + f64::from(config.gamma) * acc;
            g[t] = acc;
        }
        to_go.push(g);
        for t in 0..turns.len() {
            // `None` keys the initial state; a turn after one without a key joins no group.
            let start = match t {
                0 => Some(None),
                _ => turns[t - 1].state_after.as_deref().map(Some),
            };
            if let Some(start) = start {
                anchors.entry(start).or_default().push((i, t));
            }
        }
    }
    let mut step_advantage: Vec<Vec<f64>> = episodes.iter().map(|turns| vec![0.0; turns.len()]).collect();
    for members in anchors.values() {
        let values: Vec<f64> = members.iter().map(|&(i, t)| to_go[i][t]).collect();
        for (&(i, t), a) in members.iter().zip(normalized(&values, config.scale_by_std)) {
            step_advantage[i][t] = a;
        }
    }

    (episode_advantage.iter().zip(&step_advantage))
        .map(|(&episode, steps)| {
            (steps.iter())
                .map(|&step| (episode + f64::from(config.step_weight) * step) as f32)
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn turn(reward: f32, key: Option<&str>) -> TurnOutcome {
        TurnOutcome {
            reward,
            state_after: key.map(String::from),
        }
    }

    const MEAN_NORM: GigpoConfig = GigpoConfig {
        gamma: 0.5,
        step_weight: 1.0,
        scale_by_std: false,
    };

    #[test]
    fn matches_a_hand_calculation() {
        // Three guess-number episodes of one row. Episode 0 guesses 50 (Lower: state 1-49), then
        // wins; episode 1 guesses 50 (1-49), then loses; episode 2 guesses 75 (Lower: 1-74),
        // then wins.
        let episodes = vec![
            vec![turn(0.0, Some("1-49")), turn(1.0, None)],
            vec![turn(0.0, Some("1-49")), turn(0.0, None)],
            vec![turn(0.0, Some("1-74")), turn(1.0, None)],
        ];
        let a = gigpo_advantages(&episodes, MEAN_NORM);
        // Episode returns 1, 0, 1: mean 2/3, so A^E = 1/3, −2/3, 1/3.
        // Returns to go with γ = 0.5: first turns 0.5, 0, 0.5; second turns 1, 0, 1.
        // Anchor "initial" = the three first turns: mean 1/3 → A^S = 1/6, −1/3, 1/6.
        // Anchor "1-49" = the second turns of episodes 0 and 1: mean 0.5 → A^S = 0.5, −0.5.
        // Anchor "1-74" = episode 2's second turn alone → A^S = 0.
        let expected = [
            [1.0 / 3.0 + 1.0 / 6.0, 1.0 / 3.0 + 0.5],
            [-2.0 / 3.0 - 1.0 / 3.0, -2.0 / 3.0 - 0.5],
            [1.0 / 3.0 + 1.0 / 6.0, 1.0 / 3.0],
        ];
        for (got, want) in a.iter().zip(expected) {
            for (g, w) in got.iter().zip(want) {
                assert!((f64::from(*g) - w).abs() < 1e-6, "{a:?}");
            }
        }
    }

    #[test]
    fn scaling_by_std_divides_each_level_by_its_own_spread() {
        let episodes = vec![vec![turn(1.0, None)], vec![turn(0.0, None)]];
        let config = GigpoConfig {
            scale_by_std: true,
            ..MEAN_NORM
        };
        // Returns 1 and 0: mean 0.5, unbiased std √0.5; both levels see the same values here.
        let a = gigpo_advantages(&episodes, config);
        let level = 0.5 / (0.5f64.sqrt() + EPS);
        assert!((f64::from(a[0][0]) - 2.0 * level).abs() < 1e-5, "{a:?}");
        assert!((f64::from(a[1][0]) + 2.0 * level).abs() < 1e-5, "{a:?}");
    }

    proptest! {
        /// With ω = 0 GiGPO is GRPO over whole episodes (every turn of an episode shares its
        /// episode advantage); the step advantages of each anchor group sum to zero.
        #[test]
        fn reduces_to_episode_grpo_and_centres_each_anchor_group(
            episodes in prop::collection::vec(
                prop::collection::vec((0u8..3, prop::option::of(0u8..3)), 1..5),
                1..6,
            ),
        ) {
            let episodes: Vec<Vec<TurnOutcome>> = (episodes.iter())
                .map(|turns| turns.iter().map(|&(r, k)| turn(f32::from(r), k.map(|k| ["a", "b", "c"][k as usize]))).collect())
                .collect();
            let grpo = gigpo_advantages(&episodes, GigpoConfig { step_weight: 0.0, ..MEAN_NORM });
            let returns: Vec<f64> = episodes.iter().map(|t| t.iter().map(|t| f64::from(t.reward)).sum()).collect();
            let m = mean(&returns);
            for (advantages, r) in grpo.iter().zip(&returns) {
                for a in advantages {
                    prop_assert!((f64::from(*a) - (r - m)).abs() < 1e-5);
                }
            }
            let both = gigpo_advantages(&episodes, MEAN_NORM);
            let mut sums: HashMap<Option<Option<&str>>, f64> = HashMap::new();
            for (i, turns) in episodes.iter().enumerate() {
                for t in 0..turns.len() {
                    let start = if t == 0 { Some(None) } else { turns[t - 1].state_after.as_deref().map(Some) };
                    *sums.entry(start).or_default() += f64::from(both[i][t] - grpo[i][t]);
                }
            }
            for (start, sum) in sums {
                if start.is_some() {
                    prop_assert!(sum.abs() < 1e-4, "anchor {start:?} sums to {sum}");
                }
            }
        }
    }
}
