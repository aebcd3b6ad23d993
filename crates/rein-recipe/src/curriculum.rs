//! `[curriculum]`: which training prompts a GRPO batch draws.

use serde::{Deserialize, Serialize};

/// Difficulty pools (prime-rl's `DifficultyPools`, verl's curriculum sampler): each prompt's
/// running pass rate moves it between an easy, a normal and a hard pool, and each batch draws
/// its prompts from the pools in set shares. Every prompt starts normal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CurriculumSection {
    /// `pools` (the only kind so far).
    pub kind: CurriculumKind,
    /// Share of each batch drawn from the easy pool (while it has prompts).
    pub easy: f64,
    /// Share drawn from the hard pool (while it has prompts); the rest comes from the normal
    /// pool.
    pub hard: f64,
    /// A prompt whose running pass rate reaches this is easy.
    pub easy_above: f64,
    /// A prompt whose running pass rate is at most this is hard.
    pub hard_below: f64,
    /// The running pass rate's memory: `p ← smoothing · p + (1 − smoothing) · accuracy` of each
    /// new group of the prompt (0: the last group alone decides).
    pub smoothing: f64,
}

impl Default for CurriculumSection {
    fn default() -> Self {
        Self {
            kind: CurriculumKind::Pools,
            easy: 0.1,
            hard: 0.2,
            easy_above: 0.9,
            hard_below: 0.1,
            smoothing: 0.5,
        }
    }
}

/// The kinds of curriculum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CurriculumKind {
    /// Easy / normal / hard pools by running pass rate.
    #[default]
    Pools,
}

impl CurriculumSection {
    /// The first key out of range, with what it must be.
    pub(crate) fn invalid(&self) -> Option<(&'static str, String)> {
        let share = |x: f64| (0.0..=1.0).contains(&x);
        if !share(self.easy) || !share(self.hard) || self.easy + self.hard > 1.0 {
            return Some((
                "curriculum.easy",
                format!(
                    "`easy` and `hard` are shares of a batch: each in [0, 1], together at most 1 (got {} and {})",
                    self.easy, self.hard
                ),
            ));
        }
        if !(share(self.hard_below) && share(self.easy_above) && self.hard_below < self.easy_above) {
            return Some((
                "curriculum.easy_above",
                format!(
                    "needs 0 ≤ hard_below < easy_above ≤ 1 (got hard_below {}, easy_above {})",
                    self.hard_below, self.easy_above
                ),
            ));
        }
        if !(0.0..1.0).contains(&self.smoothing) {
            return Some((
                "curriculum.smoothing",
                format!("must be in [0, 1), got {}", self.smoothing),
            ));
        }
        None
    }
}
