//! Several reward functions combined: a weighted sum per completion, every component logged,
//! and a policy for plugin failures; the label-free signals the host adds from the sampler's
//! statistics ([`signal`]); where step scores land among a completion's tokens ([`steps`]).

pub(crate) mod setup;
pub mod signal;
pub mod steps;

use std::collections::BTreeMap;

pub use rein_core::OnError;
use rein_core::{Group, PluginError, RewardFn, StepScore};

/// A reward function with its weight.
pub struct WeightedReward {
    /// The function (a plugin, usually).
    pub reward: Box<dyn RewardFn>,
    /// Its weight in the sum.
    pub weight: f64,
    /// It judges each completion on its own (no group-level comparison), so a group that fails
    /// is retried one completion at a time and a completion that still fails scores 0: one
    /// hostile completion (an infinite loop in the code it wrote) costs only its own score.
    pub isolate: bool,
}

/// A reward under the name the recipe gives it (`reward[i].name`), so that two uses of one
/// plugin are told apart in metrics.
pub struct Renamed<R>(pub String, pub R);

impl<R: RewardFn> RewardFn for Renamed<R> {
    fn name(&self) -> &str {
        &self.0
    }

    fn score(&mut self, groups: &[Group]) -> Result<Vec<rein_core::GroupScores>, PluginError> {
        self.1.score(groups)
    }

    fn failures(&self) -> rein_core::FailureCounts {
        self.1.failures()
    }

    fn take_judge_usage(&mut self) -> Option<rein_core::JudgeUsage> {
        self.1.take_judge_usage()
    }

    fn reads_tokens(&self) -> bool {
        self.1.reads_tokens()
    }

    fn reads_images(&self) -> bool {
        self.1.reads_images()
    }
}

/// A reward that sees each completion without its reasoning (`reward[i].strip_thinking`): the
/// text after the first `</think>`, its leading whitespace trimmed, as vLLM's reasoning parsers
/// split a Qwen3 completion into reasoning and content; a completion that opened `<think>` and
/// never closed it shows only what came before it (the answer never came).
pub struct ThinkingStripped(pub Box<dyn RewardFn>);

/// `text` without its `<think>…</think>` block ([`ThinkingStripped`]).
pub fn without_thinking(text: &str) -> &str {
    match (text.find("</think>"), text.find("<think>")) {
        (Some(end), _) => text[end + "</think>".len()..].trim_start(),
        (None, Some(start)) => &text[..start],
        (None, None) => text,
    }
}

impl RewardFn for ThinkingStripped {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn score(&mut self, groups: &[Group]) -> Result<Vec<rein_core::GroupScores>, PluginError> {
        let stripped: Vec<Group> = groups
            .iter()
            .map(|g| Group {
                completions: g.completions.iter().map(|c| without_thinking(c).to_string()).collect(),
                // Token texts are of the whole completion: they would not add up to the text.
                tokens: Vec::new(),
                ..g.clone()
            })
            .collect();
        let mut scores = self.0.score(&stripped)?;
        // Step spans count from the start of the whole completion.
        for (group, scores) in groups.iter().zip(&mut scores) {
            for (completion, score) in group.completions.iter().zip(scores) {
                let kept = without_thinking(completion);
                let skipped = completion[..kept.as_ptr() as usize - completion.as_ptr() as usize]
                    .chars()
                    .count();
                for step in &mut score.steps {
                    (step.start, step.end) = (step.start + skipped, step.end + skipped);
                }
            }
        }
        Ok(scores)
    }

    fn failures(&self) -> rein_core::FailureCounts {
        self.0.failures()
    }

    fn take_judge_usage(&mut self) -> Option<rein_core::JudgeUsage> {
        self.0.take_judge_usage()
    }

    fn reads_images(&self) -> bool {
        self.0.reads_images()
    }
}

/// The combined scores of one group.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GroupReward {
    /// Weighted sum per completion (not-applicable scores count as nothing).
    pub total: Vec<f64>,
    /// Per reward (by name) and component (`name/component`), one value per completion (NaN
    /// where a reward did not apply or failed).
    pub components: BTreeMap<String, Vec<f64>>,
    /// The group was dropped (`on_error = "skip"`).
    pub skipped: bool,
    /// Per completion, the step scores of every reward, each scaled by its reward's weight.
    pub steps: Vec<Vec<StepScore>>,
}

