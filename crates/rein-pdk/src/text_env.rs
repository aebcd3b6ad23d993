//! The text-env world: the [`TextEnv`] trait (one episode at a time; the adapter batches) and
//! its export adapter.

use std::collections::HashMap;
use std::marker::PhantomData;

use crate::__private::reward::rein::plugin::types::{Component, PluginError, PluginMetadata as WitMetadata};
use crate::__private::text_env::exports::rein::plugin::text_env_api as wit;
use crate::config::Config;
use crate::message::{Message, to_wit};
use crate::metadata::Metadata;

/// The dataset row an episode starts from.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EpisodeStart {
    /// Its group in the batch: the episodes of a group start from the same row.
    pub group: u32,
    /// The row's prompt.
    pub prompt: String,
    /// The row's reference answer.
    pub reference: Option<String>,
    /// The row's metadata as JSON text (empty when none).
    pub metadata: String,
    /// The row's images (its prompt's `<image>` markers show where they go).
    pub images: Vec<crate::Image>,
}

impl EpisodeStart {
    /// The metadata parsed as JSON (`null` when empty).
    pub fn metadata_json(&self) -> Result<serde_json::Value, String> {
        crate::reward::parse_row_metadata(&self.metadata, "row")
    }
}

/// How an episode opens: its first messages and the tools (by name) the model may call.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Opening {
    /// The first messages.
    pub messages: Vec<Message>,
    /// Tool names from the recipe's tools.
    pub tools: Vec<String>,
    /// The images the messages show: one per `<image>` marker in their text, in order.
    pub images: Vec<crate::Image>,
}

/// The environment's answer to one turn of the model.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Reply {
    /// Messages appended after the model's.
    pub messages: Vec<Message>,
    /// The images the messages show: one per `<image>` marker in their text, in order.
    pub images: Vec<crate::Image>,
    /// The reward given on this turn (usually when done).
    pub reward: Option<f64>,
    /// Named parts of the reward.
    pub components: Vec<(String, f64)>,
    /// The episode is over.
    pub done: bool,
    /// The environment's state after the turn (GiGPO groups turns that reach the same key).
    pub state_key: Option<String>,
}

impl Reply {
    /// The episode goes on with `message` from the user.
    pub fn user(content: impl Into<String>) -> Self {
        Self {
            messages: vec![Message::user(content)],
            ..Self::default()
        }
    }

    /// The episode ends with `reward`.
    pub fn done(reward: f64) -> Self {
        Self {
            reward: Some(reward),
            done: true,
            ..Self::default()
        }
    }

    /// Adds a named component of the reward.
    pub fn with(mut self, name: &str, value: f64) -> Self {
        self.components.push((name.to_string(), value));
        self
    }

    /// Sets the state key.
    pub fn state(mut self, key: impl Into<String>) -> Self {
        self.state_key = Some(key.into());
        self
    }
}

/// A multi-turn text environment, written one episode at a time: the PDK keeps each episode's
/// state and batches the host's calls.
pub trait TextEnv: Sized + 'static {
    /// One episode's state.
    type Episode: 'static;

    /// Name, version, description and accepted config keys.
    const METADATA: Metadata;

    /// Builds the environment from its config.
    fn new(config: &Config) -> Result<Self, String>;

    /// Opens an episode from a dataset row.
    fn reset(&mut self, start: &EpisodeStart) -> Result<(Self::Episode, Opening), String>;

    /// Answers the model's turn.
    fn step(&mut self, episode: &mut Self::Episode, content: &str) -> Result<Reply, String>;
}

/// The environment and its live episodes.
struct State<E: TextEnv> {
    env: E,
    episodes: HashMap<u64, E::Episode>,
}

fn error(message: String) -> PluginError {
    PluginError { message }
}

/// Runs `f` on the state `init` built; `call` names the export in the error when there is none.
fn with_state<E: TextEnv, R>(
    call: &str,
    f: impl FnOnce(&mut State<E>) -> Result<R, PluginError>,
) -> Result<R, PluginError> {
    crate::instance::with(call, f).map_err(error)?
}

/// Adapts a [`TextEnv`] to the generated `text-env-api` exports.
#[doc(hidden)]
pub struct TextEnvExport<E>(PhantomData<E>);

impl<E: TextEnv> wit::Guest for TextEnvExport<E> {
    fn metadata() -> WitMetadata {
        E::METADATA.to_wit()
    }

    fn init(config: String) -> Result<(), PluginError> {
        let config = Config::parse(&config, &E::METADATA).map_err(error)?;
        let env = E::new(&config).map_err(error)?;
        let state = State::<E> {
            env,
            episodes: HashMap::new(),
        };
        crate::instance::set(state);
        Ok(())
    }

    fn reset(starts: Vec<wit::EpisodeStart>) -> Result<Vec<wit::Opening>, PluginError> {
        with_state::<E, _>("reset", |state| {
            let mut openings = Vec::with_capacity(starts.len());
            for start in starts {
                let id = start.id;
                let start = EpisodeStart {
                    group: start.group,
                    prompt: start.prompt,
                    reference: start.reference,
                    metadata: start.metadata,
                    images: start.images.into_iter().map(crate::Image::from).collect(),
                };
                let (episode, opening) = state
                    .env
                    .reset(&start)
                    .map_err(|e| error(format!("episode {id}: {e}")))?;
                state.episodes.insert(id, episode);
                openings.push(wit::Opening {
                    messages: to_wit(opening.messages),
                    tools: opening.tools,
                    images: opening.images.into_iter().map(Into::into).collect(),
                });
            }
            Ok(openings)
        })
    }

    fn step(turns: Vec<wit::Turn>) -> Result<Vec<wit::Reply>, PluginError> {
        with_state::<E, _>("step", |state| {
            let mut replies = Vec::with_capacity(turns.len());
            for turn in turns {
                let episode = (state.episodes.get_mut(&turn.id))
                    .ok_or_else(|| error(format!("episode {} is not open", turn.id)))?;
                let reply =
                    (state.env.step(episode, &turn.content)).map_err(|e| error(format!("episode {}: {e}", turn.id)))?;
                replies.push(wit::Reply {
                    messages: to_wit(reply.messages),
                    images: reply.images.into_iter().map(Into::into).collect(),
                    reward: reply.reward,
                    components: (reply.components.into_iter())
                        .map(|(name, value)| Component { name, value })
                        .collect(),
                    done: reply.done,
                    state_key: reply.state_key,
                });
            }
            Ok(replies)
        })
    }

    fn close(ids: Vec<u64>) {
        let _ = with_state::<E, _>("close", |state| {
            for id in ids {
                state.episodes.remove(&id);
            }
            Ok(())
        });
    }
}
