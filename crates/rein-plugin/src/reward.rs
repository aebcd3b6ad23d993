//! Reward plugins as [`RewardFn`]s.

use rein_core::{
    CompletionScore, FailureCounts, Group, GroupScores, JudgeUsage, OutputError, PluginError, PluginErrorKind,
    RewardFn, StepScore, validate_group_scores,
};

use crate::bindings::reward as wit;
use crate::bindings::reward_v0_3 as wit_v0_3;
use crate::bindings::reward_v0_4 as wit_v0_4;
use crate::judge::{JUDGE_IMPORT, JudgeGrant};
use crate::plugin::{Plugin, PluginKind, RewardInstance};

/// A reward plugin with its config, owning one sandboxed instance.
///
/// The instance is created (and `init` called with the config) on construction, and again
/// after a trap discarded it, so one failure never poisons later batches. A plugin built for
/// the `reward-with-judge` world runs with its [`JudgeGrant`] in every instance.
pub struct RewardPlugin {
    plugin: Plugin,
    config: String,
    judge: Option<JudgeGrant>,
    instance: Option<RewardInstance>,
    failures: FailureCounts,
    judge_usage: JudgeUsage,
}

impl std::fmt::Debug for RewardPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RewardPlugin")
            .field("plugin", &self.plugin.name())
            .field("config", &self.config)
            .finish()
    }
}

impl Plugin {
    /// Instantiates this reward plugin with its config (a JSON object as text; `{}` for none).
    /// The plugin's `init` may reject the config with its own error. A plugin that imports the
    /// judge is refused here, naming the import: it needs [`Plugin::reward_with_judge`].
    pub fn reward(&self, config: &str) -> Result<RewardPlugin, PluginError> {
        if self.imports_judge() {
            let kind = PluginErrorKind::NotGranted {
                import: JUDGE_IMPORT.into(),
                how: "give the reward a judge in the recipe (`judge = { model = \"…\" }`)",
            };
            return Err(PluginError::new(self.name(), None, kind));
        }
        self.new_reward(config, None)
    }

    /// Instantiates this reward plugin with its config and the judge it may ask. A plugin
    /// that does not import the judge is refused: the grant would be silently unused.
    pub fn reward_with_judge(&self, config: &str, judge: JudgeGrant) -> Result<RewardPlugin, PluginError> {
        if self.kind() == PluginKind::Reward && !self.imports_judge() {
            let kind = PluginErrorKind::UnusedGrant {
                import: JUDGE_IMPORT.into(),
                how: "build it for the `reward-with-judge` world (rein_pdk::judge::ask)",
            };
            return Err(PluginError::new(self.name(), None, kind));
        }
        self.new_reward(config, Some(judge))
    }

    fn new_reward(&self, config: &str, judge: Option<JudgeGrant>) -> Result<RewardPlugin, PluginError> {
        if self.kind() != PluginKind::Reward {
            return Err(self.wrong_kind(PluginKind::Reward));
        }
        let mut reward = RewardPlugin {
            plugin: self.clone(),
            config: config.to_string(),
            judge,
            instance: None,
            failures: FailureCounts::default(),
            judge_usage: JudgeUsage::default(),
        };
        reward.live()?;
        Ok(reward)
    }
}

impl RewardPlugin {
    /// The plugin this reward runs.
    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    /// The tail of what the plugin wrote to stdout (for `print!`-debugging plugins).
    pub fn stdout(&self) -> String {
        self.instance.as_ref().map(RewardInstance::stdout).unwrap_or_default()
    }

    fn live(&mut self) -> Result<&mut RewardInstance, PluginError> {
        if self.instance.is_none() {
            let mut instance = self.plugin.instantiate_reward()?;
            instance.store().data_mut().judge.grant(self.judge.clone());
            let (name, limits, config) = (self.plugin.name(), self.plugin.limits(), &self.config);
            match &mut instance {
                RewardInstance::Current(instance) => instance.call(name, "init", limits, |store, b| {
                    let result = b.rein_plugin_reward_api().call_init(store, config)?;
                    Ok(result.map_err(|e| e.message))
                })?,
                RewardInstance::V0_4(instance) => instance.call(name, "init", limits, |store, b| {
                    let result = b.rein_plugin_reward_api().call_init(store, config)?;
                    Ok(result.map_err(|e| e.message))
                })?,
                RewardInstance::V0_3(instance) => instance.call(name, "init", limits, |store, b| {
                    let result = b.rein_plugin_reward_api().call_init(store, config)?;
                    Ok(result.map_err(|e| e.message))
                })?,
            }
            self.instance = Some(instance);
        }
        Ok(self.instance.as_mut().expect("set above"))
    }
}

impl RewardFn for RewardPlugin {
    fn name(&self) -> &str {
        self.plugin.name()
    }

    fn score(&mut self, groups: &[Group]) -> Result<Vec<GroupScores>, PluginError> {
        let result = self.try_score(groups);
        self.failures.count(result)
    }

    fn failures(&self) -> FailureCounts {
        self.failures
    }

    fn take_judge_usage(&mut self) -> Option<JudgeUsage> {
        self.judge.as_ref()?;
        Some(std::mem::take(&mut self.judge_usage))
    }

    fn reads_tokens(&self) -> bool {
        self.plugin.info().reads_tokens
    }

    fn reads_images(&self) -> bool {
        self.plugin.info().reads_images
    }
}