/// A plugin failure that `on_error` (or `isolate`) absorbed, for the log.
#[derive(Debug, Clone, PartialEq)]
pub struct RewardFailure {
    /// Index of the group in the batch.
    pub group: usize,
    /// The completion that failed on its own (scored 0), with `isolate`.
    pub completion: Option<usize>,
    /// The error (it names the plugin).
    pub error: PluginError,
}

/// Scores `groups` with every reward. Batches go to each plugin in one call; when a call
/// fails, the groups are retried one by one to find the failing ones, which `on_error` then
/// handles, after, with `isolate`, retrying the failing group's completions one by one (those
/// that fail alone score 0). With `Fail`, the error names the plugin and the first failing
/// group.
pub fn score_groups(
    rewards: &mut [WeightedReward],
    groups: &[Group],
    on_error: OnError,
) -> Result<(Vec<GroupReward>, Vec<RewardFailure>), (usize, PluginError)> {
    let mut out: Vec<GroupReward> = groups
        .iter()
        .map(|g| GroupReward {
            total: vec![0.0; g.completions.len()],
            steps: vec![Vec::new(); g.completions.len()],
            ..GroupReward::default()
        })
        .collect();
    let mut failures = Vec::new();
    for weighted in rewards.iter_mut() {
        let name = weighted.reward.name().to_string();
        let scores: Vec<Option<Vec<rein_core::CompletionScore>>> = match weighted.reward.score(groups) {
            Ok(all) => all.into_iter().map(Some).collect(),
            Err(_) => groups
                .iter()
                .enumerate()
                .map(|(i, g)| match weighted.reward.score(std::slice::from_ref(g)) {
                    Ok(mut one) => Ok(one.pop()),
                    Err(_) if weighted.isolate => Ok(Some(score_alone(weighted.reward.as_mut(), g, i, &mut failures))),
                    Err(error) => match on_error {
                        OnError::Fail => Err((i, error)),
                        OnError::Zero | OnError::Skip => {
                            failures.push(RewardFailure {
                                group: i,
                                completion: None,
                                error,
                            });
                            Ok(None)
                        }
                    },
                })
                .collect::<Result<_, _>>()?,
        };
        for (i, (group_out, scores)) in out.iter_mut().zip(scores).enumerate() {
            let n = groups[i].completions.len();
            let column = |out: &mut GroupReward, key: String| -> usize {
                out.components.entry(key).or_insert_with(|| vec![f64::NAN; n]);
                n
            };
            column(group_out, name.clone());
            match scores {
                None => {
                    if on_error == OnError::Skip {
                        group_out.skipped = true;
                    }
                }
                Some(scores) => {
                    for (c, s) in scores.iter().enumerate() {
                        if let Some(v) = s.score {
                            group_out.total[c] += weighted.weight * v;
                            group_out.components.get_mut(&name).expect("column exists")[c] = v;
                        }
                        let scaled = |step: &StepScore| StepScore {
                            score: weighted.weight * step.score,
                            ..*step
                        };
                        group_out.steps[c].extend(s.steps.iter().map(scaled));
                        for (component, v) in &s.components {
                            let key = format!("{name}/{component}");
                            column(group_out, key.clone());
                            group_out.components.get_mut(&key).expect("column exists")[c] = *v;
                        }
                    }
                }
            }
        }
    }
    Ok((out, failures))
}

