//! Rewards: groups of completions in, one score per completion out, and, from a reward that
//! scores steps, scores on spans of each completion's text.

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
    /// Each completion's tokens, for a reward that reads them ([`RewardFn::reads_tokens`]);
    /// empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<Vec<Token>>,
    /// The prompt's images, for a reward that reads them ([`RewardFn::reads_images`]); empty
    /// otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<crate::Image>,
}

/// One token of a completion, as the sampler drew it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Token {
    /// The characters it added to the completion's text (a completion's token texts,
    /// concatenated, are its text; empty for a token ending inside a character).
    pub text: String,
    /// Its log-probability under the policy that sampled it.
    pub logprob: f32,
}

/// The score of one step of a completion: its characters `start..end` (Unicode scalar values,
/// not bytes).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepScore {
    /// The step's first character.
    pub start: usize,
    /// One past its last character.
    pub end: usize,
    /// Its score.
    pub score: f64,
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
    /// Scores of the completion's steps (non-empty, in-bounds, non-overlapping spans); empty
    /// for a reward of outcomes only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepScore>,
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

    /// It reads each completion's tokens ([`Group::tokens`]): the caller fills them in.
    fn reads_tokens(&self) -> bool {
        false
    }

    /// It reads the prompt's images ([`Group::images`]): the caller fills them in.
    fn reads_images(&self) -> bool {
        false
    }
}

/// Checks that `scores` fits `groups`: one entry per group, one score per completion, every
/// score, component and step score finite, every step a non-empty span of its completion that
/// overlaps no other.
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
            if !completion.steps.is_empty() {
                let len = group.completions[c].chars().count();
                validate_steps(&completion.steps, len).map_err(|(s, reason)| OutputError::BadStep {
                    what: format!("step {s} of group {g}, completion {c}"),
                    reason,
                })?;
            }
        }
    }
    Ok(())
}

/// The first step (its index, and why) that is not finite, not a non-empty span of a
/// completion of `len` characters, or overlaps another.
fn validate_steps(steps: &[StepScore], len: usize) -> Result<(), (usize, String)> {
    for (i, step) in steps.iter().enumerate() {
        if !step.score.is_finite() {
            return Err((i, format!("its score is {}", step.score)));
        }
        if step.start >= step.end || step.end > len {
            let (start, end) = (step.start, step.end);
            return Err((
                i,
                format!("spans characters {start}..{end} of a completion of {len} characters"),
            ));
        }
    }
    let mut order: Vec<usize> = (0..steps.len()).collect();
    order.sort_by_key(|&i| (steps[i].start, steps[i].end));
    for pair in order.windows(2) {
        let (a, b) = (&steps[pair[0]], &steps[pair[1]]);
        if b.start < a.end {
            let (first, start, end) = (pair[0], a.start, a.end);
            return Err((pair[1], format!("overlaps step {first} (characters {start}..{end})")));
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
            ..CompletionScore::default()
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
            ..CompletionScore::default()
        };
        let err = validate_group_scores(&[group(1)], &[vec![component]]).unwrap_err();
        assert!(err.to_string().contains("component `format`"), "{err}");
    }

    fn with_steps(steps: &[(usize, usize, f64)]) -> Vec<GroupScores> {
        let steps = steps.iter().map(|&(start, end, score)| StepScore { start, end, score });
        vec![vec![CompletionScore {
            steps: steps.collect(),
            ..scored(1.0)
        }]]
    }

    #[test]
    fn steps_must_be_finite_disjoint_spans_of_their_completion() {
        let group = Group {
            completions: vec!["a½c\nd".into()],
            ..Group::default()
        };
        let check = |steps| validate_group_scores(std::slice::from_ref(&group), &with_steps(steps));
        assert_eq!(check(&[(3, 5, 1.0), (0, 3, -1.0)]), Ok(()), "5 characters, 6 bytes");
        let bad = |steps, expected: &str| {
            let err = check(steps).unwrap_err();
            assert_eq!(err.to_string(), expected);
        };
        bad(
            &[(0, 6, 1.0)],
            "returned a bad step 0 of group 0, completion 0: spans characters 0..6 of a completion of 5 characters",
        );
        bad(
            &[(0, 2, 1.0), (2, 2, 1.0)],
            "returned a bad step 1 of group 0, completion 0: spans characters 2..2 of a completion of 5 characters",
        );
        bad(
            &[(2, 5, 1.0), (0, 3, 1.0)],
            "returned a bad step 0 of group 0, completion 0: overlaps step 1 (characters 0..3)",
        );
        bad(
            &[(0, 1, f64::NAN)],
            "returned a bad step 0 of group 0, completion 0: its score is NaN",
        );
    }
}