impl RewardPlugin {
    fn try_score(&mut self, groups: &[Group]) -> Result<Vec<GroupScores>, PluginError> {
        let plugin = self.plugin.clone();
        let limits = plugin.limits();
        let instance = self.live()?;
        instance
            .store()
            .data_mut()
            .judge
            .begin_call(groups.len(), limits.timeout());
        let result = match instance {
            RewardInstance::Current(instance) => {
                let wit_groups: Vec<wit::Group> = groups.iter().map(to_wit).collect();
                instance.call(plugin.name(), "score", limits, |store, b| {
                    let result = b.rein_plugin_reward_api().call_score(store, &wit_groups)?;
                    Ok(result.map_err(|e| e.message))
                })
            }
            RewardInstance::V0_4(instance) => {
                let wit_groups: Vec<wit_v0_4::Group> = groups.iter().map(to_wit_v0_4).collect();
                instance
                    .call(plugin.name(), "score", limits, |store, b| {
                        let result = b.rein_plugin_reward_api().call_score(store, &wit_groups)?;
                        Ok(result.map_err(|e| e.message))
                    })
                    .map(from_wit_v0_4)
            }
            RewardInstance::V0_3(instance) => {
                let wit_groups: Vec<wit_v0_3::Group> = groups.iter().map(to_wit_v0_3).collect();
                instance
                    .call(plugin.name(), "score", limits, |store, b| {
                        let result = b.rein_plugin_reward_api().call_score(store, &wit_groups)?;
                        Ok(result.map_err(|e| e.message))
                    })
                    .map(from_wit_v0_3)
            }
        };
        let usage = instance.store().data_mut().judge.take_usage();
        self.judge_usage = self.judge_usage.plus(usage);
        let raw = match result {
            Ok(raw) => raw,
            Err(e) => {
                if e.is_trap() {
                    self.instance = None;
                }
                return Err(e);
            }
        };
        let invalid = |reason: OutputError| PluginError::new(plugin.name(), Some("score"), reason.into());
        let size: usize = raw
            .iter()
            .flatten()
            .map(|s| 16 + 24 * s.steps.len() + s.components.iter().map(|c| 16 + c.name.len()).sum::<usize>())
            .sum();
        if size > limits.max_output_bytes() {
            return Err(invalid(OutputError::TooLarge {
                what: "scores".into(),
                bytes: size,
                limit: limits.max_output_bytes(),
            }));
        }
        let scores: Vec<GroupScores> = raw
            .into_iter()
            .map(|group| {
                group
                    .into_iter()
                    .map(|s: wit::CompletionScore| CompletionScore {
                        score: s.score,
                        components: s.components.into_iter().map(|c| (c.name, c.value)).collect(),
                        steps: (s.steps.into_iter())
                            .map(|step| StepScore {
                                start: step.start as usize,
                                end: step.end as usize,
                                score: step.score,
                            })
                            .collect(),
                    })
                    .collect()
            })
            .collect();
        validate_group_scores(groups, &scores).map_err(invalid)?;
        Ok(scores)
    }
}

/// A group as the current interface sends it (the tokens and images only to a plugin that reads
/// them: the caller fills them only then).
fn to_wit(group: &Group) -> wit::Group {
    let images = (group.images.iter())
        .map(|image| wit::Image {
            media_type: image.media_type().to_string(),
            data: image.bytes().to_vec(),
        })
        .collect();
    wit::Group {
        prompt: group.prompt.clone(),
        completions: group.completions.clone(),
        reference: group.reference.clone(),
        metadata: group.metadata.clone(),
        tokens: tokens(group, |t| wit::Token {
            text: t.text.clone(),
            logprob: t.logprob,
        }),
        images,
    }
}

/// A group as 0.4.0 sends it: no images.
fn to_wit_v0_4(group: &Group) -> wit_v0_4::Group {
    wit_v0_4::Group {
        prompt: group.prompt.clone(),
        completions: group.completions.clone(),
        reference: group.reference.clone(),
        metadata: group.metadata.clone(),
        tokens: tokens(group, |t| wit_v0_4::Token {
            text: t.text.clone(),
            logprob: t.logprob,
        }),
    }
}

/// Each completion's tokens as one interface version's `token` record.
fn tokens<T>(group: &Group, token: impl Fn(&rein_core::Token) -> T) -> Vec<Vec<T>> {
    (group.tokens.iter())
        .map(|tokens| tokens.iter().map(&token).collect())
        .collect()
}

/// 0.4.0's scores as the current interface's (the same fields).
fn from_wit_v0_4(scores: Vec<Vec<wit_v0_4::CompletionScore>>) -> Vec<Vec<wit::CompletionScore>> {
    let score = |s: wit_v0_4::CompletionScore| wit::CompletionScore {
        score: s.score,
        components: s.components,
        steps: (s.steps.into_iter())
            .map(|step| wit::StepScore {
                start: step.start,
                end: step.end,
                score: step.score,
            })
            .collect(),
    };
    (scores.into_iter())
        .map(|group| group.into_iter().map(score).collect())
        .collect()
}

/// A group as 0.3.0 sends it.
fn to_wit_v0_3(group: &Group) -> wit_v0_3::Group {
    wit_v0_3::Group {
        prompt: group.prompt.clone(),
        completions: group.completions.clone(),
        reference: group.reference.clone(),
        metadata: group.metadata.clone(),
    }
}

/// 0.3.0's scores as the current interface's: no steps.
fn from_wit_v0_3(
    scores: Vec<Vec<wit_v0_3::exports::rein::plugin::reward_api::CompletionScore>>,
) -> Vec<Vec<wit::CompletionScore>> {
    let score = |s: wit_v0_3::exports::rein::plugin::reward_api::CompletionScore| wit::CompletionScore {
        score: s.score,
        components: s.components,
        steps: Vec::new(),
    };
    (scores.into_iter())
        .map(|group| group.into_iter().map(score).collect())
        .collect()
}
