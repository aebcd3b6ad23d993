//! A distribution-level curriculum (`[curriculum] kind = "ucb"`, DUMP: Wang et al. 2025,
//! "Automated Distribution-Level Curriculum Learning for RL-based LLM Post-training"): the
//! training data's sources (its `data_source` column) are the arms of a bandit whose payoff is
//! how much GRPO still learns from them, the mean absolute advantage of their completions.
//!
//! For source `j` with `n_j` completions scored so far (`N = Σ n_j`):
//!
//! ```text
//! L̂_j   = mean |A| over the last `window` completions of j      (0 before any)
//! UCB_j = L̂_j + c · √(2 ln(N + 1) / (n_j + 1))
//! P(j)  = exp(UCB_j / τ) / Σ_k exp(UCB_k / τ)
//! ```
//!
//! Each prompt of a batch draws its source from `P`, then a prompt of that source uniformly.
//! `A` is the advantage the group's own rewards give each completion (GRPO's group
//! normalisation, or RLOO's leave-one-out with `advantage = "rloo"`), so a group every
//! completion of which succeeds, or fails, scores 0: a source that is mastered or out of reach
//! loses its draws, one the model is learning gains them, and an unexplored one is tried. The
//! windows and counts are part of the run's state, so a resumed run draws as the uninterrupted
//! one.

use std::collections::{BTreeMap, VecDeque};

use rein_core::SeededRng;
use rein_recipe::CurriculumSection;
use serde::{Deserialize, Serialize};

use crate::Prompt;

/// The sources a UCB curriculum draws among, sorted: those of `row_sources` named in `wanted`
/// (all of them when `wanted` is empty). Errors with the recipe key at fault when a wanted
/// source has no row or fewer than two sources remain.
pub(crate) fn sources_to_draw<'a>(
    row_sources: impl IntoIterator<Item = &'a str>,
    wanted: &[String],
) -> Result<Vec<String>, (&'static str, String)> {
    let present: std::collections::BTreeSet<&str> = row_sources.into_iter().collect();
    let described = || {
        let names: Vec<String> = present.iter().map(|s| format!("{s:?}")).collect();
        names.join(", ")
    };
    if let Some(missing) = wanted.iter().find(|s| !present.contains(s.as_str())) {
        return Err((
            "curriculum.sources",
            format!(
                "{missing:?} has no rows in the training data (its sources: {})",
                described()
            ),
        ));
    }
    let chosen: Vec<String> = match wanted.is_empty() {
        true => present.iter().map(|s| s.to_string()).collect(),
        false => {
            let mut chosen = wanted.to_vec();
            chosen.sort();
            chosen
        }
    };
    if chosen.len() < 2 {
        return Err((
            "curriculum.kind",
            format!(
                "`ucb` draws among the training data's sources (the data.fields.source column), \
                 and it has one ({}): add a source column, or use kind = \"pools\"",
                described()
            ),
        ));
    }
    Ok(chosen)
}

/// The bandit's state: each source's recent absolute advantages and how many completions it
/// has had scored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SourceBandit {
    /// The sources, sorted.
    names: Vec<String>,
    /// Each source's latest `|A|`, oldest first, at most `window` of them.
    recent: Vec<VecDeque<f64>>,
    /// Completions scored per source (`n_j`).
    scored: Vec<u64>,
    /// Each source's prompts (from the prompts, not saved).
    #[serde(skip)]
    members: Vec<Vec<usize>>,
    /// Each prompt's source, `None` for a source not drawn (from the prompts, not saved).
    #[serde(skip)]
    source_of: Vec<Option<usize>>,
}

impl SourceBandit {
    /// A bandit over the sources of `prompts` the curriculum draws, none tried yet.
    pub(crate) fn new(prompts: &[Prompt], c: &CurriculumSection) -> Result<Self, (&'static str, String)> {
        let names = sources_to_draw(prompts.iter().map(|p| p.source.as_str()), &c.sources)?;
        let mut bandit = Self {
            recent: vec![VecDeque::new(); names.len()],
            scored: vec![0; names.len()],
            names,
            members: Vec::new(),
            source_of: Vec::new(),
        };
        bandit.index(prompts);
        Ok(bandit)
    }

    /// After a restore: the saved statistics, with the prompts indexed again; started afresh
    /// when the checkpoint's sources are not the ones the data now has.
    pub(crate) fn resumed(
        saved: Option<Self>,
        prompts: &[Prompt],
        c: &CurriculumSection,
    ) -> Result<Self, (&'static str, String)> {
        let fresh = Self::new(prompts, c)?;
        Ok(match saved {
            Some(mut saved) if saved.names == fresh.names => {
                saved.members = fresh.members;
                saved.source_of = fresh.source_of;
                saved
            }
            _ => fresh,
        })
    }

