//! Multi-turn text environments: an episode opens from a dataset row, the model answers, the
//! environment replies, until it says the episode is done. Calls are batched over episodes;
//! the episodes of a group start from the same row.

use serde::{Deserialize, Serialize};

use crate::Image;
use crate::error::OutputError;

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Its text.
    pub content: String,
}

impl Message {
    /// A message with `role` and `content`.
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        Self {
            role: role.to_string(),
            content: content.into(),
        }
    }
}

/// A new episode.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct EpisodeStart {
    /// The host's id for it, unique among live episodes.
    pub id: u64,
    /// Its group in the batch (the episodes of a group share their row).
    pub group: u32,
    /// The row's prompt.
    pub prompt: String,
    /// The row's reference answer.
    pub reference: Option<String>,
    /// The row's metadata as JSON text (empty when none).
    pub metadata: String,
    /// The row's images (its prompt's `<image>` markers show where they go).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<Image>,
}

/// How an episode opens.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Opening {
    /// The first messages.
    pub messages: Vec<Message>,
    /// The tools (by name) the model may call.
    pub tools: Vec<String>,
    /// The images the messages show: one per `<image>` marker in their text, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<Image>,
}

/// The model's turn in one episode.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Turn {
    /// The episode.
    pub id: u64,
    /// What the model wrote.
    pub content: String,
}

/// The environment's answer to one turn.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Reply {
    /// Messages appended after the model's.
    pub messages: Vec<Message>,
    /// The images the messages show: one per `<image>` marker in their text, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<Image>,
    /// The reward given on this turn, if any.
    pub reward: Option<f64>,
    /// Named parts of the reward.
    pub components: Vec<(String, f64)>,
    /// The episode is over.
    pub done: bool,
    /// The environment's state after the turn, for GiGPO's step-level groups.
    pub state_key: Option<String>,
}

/// A multi-turn text environment.
pub trait TextEnv: Send {
    /// Its name, for logs, metrics and errors.
    fn name(&self) -> &str;

    /// Opens one episode per start, in order.
    fn reset(&mut self, starts: &[EpisodeStart]) -> Result<Vec<Opening>, crate::PluginError>;

    /// Answers one turn per episode, in order.
    fn step(&mut self, turns: &[Turn]) -> Result<Vec<Reply>, crate::PluginError>;

    /// Forgets episodes.
    fn close(&mut self, ids: &[u64]);

    /// How many calls have failed so far, by kind.
    fn failures(&self) -> crate::FailureCounts {
        crate::FailureCounts::default()
    }
}

/// The roles an environment may add to a conversation: the model's own turns are the
/// `assistant`'s, never the environment's.
pub const ENV_ROLES: [&str; 3] = ["system", "user", "tool"];

/// Checks messages an environment wrote: environment roles only, and, when they show images,
/// one `<image>` marker per image (messages without images may hold the text `<image>`, as
/// environments built before images could).
fn check_messages(messages: &[Message], images: &[Image], what: &dyn Fn() -> String) -> Result<(), OutputError> {
    let markers = crate::count_markers(messages.iter().map(|m| m.content.as_str()));
    if !images.is_empty() && markers != images.len() {
        return Err(OutputError::WrongLength {
            what: format!("images for the `<image>` markers of {}", what()),
            expected: markers,
            got: images.len(),
        });
    }
    for (i, message) in messages.iter().enumerate() {
        if !ENV_ROLES.contains(&message.role.as_str()) {
            return Err(OutputError::SpaceMismatch {
                what: format!("role of message {i} of {}", what()),
                space: ENV_ROLES.join(" | "),
                reason: format!("`{}` is not one of them", message.role),
            });
        }
    }
    Ok(())
}

/// Checks an environment's openings: one per start, messages in environment roles.
pub fn validate_openings(starts: &[EpisodeStart], openings: &[Opening]) -> Result<(), OutputError> {
    if openings.len() != starts.len() {
        return Err(OutputError::WrongLength {
            what: "openings".into(),
            expected: starts.len(),
            got: openings.len(),
        });
    }
    for (start, opening) in starts.iter().zip(openings) {
        check_messages(&opening.messages, &opening.images, &|| {
            format!("episode {}'s opening", start.id)
        })?;
    }
    Ok(())
}

