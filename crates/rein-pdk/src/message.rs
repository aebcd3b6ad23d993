//! A message of a conversation, as text environments and judge requests write them.

use crate::__private::reward::rein::plugin::types::Message as WitMessage;

/// One message: `role` is `system`, `user`, `assistant` or `tool`.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The role.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self {
            role: "user".into(),
            content: content.into(),
        }
    }

    /// A message with any role.
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    /// An assistant message (e.g. an answer shown to a judge).
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self {
            role: "system".into(),
            content: content.into(),
        }
    }
}

/// The messages as the WIT types carry them.
pub(crate) fn to_wit(messages: Vec<Message>) -> Vec<WitMessage> {
    messages
        .into_iter()
        .map(|m| WitMessage {
            role: m.role,
            content: m.content,
        })
        .collect()
}
