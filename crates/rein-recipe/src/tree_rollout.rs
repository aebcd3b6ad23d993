//! `[rollout]`: how a GRPO group's completions are sampled — each on its own (`kind =
//! "groups"`, the default), or as a tree (`kind = "tree"`: TreeRL's EPTree, Tree-GRPO; for
//! multi-turn episodes, ARPO's branching after tool calls).
//!
//! A tree starts with `trunks` whole completions of the prompt. Each of `rounds` rounds then
//! picks `branch_points` tokens among the tree's leaves by `rule` and samples `branches` new
//! continuations from each, every branch sharing the tokens before its branch point. The group
//! is the tree's leaves: `trunks + rounds × branch_points × branches` of them, which must be
//! `sampler.n`. Each token's advantage adds to its leaf's (GRPO's) `step_weight` times the step
//! advantage of the branch points above it (`rein_optim::tree_step_advantages`).

use serde::{Deserialize, Serialize};

/// `[rollout]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutSection {
    /// `groups` or `tree`.
    pub kind: RolloutKind,
    /// Tree: whole completions sampled first.
    pub trunks: usize,
    /// Tree: tokens branched from in each round.
    pub branch_points: usize,
    /// Tree: continuations sampled from each branch point.
    pub branches: usize,
    /// Tree: rounds of branching.
    pub rounds: usize,
    /// Tree: how branch points are chosen.
    pub rule: BranchRule,
    /// Tree, `rule = "interval"`: branch points every this many tokens.
    pub interval: usize,
    /// Tree: the weight of the branch points' step advantage beside the leaf's.
    pub step_weight: f32,
}

impl Default for RolloutSection {
    /// Two trunks, one round of three branch points with two branches each: 8 leaves.
    fn default() -> Self {
        Self {
            kind: RolloutKind::Groups,
            trunks: 2,
            branch_points: 3,
            branches: 2,
            rounds: 1,
            rule: BranchRule::Entropy,
            interval: 16,
            step_weight: 1.0,
        }
    }
}

/// How a group's completions are sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RolloutKind {
    /// `sampler.n` completions of each prompt, each on its own.
    #[default]
    Groups,
    /// A tree of completions branching from each other.
    Tree,
}

impl RolloutKind {
    /// The keys of `[rollout]` this kind reads (`kind` included).
    pub(crate) fn keys(self) -> &'static [&'static str] {
        match self {
            Self::Groups => &["kind"],
            Self::Tree => &[
                "kind",
                "trunks",
                "branch_points",
                "branches",
                "rounds",
                "rule",
                "interval",
                "step_weight",
            ],
        }
    }

    /// As a recipe writes it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Groups => "groups",
            Self::Tree => "tree",
        }
    }

    /// The kind a `[rollout]` table names (`groups` when it names none or an unknown one:
    /// deserializing reports that).
    pub(crate) fn of(table: &toml::Table) -> Self {
        match table.get("kind").and_then(|k| k.as_str()) {
            Some("tree") => Self::Tree,
            _ => Self::Groups,
        }
    }
}

/// Which tokens a tree branches from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BranchRule {
    /// The tokens the policy was least sure of: the highest entropy of its next-token
    /// distribution (TreeRL's EPTree, ARPO's entropy-triggered branching).
    Entropy,
    /// Every `interval` tokens.
    Interval,
    /// The first token of each line (after a token that ends one): reasoning steps.
    Lines,
    /// Multi-turn episodes: the model's first token after a tool's reply, by entropy (ARPO's
    /// branching after tool calls). A branch starts from a copy of the episode with the tool's
    /// reply in it: the tool is called once for all the branches.
    #[serde(rename = "tool_calls")]
    ToolCalls,
}

impl RolloutSection {
    /// The leaves of one tree: the group's size (`usize::MAX` past it, for sizes a recipe
    /// could set that no group has).
    pub fn leaves(&self) -> usize {
        let branched = self
            .rounds
            .saturating_mul(self.branch_points)
            .saturating_mul(self.branches);
        self.trunks.saturating_add(branched)
    }

    /// Itself when it asks for a tree (`kind = "tree"`).
    pub fn tree(&self) -> Option<RolloutSection> {
        (self.kind == RolloutKind::Tree).then_some(*self)
    }
}
