//! Which training prompts a GRPO batch draws (`[curriculum]`): difficulty pools by each
//! prompt's pass rate ([`pools`]), or a bandit over the data's sources ([`sources`]).

use std::collections::BTreeMap;

use rein_core::{AdvantageKind, SeededRng};
use rein_optim::{group_normalized, rloo};
use rein_recipe::GrpoSection;

use crate::counts_as_correct;

mod pools;
mod sources;

pub(crate) use pools::DifficultyPools;
pub(crate) use sources::{SourceBandit, sources_to_draw};

/// Which of a group's `n` completions `reward` counts correct, as the held-out evaluation
/// counts ([`counts_as_correct`]). `components` are the group's per-reward columns (NaN where
/// a reward gave no value).
pub(crate) fn completions_correct(components: &BTreeMap<String, Vec<f64>>, n: usize, reward: &str) -> Vec<bool> {
    let value = |key: &str, c: usize| components.get(key).map(|v| v[c]).filter(|v| v.is_finite());
    let correct_key = format!("{reward}/correct");
    (0..n)
        .map(|c| counts_as_correct(value(&correct_key, c), value(reward, c)))
        .collect()
}

/// The share of a group's `n` completions that `reward` counts correct ([`completions_correct`]).
pub(crate) fn group_accuracy(components: &BTreeMap<String, Vec<f64>>, n: usize, reward: &str) -> f64 {
    let hits = completions_correct(components, n, reward)
        .into_iter()
        .filter(|&ok| ok)
        .count();
    hits as f64 / n.max(1) as f64
}

/// Index `i` with probability `weights[i] / Σ weights` (weights ≥ 0, some positive): a pool of
/// the difficulty pools, or a source of the bandit.
fn draw_weighted(weights: &[f64], rng: &mut SeededRng) -> usize {
    let mut u = rng.uniform() * weights.iter().sum::<f64>();
    let mut chosen = 0;
    for (i, &w) in weights.iter().enumerate().filter(|(_, w)| **w > 0.0) {
        chosen = i;
        if u < w {
            break;
        }
        u -= w;
    }
    chosen
}

/// The advantages a group's own rewards give its completions, what the sources' bandit
/// learns from: RLOO's leave-one-out with `advantage = "rloo"`, else GRPO's group
/// normalisation (with the recipe's `std_scaling`; `batch` divides by this group's own
/// deviation, since each group is scored apart).
pub(crate) fn group_advantages(rewards: &[f32], grpo: &GrpoSection) -> Vec<f32> {
    match grpo.advantage {
        AdvantageKind::Rloo if rewards.len() > 1 => rloo(rewards, rewards.len()),
        _ => group_normalized(rewards, rewards.len().max(1), grpo.std_scaling),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accuracy_reads_the_correct_component_or_else_a_positive_score() {
        let mut components = BTreeMap::new();
        components.insert("math".to_string(), vec![1.0, 0.2, 0.0, f64::NAN]);
        assert_eq!(group_accuracy(&components, 4, "math"), 0.5);
        components.insert("math/correct".to_string(), vec![1.0, 0.0, 0.0, f64::NAN]);
        assert_eq!(group_accuracy(&components, 4, "math"), 0.25);
        assert_eq!(group_accuracy(&components, 4, "other"), 0.0);
    }
}
