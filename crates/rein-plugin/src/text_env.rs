//! Text-environment plugins as [`TextEnv`]s.

use rein_core::{
    EpisodeStart, FailureCounts, Message, Opening, OutputError, PluginError, PluginErrorKind, Reply, TextEnv, Turn,
    validate_openings, validate_replies,
};

use crate::bindings::text_env::{self as wit, TextEnv as Bindings};
use crate::plugin::{Plugin, PluginKind};
use crate::sandbox::Instance;

/// A text environment with its config, owning one sandboxed instance that holds every live
/// episode.
///
/// A trap discards the instance and with it every episode's state: the call fails, and the
/// episodes it held can only be abandoned (their next `step` is an error naming them). The next
/// `reset` starts a fresh instance.
pub struct TextEnvPlugin {
    plugin: Plugin,
    config: String,
    instance: Option<Instance<Bindings>>,
    /// Episodes opened in the current instance and not closed.
    live: std::collections::BTreeSet<u64>,
    failures: FailureCounts,
}

impl std::fmt::Debug for TextEnvPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextEnvPlugin")
            .field("plugin", &self.plugin.name())
            .field("live", &self.live.len())
            .finish()
    }
}

impl Plugin {
    /// Instantiates this text-environment plugin with its config (a JSON object as text).
    pub fn text_env(&self, config: &str) -> Result<TextEnvPlugin, PluginError> {
        if self.kind() != PluginKind::TextEnv {
            return Err(self.wrong_kind(PluginKind::TextEnv));
        }
        let mut env = TextEnvPlugin {
            plugin: self.clone(),
            config: config.to_string(),
            instance: None,
            live: Default::default(),
            failures: FailureCounts::default(),
        };
        env.live()?;
        Ok(env)
    }
}

fn messages(list: Vec<wit::Message>) -> Vec<Message> {
    list.into_iter()
        .map(|m| Message {
            role: m.role,
            content: m.content,
        })
        .collect()
}

impl TextEnvPlugin {
    fn live(&mut self) -> Result<&mut Instance<Bindings>, PluginError> {
        if self.instance.is_none() {
            let mut instance = self.plugin.instantiate_text_env()?;
            instance.call(self.plugin.name(), "init", self.plugin.limits(), |store, b| {
                let result = b.rein_plugin_text_env_api().call_init(store, &self.config)?;
                Ok(result.map_err(|e| e.message))
            })?;
            self.instance = Some(instance);
            self.live.clear();
        }
        Ok(self.instance.as_mut().expect("set above"))
    }

    /// Drops the instance after a trap (its episodes are gone with it).
    fn drop_if_trapped<T>(&mut self, result: Result<T, PluginError>) -> Result<T, PluginError> {
        if result.as_ref().is_err_and(PluginError::is_trap) {
            self.instance = None;
            self.live.clear();
        }
        result
    }

    fn invalid(&self, call: &'static str, reason: OutputError) -> PluginError {
        PluginError::new(self.plugin.name(), Some(call), reason.into())
    }

    fn try_reset(&mut self, starts: &[EpisodeStart]) -> Result<Vec<Opening>, PluginError> {
        if let Some(start) = starts.iter().find(|s| self.live.contains(&s.id)) {
            let reason = format!("episode {} is already open", start.id);
            return Err(PluginError::new(
                self.plugin.name(),
                Some("reset"),
                PluginErrorKind::Host { reason },
            ));
        }
        let wit_starts: Vec<wit::EpisodeStart> = starts
            .iter()
            .map(|s| wit::EpisodeStart {
                id: s.id,
                group: s.group,
                prompt: s.prompt.clone(),
                reference: s.reference.clone(),
                metadata: s.metadata.clone(),
            })
            .collect();
        let plugin = self.plugin.clone();
        let instance = self.live()?;
        let raw = instance.call(plugin.name(), "reset", plugin.limits(), |store, b| {
            let result = b.rein_plugin_text_env_api().call_reset(store, &wit_starts)?;
            Ok(result.map_err(|e| e.message))
        });
        let raw = self.drop_if_trapped(raw)?;
        let openings: Vec<Opening> = raw
            .into_iter()
            .map(|o| Opening {
                messages: messages(o.messages),
                tools: o.tools,
            })
            .collect();
        validate_openings(starts, &openings).map_err(|e| self.invalid("reset", e))?;
        self.live.extend(starts.iter().map(|s| s.id));
        Ok(openings)
    }

    fn try_step(&mut self, turns: &[Turn]) -> Result<Vec<Reply>, PluginError> {
        let lost: Vec<String> = (turns.iter())
            .filter(|t| !self.live.contains(&t.id))
            .map(|t| t.id.to_string())
            .collect();
        if !lost.is_empty() {
            let reason = format!(
                "episodes {} are not open (never opened, closed, or lost with an instance that trapped)",
                lost.join(", ")
            );
            return Err(PluginError::new(
                self.plugin.name(),
                Some("step"),
                PluginErrorKind::Host { reason },
            ));
        }
        let wit_turns: Vec<wit::Turn> = turns
            .iter()
            .map(|t| wit::Turn {
                id: t.id,
                content: t.content.clone(),
            })
            .collect();
        let plugin = self.plugin.clone();
        let instance = self.live()?;
        let raw = instance.call(plugin.name(), "step", plugin.limits(), |store, b| {
            let result = b.rein_plugin_text_env_api().call_step(store, &wit_turns)?;
            Ok(result.map_err(|e| e.message))
        });
        let raw = self.drop_if_trapped(raw)?;
        let size: usize = (raw.iter())
            .map(|r| r.messages.iter().map(|m| m.content.len() + m.role.len()).sum::<usize>() + 64)
            .sum();
        let limit = plugin.limits().max_output_bytes();
        if size > limit {
            let what = "replies".into();
            return Err(self.invalid(
                "step",
                OutputError::TooLarge {
                    what,
                    bytes: size,
                    limit,
                },
            ));
        }
        let replies: Vec<Reply> = raw
            .into_iter()
            .map(|r| Reply {
                messages: messages(r.messages),
                reward: r.reward,
                components: r.components.into_iter().map(|c| (c.name, c.value)).collect(),
                done: r.done,
                state_key: r.state_key,
            })
            .collect();
        validate_replies(turns, &replies).map_err(|e| self.invalid("step", e))?;
        Ok(replies)
    }
}

impl TextEnv for TextEnvPlugin {
    fn name(&self) -> &str {
        self.plugin.name()
    }

    fn reset(&mut self, starts: &[EpisodeStart]) -> Result<Vec<Opening>, PluginError> {
        let result = self.try_reset(starts);
        self.failures.count(result)
    }

    fn step(&mut self, turns: &[Turn]) -> Result<Vec<Reply>, PluginError> {
        let result = self.try_step(turns);
        self.failures.count(result)
    }

    fn close(&mut self, ids: &[u64]) {
        let ids: Vec<u64> = ids.iter().copied().filter(|id| self.live.remove(id)).collect();
        let plugin = self.plugin.clone();
        let Some(instance) = self.instance.as_mut().filter(|_| !ids.is_empty()) else {
            return;
        };
        let result = instance.call(plugin.name(), "close", plugin.limits(), |store, b| {
            b.rein_plugin_text_env_api().call_close(store, &ids).map(Ok)
        });
        // A failure to forget is the plugin's problem only: count it and start afresh next time.
        let result = self.drop_if_trapped(result);
        let _ = self.failures.count(result);
    }

    fn failures(&self) -> FailureCounts {
        self.failures
    }
}
