//! Rewards: groups of completions in, one score per completion out.

use serde::{Deserialize, Serialize};

use crate::error::OutputError;

/// One prompt with its G sampled completions: the unit a reward scores.
///
/// Group-level input is what majority-vote (TTRL), self-consistency and in-group-reference
/// rewards need; per-completion rewards simply score each completion in turn.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Group {
    /// The prompt as written in the dataset: the user's text, before any chat template (the
    /// model saw it inside its chat template).
    pub prompt: String,
    /// The G completions sampled for this prompt.
    pub completions: Vec<String>,
    /// The reference answer, when the dataset has one.
    #[serde(default)]
    pub reference: Option<String>,
    /// Free-form JSON from the dataset row (empty string when there is none).
    #[serde(default)]
    pub metadata: String,
}

/// The reward of one completion.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CompletionScore {
    /// The score, or `None` when the reward does not apply to this completion (it then counts
    /// neither for nor against it when several rewards are summed).
    pub score: Option<f64>,
    /// Named parts of the score (e.g. `format`, `correct`), for logging.
    #[serde(default)]
    pub components: Vec<(String, f64)>,
}

/// The scores of one group, one entry per completion, in order.
pub type GroupScores = Vec<CompletionScore>;

/// A reward function over groups of completions.
pub trait RewardFn: Send {
    /// The reward's name, used in logs, metrics and errors.
    fn name(&self) -> &str;

    /// Scores a batch of groups: one [`GroupScores`] per group, each with one entry per
    /// completion. Implementations validate their output with [`validate_group_scores`].
    fn score(&mut self, groups: &[Group]) -> Result<Vec<GroupScores>, crate::PluginError>;

    /// How many calls have failed so far, by kind (none for rewards that cannot fail).
    fn failures(&self) -> crate::FailureCounts {
        crate::FailureCounts::default()
    }

    /// What its judge did since the last time this was asked (`None` for rewards without one).
    fn take_judge_usage(&mut self) -> Option<crate::JudgeUsage> {
        None
    }
}

/// Checks that `scores` fits `groups`: one entry per group, one score per completion, every
/// score and component finite.
pub fn validate_group_scores(groups: &[Group], scores: &[GroupScores]) -> Result<(), OutputError> {
    if scores.len() != groups.len() {
        return Err(OutputError::WrongLength {
            what: "groups".into(),
            expected: groups.len(),
            got: scores.len(),
        });
    }
    for (g, (group, group_scores)) in groups.iter().zip(scores).enumerate() {
        if group_scores.len() != group.completions.len() {
            return Err(OutputError::WrongLength {
                what: format!("scores in group {g}"),
                expected: group.completions.len(),
                got: group_scores.len(),
            });
        }
        for (c, completion) in group_scores.iter().enumerate() {
            if let Some(score) = completion.score.filter(|s| !s.is_finite()) {
                return Err(OutputError::NonFinite {
                    what: format!("score of group {g}, completion {c}"),
                    value: score,
                });
            }
            if let Some((name, value)) = completion.components.iter().find(|(_, v)| !v.is_finite()) {
                return Err(OutputError::NonFinite {
                    what: format!("component `{name}` of group {g}, completion {c}"),
                    value: *value,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(n: usize) -> Group {
        Group {
            prompt: "p".into(),
            completions: vec!["c".into(); n],
            ..Group::default()
        }
    }

    fn scored(v: f64) -> CompletionScore {
        CompletionScore {
            score: Some(v),
            components: vec![],
        }
    }

    #[test]
    fn matching_scores_are_accepted() {
        let scores = vec![vec![scored(1.0), CompletionScore::default()]];
        assert_eq!(validate_group_scores(&[group(2)], &scores), Ok(()));
    }

    #[test]
    fn wrong_number_of_groups_is_rejected() {
        let err = validate_group_scores(&[group(1), group(1)], &[vec![scored(0.0)]]).unwrap_err();
        assert!(
            matches!(
                err,
                OutputError::WrongLength {
                    expected: 2,
                    got: 1,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn wrong_number_of_scores_names_the_group() {
        let err = validate_group_scores(&[group(1), group(3)], &[vec![scored(0.0)], vec![scored(0.0)]]).unwrap_err();
        assert_eq!(err.to_string(), "returned 1 scores in group 1, expected 3");
    }

    #[test]
    fn nan_and_infinite_scores_are_rejected() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let err = validate_group_scores(&[group(1)], &[vec![scored(bad)]]).unwrap_err();
            assert!(matches!(err, OutputError::NonFinite { .. }), "{err}");
        }
        let component = CompletionScore {
            score: Some(1.0),
            components: vec![("format".into(), f64::NAN)],
        };
        let err = validate_group_scores(&[group(1)], &[vec![component]]).unwrap_err();
        assert!(err.to_string().contains("component `format`"), "{err}");
    }
}
