//! Tools an agent calls: what the model is told about one ([`ToolSpec`]), the [`Tool`] trait, and
//! the failures the model is shown instead of a result ([`ToolError`]).
//!
//! A tool call never fails a run. Whatever goes wrong (the model's arguments do not parse, the
//! code it asked to run loops forever, the tool crashes) becomes a [`ToolError`] whose message
//! the model reads in place of the output, and whose [`ToolErrorKind`] is counted in the
//! metrics.

use serde::{Deserialize, Serialize};

/// What the model is told about a tool, as in OpenAI function calling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// A JSON schema of its arguments object, as text.
    pub parameters: String,
}

impl ToolSpec {
    /// Checks the name: 1–64 characters from letters, digits, `_` and `-` (OpenAI's rule, which
    /// chat templates and tool-call parsers rely on).
    pub fn validate_name(name: &str) -> Result<(), String> {
        let valid = !name.is_empty()
            && name.len() <= 64
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        match valid {
            true => Ok(()),
            false => Err(format!(
                "tool name `{name}` must be 1-64 characters of letters, digits, `_` and `-`"
            )),
        }
    }
}

/// Why a tool call gave the model an error instead of a result. [`ToolErrorKind::as_str`] is
/// the name the metrics count it under (`tools/errors/<kind>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolErrorKind {
    /// The model's output had a tool-call tag whose content is not a call (unclosed tag, bad
    /// JSON, no name).
    Malformed,
    /// The model called a tool the episode does not offer.
    UnknownTool,
    /// The tool refused the call or its code raised an error (the tool's own `tool-error`).
    Tool,
    /// The call ran past its deadline.
    Timeout,
    /// The call hit a memory, fuel or stack limit.
    Limit,
    /// The tool crashed (a trap other than a limit).
    Crash,
    /// The tool's output broke the contract (too large) or the host failed around it.
    Host,
}

impl ToolErrorKind {
    /// The kind's name in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolErrorKind::Malformed => "malformed",
            ToolErrorKind::UnknownTool => "unknown_tool",
            ToolErrorKind::Tool => "tool",
            ToolErrorKind::Timeout => "timeout",
            ToolErrorKind::Limit => "limit",
            ToolErrorKind::Crash => "crash",
            ToolErrorKind::Host => "host",
        }
    }

    /// Every kind, in order.
    pub const ALL: [ToolErrorKind; 7] = [
        ToolErrorKind::Malformed,
        ToolErrorKind::UnknownTool,
        ToolErrorKind::Tool,
        ToolErrorKind::Timeout,
        ToolErrorKind::Limit,
        ToolErrorKind::Crash,
        ToolErrorKind::Host,
    ];
}

/// A failed tool call: its kind and the message the model is shown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    /// Why it failed.
    pub kind: ToolErrorKind,
    /// What the model reads instead of the output.
    pub message: String,
}

impl ToolError {
    /// A failure of `kind` with `message`.
    pub fn new(kind: ToolErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// What a tool call gives the model to read: text, and the images it shows where its
/// `<image>` markers are (all at its start when it has none).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ToolOutput {
    /// The text.
    pub text: String,
    /// The images, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<crate::Image>,
}

impl ToolOutput {
    /// Its size as the output limit counts it: the text's bytes and every image's.
    pub fn len(&self) -> usize {
        self.text.len() + self.images.iter().map(|i| i.bytes().len()).sum::<usize>()
    }

    /// It has no text and no images.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<String> for ToolOutput {
    fn from(text: String) -> Self {
        Self {
            text,
            images: Vec::new(),
        }
    }
}

impl From<&str> for ToolOutput {
    fn from(text: &str) -> Self {
        text.to_string().into()
    }
}

/// A tool: a spec for the model and a call from a JSON object of arguments to text and images.
pub trait Tool: Send {
    /// What the model is told.
    fn spec(&self) -> &ToolSpec;

    /// Runs the tool on `arguments` (a JSON object as text). A failure of any kind is an
    /// error for the model to read, and the tool stays usable for the next call.
    fn call(&mut self, arguments: &str) -> Result<ToolOutput, ToolError>;

    /// How many calls failed inside the tool's sandbox so far, by kind (a tool's own
    /// `tool-error` answers are the model's failures and are not counted here).
    fn failures(&self) -> crate::FailureCounts {
        crate::FailureCounts::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_follow_openai_rules() {
        assert!(ToolSpec::validate_name("calculator").is_ok());
        assert!(ToolSpec::validate_name("python-exec_2").is_ok());
        for bad in ["", "has space", "dot.ted", "ünï", &"x".repeat(65)] {
            let err = ToolSpec::validate_name(bad).unwrap_err();
            assert!(err.contains("must be 1-64"), "{err}");
        }
    }

    #[test]
    fn every_kind_has_a_distinct_metric_name() {
        let mut names: Vec<&str> = ToolErrorKind::ALL.iter().map(|k| k.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ToolErrorKind::ALL.len());
    }
}