    fn index(&mut self, prompts: &[Prompt]) {
        let position: BTreeMap<&str, usize> = self.names.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect();
        self.members = vec![Vec::new(); self.names.len()];
        self.source_of = (prompts.iter().enumerate())
            .map(|(i, p)| {
                let source = position.get(p.source.as_str()).copied();
                if let Some(j) = source {
                    self.members[j].push(i);
                }
                source
            })
            .collect();
    }

    /// The sources, sorted.
    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }

    /// `L̂_j`: each source's mean absolute advantage over its window (0 before any).
    pub(crate) fn learnability(&self) -> Vec<f64> {
        (self.recent.iter())
            .map(|r| {
                if r.is_empty() {
                    0.0
                } else {
                    r.iter().sum::<f64>() / r.len() as f64
                }
            })
            .collect()
    }

    /// `P(j)`: each source's probability of being drawn next.
    pub(crate) fn weights(&self, c: &CurriculumSection) -> Vec<f64> {
        let total: u64 = self.scored.iter().sum();
        let scores: Vec<f64> = (self.learnability().into_iter().zip(&self.scored))
            .map(|(l, &n)| l + c.exploration * (2.0 * ((total + 1) as f64).ln() / (n + 1) as f64).sqrt())
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let exp: Vec<f64> = scores.iter().map(|s| ((s - max) / c.temperature).exp()).collect();
        let sum: f64 = exp.iter().sum();
        exp.into_iter().map(|e| e / sum).collect()
    }

    /// The next prompt: a source by [`Self::weights`], then one of its prompts uniformly.
    pub(crate) fn pick(&self, c: &CurriculumSection, rng: &mut SeededRng) -> usize {
        let members = &self.members[super::draw_weighted(&self.weights(c), rng)];
        members[rng.below(members.len() as u64) as usize]
    }

    /// Folds a scored group of `prompt` into its source's window: one `|A|` per completion.
    pub(crate) fn observe(&mut self, prompt: usize, advantages: &[f32], c: &CurriculumSection) {
        let Some(Some(j)) = self.source_of.get(prompt).copied() else {
            return;
        };
        let recent = &mut self.recent[j];
        recent.extend(advantages.iter().map(|a| f64::from(a.abs())));
        while recent.len() > c.window {
            recent.pop_front();
        }
        self.scored[j] += advantages.len() as u64;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn prompts(sources: &[&str]) -> Vec<Prompt> {
        (sources.iter())
            .map(|s| Prompt {
                text: String::new(),
                tokens: vec![1],
                answer: None,
                target: None,
                target_trained: None,
                metadata: String::new(),
                source: s.to_string(),
                images: Default::default(),
                image_files: Default::default(),
            })
            .collect()
    }

    fn ucb(exploration: f64, temperature: f64, window: usize) -> CurriculumSection {
        CurriculumSection {
            kind: rein_recipe::CurriculumKind::Ucb,
            exploration,
            temperature,
            window,
            ..CurriculumSection::default()
        }
    }

    /// By hand: source `a` scored two completions with |A| 1 and 0.5, `b` none. N = 2:
    /// UCB_a = 0.75 + √(2 ln 3 / 3) = 1.605809, UCB_b = √(2 ln 3) = 1.482304;
    /// at τ = 1, P(a) = 1 / (1 + e^(UCB_b − UCB_a)) = 0.530837; at τ = 0.1, 0.774701.
    #[test]
    fn weights_are_the_softmax_of_the_upper_confidence_bounds() {
        let prompts = prompts(&["a", "b", "a"]);
        let mut bandit = SourceBandit::new(&prompts, &ucb(1.0, 1.0, 300)).unwrap();
        assert_eq!(bandit.weights(&ucb(1.0, 1.0, 300)), vec![0.5, 0.5]);
        bandit.observe(2, &[1.0, -0.5], &ucb(1.0, 1.0, 300));
        assert_eq!(bandit.learnability(), vec![0.75, 0.0]);
        let p = bandit.weights(&ucb(1.0, 1.0, 300));
        assert!(
            (p[0] - 0.530837).abs() < 1e-6 && (p[0] + p[1] - 1.0).abs() < 1e-12,
            "{p:?}"
        );
        let p = bandit.weights(&ucb(1.0, 0.1, 300));
        assert!((p[0] - 0.774701).abs() < 1e-6, "{p:?}");
        // Without exploration the better source takes (nearly) every draw.
        let p = bandit.weights(&ucb(0.0, 0.1, 300));
        assert!((p[0] - 1.0 / (1.0 + (-7.5f64).exp())).abs() < 1e-12, "{p:?}");
    }

    /// The window keeps a source's latest completions only; counts keep them all.
    #[test]
    fn the_window_forgets_old_completions() {
        let c = ucb(1.0, 0.1, 3);
        let mut bandit = SourceBandit::new(&prompts(&["a", "b"]), &c).unwrap();
        bandit.observe(0, &[2.0, 2.0], &c);
        bandit.observe(0, &[0.5, -0.5], &c);
        assert_eq!(bandit.learnability()[0], 1.0); // 2, 0.5, 0.5
        assert_eq!(bandit.scored, vec![4, 0]);
    }

    /// Draws follow the weights, and stay within the sources asked for.
    #[test]
    fn draws_follow_the_weights_within_the_chosen_sources() {
        let c = CurriculumSection {
            sources: vec!["b".into(), "c".into()],
            ..ucb(1.0, 1.0, 300)
        };
        let prompts = prompts(&["a", "b", "c", "b", "a", "c"]);
        let mut bandit = SourceBandit::new(&prompts, &c).unwrap();
        bandit.observe(1, &[1.0, -1.0], &c); // b
        bandit.observe(0, &[5.0], &c); // a is not drawn: ignored
        let weights = bandit.weights(&c);
        let mut rng = SeededRng::new(5);
        let mut counts = [0usize; 6];
        for _ in 0..40_000 {
            counts[bandit.pick(&c, &mut rng)] += 1;
        }
        assert_eq!(counts[0] + counts[4], 0, "{counts:?}");
        let b = (counts[1] + counts[3]) as f64 / 40_000.0;
        assert!((b - weights[0]).abs() < 0.01, "{b} vs {weights:?}");
        assert!(counts[1] > 0 && counts[3] > 0);
    }

    #[test]
    fn missing_or_single_sources_are_refused_with_the_key() {
        let none: [String; 0] = [];
        let (key, message) = sources_to_draw(["x", "x"], &none).unwrap_err();
        assert_eq!(key, "curriculum.kind");
        assert!(message.contains("has one (\"x\")"), "{message}");
        // Rows without a source are one source of their own.
        assert_eq!(sources_to_draw(["x", ""], &none).unwrap(), ["", "x"]);
        let (key, message) = sources_to_draw(["x", "y"], &["z".into(), "x".into()]).unwrap_err();
        assert_eq!(key, "curriculum.sources");
        assert!(message.contains("\"z\" has no rows"), "{message}");
        assert_eq!(sources_to_draw(["y", "x", "y"], &none).unwrap(), ["x", "y"]);
    }

    /// A restored bandit keeps its statistics when the data has the same sources.
    #[test]
    fn resumed_keeps_statistics_for_the_same_sources_only() {
        let c = ucb(1.0, 0.1, 300);
        let (two, three) = (prompts(&["a", "b"]), prompts(&["a", "b", "c"]));
        let mut bandit = SourceBandit::new(&two, &c).unwrap();
        bandit.observe(1, &[0.25], &c);
        let saved: SourceBandit = serde_json::from_str(&serde_json::to_string(&bandit).unwrap()).unwrap();
        assert_eq!(SourceBandit::resumed(Some(saved.clone()), &two, &c).unwrap(), bandit);
        let fresh = SourceBandit::resumed(Some(saved), &three, &c).unwrap();
        assert_eq!(fresh.scored, vec![0, 0, 0]);
    }

    proptest! {
        /// Whatever the statistics, the weights are a distribution; with equal counts, a source
        /// with more learnability never weighs less.
        #[test]
        fn weights_are_a_distribution_ordered_by_learnability(
            stats in prop::collection::vec((0.0f64..5.0, 0u64..1000), 2..6),
            exploration in 0.0f64..3.0,
            temperature in 0.01f64..5.0,
        ) {
            let c = ucb(exploration, temperature, 300);
            let bandit = SourceBandit {
                names: (0..stats.len()).map(|i| i.to_string()).collect(),
                recent: stats.iter().map(|&(l, _)| VecDeque::from([l])).collect(),
                scored: stats.iter().map(|&(_, n)| n).collect(),
                members: Vec::new(),
                source_of: Vec::new(),
            };
            let weights = bandit.weights(&c);
            prop_assert!((weights.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            prop_assert!(weights.iter().all(|w| w.is_finite() && *w >= 0.0));
            let equal = SourceBandit { scored: vec![7; stats.len()], ..bandit };
            let weights = equal.weights(&c);
            for i in 0..stats.len() {
                for j in 0..stats.len() {
                    if stats[i].0 > stats[j].0 {
                        prop_assert!(weights[i] >= weights[j]);
                    }
                }
            }
        }
    }
}
