//! Text-environment plugins as [`TextEnv`]s.

use rein_core::{
    EpisodeStart, FailureCounts, Image, Message, Opening, OutputError, PluginError, PluginErrorKind, Reply, TextEnv,
    Turn, validate_openings, validate_replies,
};

use crate::bindings::text_env as wit;
use crate::bindings::text_env::exports::rein::plugin::text_env_api as api;
use crate::bindings::text_env_v0_4 as wit_v0_4;
use crate::bindings::text_env_v0_4::exports::rein::plugin::text_env_api as api_v0_4;
use crate::plugin::{Plugin, PluginKind, TextEnvInstance, Versioned};

/// A text environment with its config, owning one sandboxed instance that holds every live
/// episode.
///
/// A trap discards the instance and with it every episode's state: the call fails, and the
/// episodes it held can only be abandoned (their next `step` is an error naming them). The next
/// `reset` starts a fresh instance.
pub struct TextEnvPlugin {
    plugin: Plugin,
    config: String,
    instance: Option<TextEnvInstance>,
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

/// The images a plugin returned, each checked against its media type; `what` names where they
/// were (`episode 3's opening`).
fn images(list: Vec<wit::Image>, what: &dyn Fn() -> String) -> Result<Vec<Image>, OutputError> {
    (list.into_iter().enumerate())
        .map(|(i, image)| {
            Image::with_media_type(&image.media_type, image.data).map_err(|reason| OutputError::BadImage {
                what: format!("image {i} of {}", what()),
                reason,
            })
        })
        .collect()
}

/// An opening of 0.4.0 as the current interface's: no images.
fn opening_v0_4(o: api_v0_4::Opening) -> api::Opening {
    api::Opening {
        messages: o.messages,
        tools: o.tools,
        images: Vec::new(),
    }
}

/// A reply of 0.4.0 as the current interface's: no images.
fn reply_v0_4(r: api_v0_4::Reply) -> api::Reply {
    api::Reply {
        messages: r.messages,
        images: Vec::new(),
        reward: r.reward,
        components: r.components,
        done: r.done,
        state_key: r.state_key,
    }
}

impl TextEnvPlugin {
    fn live(&mut self) -> Result<&mut TextEnvInstance, PluginError> {
        if self.instance.is_none() {
            let mut instance = self.plugin.instantiate_text_env()?;
            let (name, limits, config) = (self.plugin.name(), self.plugin.limits(), &self.config);
            match &mut instance {
                Versioned::Current(instance) => instance.call(name, "init", limits, |store, b| {
                    let result = b.rein_plugin_text_env_api().call_init(store, config)?;
                    Ok(result.map_err(|e| e.message))
                })?,
                Versioned::V0_4(instance) => instance.call(name, "init", limits, |store, b| {
                    let result = b.rein_plugin_text_env_api().call_init(store, config)?;
                    Ok(result.map_err(|e| e.message))
                })?,
            }
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

    /// Refuses `bytes` of output (`what`) over the plugin's `max_output_mib`.
    fn check_size(&self, call: &'static str, what: &str, bytes: usize) -> Result<(), PluginError> {
        let limit = self.plugin.limits().max_output_bytes();
        match bytes > limit {
            true => Err(self.invalid(
                call,
                OutputError::TooLarge {
                    what: what.into(),
                    bytes,
                    limit,
                },
            )),
            false => Ok(()),
        }
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
        let starts_v0_4: Vec<wit_v0_4::EpisodeStart> = starts
            .iter()
            .map(|s| wit_v0_4::EpisodeStart {
                id: s.id,
                group: s.group,
                prompt: s.prompt.clone(),
                reference: s.reference.clone(),
                metadata: s.metadata.clone(),
            })
            .collect();
        let plugin = self.plugin.clone();
        let (name, limits) = (plugin.name(), plugin.limits());
        let raw = match self.live()? {
            Versioned::Current(instance) => {
                let wit_starts: Vec<wit::EpisodeStart> = (starts.iter().zip(starts_v0_4))
                    .map(|(s, v0_4)| wit::EpisodeStart {
                        id: v0_4.id,
                        group: v0_4.group,
                        prompt: v0_4.prompt,
                        reference: v0_4.reference,
                        metadata: v0_4.metadata,
                        images: (s.images.iter())
                            .map(|image| wit::Image {
                                media_type: image.media_type().to_string(),
                                data: image.bytes().to_vec(),
                            })
                            .collect(),
                    })
                    .collect();
                instance.call(name, "reset", limits, |store, b| {
                    let result = b.rein_plugin_text_env_api().call_reset(store, &wit_starts)?;
                    Ok(result.map_err(|e| e.message))
                })
            }
            Versioned::V0_4(instance) => instance.call(name, "reset", limits, |store, b| {
                let result = b.rein_plugin_text_env_api().call_reset(store, &starts_v0_4)?;
                Ok(result
                    .map(|openings| openings.into_iter().map(opening_v0_4).collect())
                    .map_err(|e| e.message))
            }),
        };
        let raw = self.drop_if_trapped(raw)?;
        let size: usize = (raw.iter())
            .map(|o| {
                o.images.iter().map(|i| i.data.len()).sum::<usize>()
                    + o.messages.iter().map(|m| m.content.len()).sum::<usize>()
            })
            .sum();
        self.check_size("reset", "openings (text and images)", size)?;
        let openings: Vec<Opening> = (raw.into_iter().zip(starts))
            .map(|(o, start)| {
                let images = images(o.images, &|| format!("episode {}'s opening", start.id));
                Ok(Opening {
                    messages: messages(o.messages),
                    tools: o.tools,
                    images: images.map_err(|e| self.invalid("reset", e))?,
                })
            })
            .collect::<Result<_, PluginError>>()?;
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
        let plugin = self.plugin.clone();
        let (name, limits) = (plugin.name(), plugin.limits());
        let raw = match self.live()? {
            Versioned::Current(instance) => {
                let wit_turns: Vec<wit::Turn> = (turns.iter())
                    .map(|t| wit::Turn {
                        id: t.id,
                        content: t.content.clone(),
                    })
                    .collect();
                instance.call(name, "step", limits, |store, b| {
                    let result = b.rein_plugin_text_env_api().call_step(store, &wit_turns)?;
                    Ok(result.map_err(|e| e.message))
                })
            }
            Versioned::V0_4(instance) => {
                let wit_turns: Vec<wit_v0_4::Turn> = (turns.iter())
                    .map(|t| wit_v0_4::Turn {
                        id: t.id,
                        content: t.content.clone(),
                    })
                    .collect();
                instance.call(name, "step", limits, |store, b| {
                    let result = b.rein_plugin_text_env_api().call_step(store, &wit_turns)?;
                    Ok(result
                        .map(|replies| replies.into_iter().map(reply_v0_4).collect())
                        .map_err(|e| e.message))
                })
            }
        };
        let raw = self.drop_if_trapped(raw)?;
        let size: usize = (raw.iter())
            .map(|r| {
                let text: usize = r.messages.iter().map(|m| m.content.len() + m.role.len()).sum();
                text + r.images.iter().map(|i| i.data.len()).sum::<usize>() + 64
            })
            .sum();
        self.check_size("step", "replies (text and images)", size)?;
        let replies: Vec<Reply> = (raw.into_iter().zip(turns))
            .map(|(r, turn)| {
                let images = images(r.images, &|| format!("the reply to episode {}", turn.id));
                Ok(Reply {
                    messages: messages(r.messages),
                    images: images.map_err(|e| self.invalid("step", e))?,
                    reward: r.reward,
                    components: r.components.into_iter().map(|c| (c.name, c.value)).collect(),
                    done: r.done,
                    state_key: r.state_key,
                })
            })
            .collect::<Result<_, PluginError>>()?;
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
        let (name, limits) = (plugin.name(), plugin.limits());
        let result = match instance {
            Versioned::Current(instance) => instance.call(name, "close", limits, |store, b| {
                b.rein_plugin_text_env_api().call_close(store, &ids).map(Ok)
            }),
            Versioned::V0_4(instance) => instance.call(name, "close", limits, |store, b| {
                b.rein_plugin_text_env_api().call_close(store, &ids).map(Ok)
            }),
        };
        // A failure to forget is the plugin's problem only: count it and start afresh next time.
        let result = self.drop_if_trapped(result);
        let _ = self.failures.count(result);
    }

    fn failures(&self) -> FailureCounts {
        self.failures
    }
}
