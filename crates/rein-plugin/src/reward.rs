//! Reward plugins as [`RewardFn`]s.

use rein_core::{
    CompletionScore, FailureCounts, Group, GroupScores, OutputError, PluginError, RewardFn, validate_group_scores,
};

use crate::bindings::reward::{self as wit, Reward};
use crate::plugin::{Plugin, PluginKind};
use crate::sandbox::Instance;

/// A reward plugin with its config, owning one sandboxed instance.
///
/// The instance is created (and `init` called with the config) on construction, and again
/// after a trap discarded it, so one failure never poisons later batches.
pub struct RewardPlugin {
    plugin: Plugin,
    config: String,
    instance: Option<Instance<Reward>>,
    failures: FailureCounts,
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
    /// The plugin's `init` may reject the config with its own error.
    pub fn reward(&self, config: &str) -> Result<RewardPlugin, PluginError> {
        if self.kind() != PluginKind::Reward {
            return Err(self.wrong_kind(PluginKind::Reward));
        }
        let mut reward = RewardPlugin {
            plugin: self.clone(),
            config: config.to_string(),
            instance: None,
            failures: FailureCounts::default(),
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
        self.instance.as_ref().map(Instance::stdout).unwrap_or_default()
    }

    fn live(&mut self) -> Result<&mut Instance<Reward>, PluginError> {
        if self.instance.is_none() {
            let mut instance = self.plugin.instantiate_reward()?;
            let limits = self.plugin.limits();
            instance.call(self.plugin.name(), "init", limits, |store, b| {
                let result = b.rein_plugin_reward_api().call_init(store, &self.config)?;
                Ok(result.map_err(|e| e.message))
            })?;
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
}

impl RewardPlugin {
    fn try_score(&mut self, groups: &[Group]) -> Result<Vec<GroupScores>, PluginError> {
        let wit_groups: Vec<wit::Group> = groups
            .iter()
            .map(|g| wit::Group {
                prompt: g.prompt.clone(),
                completions: g.completions.clone(),
                reference: g.reference.clone(),
                metadata: g.metadata.clone(),
            })
            .collect();
        let plugin = self.plugin.clone();
        let limits = plugin.limits();
        let instance = self.live()?;
        let result = instance.call(plugin.name(), "score", limits, |store, b| {
            let result = b.rein_plugin_reward_api().call_score(store, &wit_groups)?;
            Ok(result.map_err(|e| e.message))
        });
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
            .map(|s| 16 + s.components.iter().map(|c| 16 + c.name.len()).sum::<usize>())
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
                    })
                    .collect()
            })
            .collect();
        validate_group_scores(groups, &scores).map_err(invalid)?;
        Ok(scores)
    }
}
