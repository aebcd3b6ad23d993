//! `[curriculum]`: which training prompts a GRPO batch draws.

use serde::{Deserialize, Serialize};

/// How GRPO picks each batch's prompts. `kind = "pools"` (the default): difficulty pools
/// (prime-rl's `DifficultyPools`, verl's curriculum sampler) — each prompt's running pass rate
/// moves it between an easy, a normal and a hard pool, and each batch draws its prompts from the
/// pools in set shares; every prompt starts normal. `kind = "ucb"`: a distribution-level
/// curriculum over the data's sources (DUMP) — each prompt's source is drawn by the upper
/// confidence bound of the mean absolute advantage the source's recent completions gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CurriculumSection {
    /// `pools` or `ucb`.
    pub kind: CurriculumKind,
    /// Pools: share of each batch drawn from the easy pool (while it has prompts).
    pub easy: f64,
    /// Pools: share drawn from the hard pool (while it has prompts); the rest comes from the
    /// normal pool.
    pub hard: f64,
    /// Pools: a prompt whose running pass rate reaches this is easy.
    pub easy_above: f64,
    /// Pools: a prompt whose running pass rate is at most this is hard.
    pub hard_below: f64,
    /// Pools: the running pass rate's memory: `p ← smoothing · p + (1 − smoothing) · accuracy`
    /// of each new group of the prompt (0: the last group alone decides).
    pub smoothing: f64,
    /// UCB: how many of a source's latest completions its mean absolute advantage is taken over
    /// (DUMP's sliding window).
    pub window: usize,
    /// UCB: `c`, the weight of the exploration bonus `c·√(2 ln(N + 1) / (n + 1))`.
    pub exploration: f64,
    /// UCB: the softmax temperature turning the sources' scores into draw probabilities (toward
    /// 0: always the best-scoring source).
    pub temperature: f64,
    /// UCB: the sources to draw from (values of the `data.fields.source` column); empty: every
    /// source in the training data.
    pub sources: Vec<String>,
}

impl Default for CurriculumSection {
    /// The pools' shares and thresholds are prime-rl's spirit; the UCB settings are DUMP's
    /// (window 300, c = 1, temperature 0.1).
    fn default() -> Self {
        Self {
            kind: CurriculumKind::Pools,
            easy: 0.1,
            hard: 0.2,
            easy_above: 0.9,
            hard_below: 0.1,
            smoothing: 0.5,
            window: 300,
            exploration: 1.0,
            temperature: 0.1,
            sources: Vec::new(),
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
    /// Sources drawn by the upper confidence bound of their mean absolute advantage.
    Ucb,
}

impl CurriculumKind {
    /// The keys of `[curriculum]` this kind reads (`kind` included).
    pub(crate) fn keys(self) -> &'static [&'static str] {
        match self {
            Self::Pools => &["kind", "easy", "hard", "easy_above", "hard_below", "smoothing"],
            Self::Ucb => &["kind", "window", "exploration", "temperature", "sources"],
        }
    }

    /// As a recipe writes it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Pools => "pools",
            Self::Ucb => "ucb",
        }
    }

    /// The kind a `[curriculum]` table names (`pools` when it names none or an unknown one:
    /// deserializing reports that).
    pub(crate) fn of(table: &toml::Table) -> Self {
        match table.get("kind").and_then(|k| k.as_str()) {
            Some("ucb") => Self::Ucb,
            _ => Self::Pools,
        }
    }
}

impl CurriculumSection {
    /// The first key out of range, with what it must be.
    pub(crate) fn invalid(&self) -> Option<(&'static str, String)> {
        match self.kind {
            CurriculumKind::Pools => self.invalid_pools(),
            CurriculumKind::Ucb => self.invalid_ucb(),
        }
    }

    fn invalid_pools(&self) -> Option<(&'static str, String)> {
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

    fn invalid_ucb(&self) -> Option<(&'static str, String)> {
        if self.window == 0 {
            return Some(("curriculum.window", "must be at least 1 completion".into()));
        }
        if !(self.exploration.is_finite() && self.exploration >= 0.0) {
            return Some((
                "curriculum.exploration",
                format!("must be finite and ≥ 0, got {}", self.exploration),
            ));
        }
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return Some((
                "curriculum.temperature",
                format!("must be finite and > 0, got {}", self.temperature),
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(twice) = self.sources.iter().find(|s| !seen.insert(s.as_str())) {
            return Some(("curriculum.sources", format!("names {twice:?} twice")));
        }
        if self.sources.len() == 1 {
            return Some((
                "curriculum.sources",
                "a curriculum over one source draws nothing but it: name two or more, or none for all".into(),
            ));
        }
        None
    }
}