/// Scores each completion of `group` as a group of its own; one that fails scores 0 and is
/// recorded in `failures`.
fn score_alone(
    reward: &mut dyn RewardFn,
    group: &Group,
    index: usize,
    failures: &mut Vec<RewardFailure>,
) -> Vec<rein_core::CompletionScore> {
    (group.completions.iter().enumerate())
        .map(|(c, completion)| {
            let alone = Group {
                completions: vec![completion.clone()],
                ..group.clone()
            };
            match reward.score(std::slice::from_ref(&alone)) {
                Ok(mut one) => one.pop().and_then(|mut scores| scores.pop()).unwrap_or_default(),
                Err(error) => {
                    failures.push(RewardFailure {
                        group: index,
                        completion: Some(c),
                        error,
                    });
                    rein_core::CompletionScore {
                        score: Some(0.0),
                        ..rein_core::CompletionScore::default()
                    }
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rein_core::{CompletionScore, PluginErrorKind};

    /// Scores each completion by its length; fails on completions equal to "boom".
    struct Length;

    impl RewardFn for Length {
        fn name(&self) -> &str {
            "length"
        }
        fn score(&mut self, groups: &[Group]) -> Result<Vec<Vec<CompletionScore>>, PluginError> {
            if groups.iter().flat_map(|g| &g.completions).any(|c| c == "boom") {
                return Err(PluginError::new(
                    "length",
                    Some("score"),
                    PluginErrorKind::Guest { message: "boom".into() },
                ));
            }
            Ok(groups
                .iter()
                .map(|g| {
                    g.completions
                        .iter()
                        .map(|c| CompletionScore {
                            score: Some(c.len() as f64),
                            components: vec![("chars".into(), c.len() as f64)],
                            ..CompletionScore::default()
                        })
                        .collect()
                })
                .collect())
        }
    }

    /// 1 for "yes", not applicable otherwise.
    struct Yes;

    impl RewardFn for Yes {
        fn name(&self) -> &str {
            "yes"
        }
        fn score(&mut self, groups: &[Group]) -> Result<Vec<Vec<CompletionScore>>, PluginError> {
            Ok(groups
                .iter()
                .map(|g| {
                    g.completions
                        .iter()
                        .map(|c| CompletionScore {
                            score: (c == "yes").then_some(1.0),
                            ..CompletionScore::default()
                        })
                        .collect()
                })
                .collect())
        }
    }

    fn group(completions: &[&str]) -> Group {
        Group {
            prompt: "p".into(),
            completions: completions.iter().map(|s| s.to_string()).collect(),
            ..Group::default()
        }
    }

    fn rewards() -> Vec<WeightedReward> {
        vec![
            WeightedReward {
                reward: Box::new(Length),
                weight: 0.5,
                isolate: false,
            },
            WeightedReward {
                reward: Box::new(Yes),
                weight: 2.0,
                isolate: false,
            },
        ]
    }

    #[test]
    fn thinking_is_kept_from_the_reward() {
        assert_eq!(
            without_thinking("<think>\n7 + 5 = 12\n</think>\n\n<answer>12</answer>"),
            "<answer>12</answer>"
        );
        assert_eq!(without_thinking("<answer>12</answer>"), "<answer>12</answer>");
        assert_eq!(
            without_thinking("so <think> it goes on"),
            "so ",
            "a block that never closed"
        );
        assert_eq!(
            without_thinking("a</think>b</think>c"),
            "b</think>c",
            "the first block ends it"
        );
    }

    #[test]
    fn weighted_sum_skips_not_applicable_and_logs_components() {
        let (out, failures) = score_groups(&mut rewards(), &[group(&["yes", "no!"])], OnError::Fail).unwrap();
        assert!(failures.is_empty());
        assert_eq!(out[0].total, vec![0.5 * 3.0 + 2.0, 0.5 * 3.0]);
        assert_eq!(out[0].components["length/chars"], vec![3.0, 3.0]);
        assert!(out[0].components["yes"][1].is_nan());
    }

    #[test]
    fn failures_follow_on_error_and_name_the_group() {
        let groups = [group(&["ok"]), group(&["boom"]), group(&["yes"])];
        let (i, error) = score_groups(&mut rewards(), &groups, OnError::Fail).unwrap_err();
        assert_eq!(i, 1);
        assert_eq!(error.plugin, "length");
        let (out, failures) = score_groups(&mut rewards(), &groups, OnError::Zero).unwrap();
        assert_eq!(failures.len(), 1);
        assert_eq!(failures[0].group, 1);
        assert_eq!(out[1].total, vec![0.0]);
        assert!(!out[1].skipped);
        assert_eq!(out[0].total, vec![1.0], "other groups keep their scores");
        let (out, _) = score_groups(&mut rewards(), &groups, OnError::Skip).unwrap();
        assert!(out[1].skipped && !out[0].skipped && !out[2].skipped);
    }

    #[test]
    fn isolated_rewards_score_a_failing_completion_zero_and_the_rest_as_usual() {
        let groups = [group(&["ok", "boom", "yes"]), group(&["fine"])];
        let mut rewards = rewards();
        rewards[0].isolate = true;
        let (out, failures) = score_groups(&mut rewards, &groups, OnError::Fail).unwrap();
        assert_eq!(failures.len(), 1);
        assert_eq!((failures[0].group, failures[0].completion), (0, Some(1)));
        assert_eq!(failures[0].error.plugin, "length");
        assert_eq!(out[0].total, vec![0.5 * 2.0, 0.0, 0.5 * 3.0 + 2.0]);
        assert_eq!(out[0].components["length"], vec![2.0, 0.0, 3.0]);
        assert!(out[0].components["length/chars"][1].is_nan());
        assert_eq!(out[1].total, vec![0.5 * 4.0], "other groups keep their scores");
        assert!(!out[0].skipped);
    }
}