/// Checks an environment's replies: one per turn, messages in environment roles, rewards and
/// components finite.
pub fn validate_replies(turns: &[Turn], replies: &[Reply]) -> Result<(), OutputError> {
    if replies.len() != turns.len() {
        return Err(OutputError::WrongLength {
            what: "replies".into(),
            expected: turns.len(),
            got: replies.len(),
        });
    }
    for (turn, reply) in turns.iter().zip(replies) {
        check_messages(&reply.messages, &reply.images, &|| {
            format!("the reply to episode {}", turn.id)
        })?;
        let values = reply.reward.iter().map(|&r| ("reward".to_string(), r));
        let components = reply.components.iter().map(|(n, v)| (format!("component `{n}`"), *v));
        for (what, value) in values.chain(components) {
            if !value.is_finite() {
                return Err(OutputError::NonFinite {
                    what: format!("{what} of the reply to episode {}", turn.id),
                    value,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(id: u64) -> Turn {
        Turn {
            id,
            content: "hi".into(),
        }
    }

    #[test]
    fn replies_must_match_the_turns_and_be_finite() {
        let turns = [turn(3), turn(5)];
        let ok = Reply {
            messages: vec![Message::new("user", "warmer")],
            reward: Some(1.0),
            components: vec![("correct".into(), 1.0)],
            ..Reply::default()
        };
        assert!(validate_replies(&turns, &[ok.clone(), Reply::default()]).is_ok());
        let short = validate_replies(&turns, std::slice::from_ref(&ok)).unwrap_err();
        assert!(short.to_string().contains("returned 1 replies, expected 2"), "{short}");
        let nan = Reply {
            components: vec![("correct".into(), f64::NAN)],
            ..ok.clone()
        };
        let err = validate_replies(&turns, &[ok.clone(), nan]).unwrap_err();
        assert!(
            err.to_string()
                .contains("component `correct` of the reply to episode 5"),
            "{err}"
        );
        let impostor = Reply {
            messages: vec![Message::new("assistant", "I give up")],
            ..ok
        };
        let err = validate_replies(&turns[..1], &[impostor]).unwrap_err();
        assert!(err.to_string().contains("`assistant` is not one of them"), "{err}");
    }

    #[test]
    fn images_must_match_the_markers_of_the_messages() {
        let png = Image::new(b"\x89PNG\r\n\x1a\n".to_vec()).unwrap();
        let shown = Reply {
            messages: vec![Message::new("tool", "zoomed: <image>")],
            images: vec![png.clone()],
            ..Reply::default()
        };
        assert!(validate_replies(&[turn(1)], std::slice::from_ref(&shown)).is_ok());
        let unmarked = Reply {
            messages: vec![Message::new("tool", "zoomed")],
            ..shown.clone()
        };
        let err = validate_replies(&[turn(1)], &[unmarked]).unwrap_err();
        assert!(
            err.to_string()
                .contains("images for the `<image>` markers of the reply to episode 1"),
            "{err}"
        );
        let missing = Opening {
            messages: vec![Message::new("user", "<image><image> which is bigger?")],
            images: vec![png],
            ..Opening::default()
        };
        let err = validate_openings(&[EpisodeStart::default()], &[missing]).unwrap_err();
        assert!(err.to_string().contains("returned 1"), "{err}");
        // Text that only mentions the marker, with no images, is text.
        let mention = Reply {
            messages: vec![Message::new("user", "the <image> tag is for pictures")],
            ..Reply::default()
        };
        assert!(validate_replies(&[turn(1)], &[mention]).is_ok());
    }

    #[test]
    fn openings_must_match_the_starts() {
        let starts = [EpisodeStart::default()];
        assert!(validate_openings(&starts, &[Opening::default()]).is_ok());
        assert!(validate_openings(&starts, &[]).is_err());
    }
}
