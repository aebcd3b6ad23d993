//! Tool calls in the Hermes / Qwen2.5 format: the model writes
//! `<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>`, and the
//! result goes back as a `tool` message (which Qwen2.5's chat template wraps in
//! `<tool_response>…</tool_response>`).
//!
//! Whatever the model writes, parsing gives each call or the [`ToolError`] the model is shown
//! instead: an unclosed tag, invalid JSON, a missing name or a tool the episode does not offer
//! never stops the episode.

use rein_core::{ToolError, ToolErrorKind};

/// The tag that opens a call.
pub const OPEN: &str = "<tool_call>";
/// The tag that closes a call (a stop string while generating a turn).
pub const CLOSE: &str = "</tool_call>";

/// A parsed call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The tool's name.
    pub name: String,
    /// Its arguments, a JSON object as text.
    pub arguments: String,
}

/// Every call in `text`, in order, each parsed or the error for the model.
pub fn parse_tool_calls(text: &str) -> Vec<Result<ToolCall, ToolError>> {
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        let body = &rest[start + OPEN.len()..];
        let Some(end) = body.find(CLOSE) else {
            calls.push(Err(malformed(format!("the {OPEN} tag is not closed with {CLOSE}"))));
            break;
        };
        calls.push(parse_call(&body[..end]));
        rest = &body[end + CLOSE.len()..];
    }
    calls
}

fn malformed(message: String) -> ToolError {
    ToolError::new(ToolErrorKind::Malformed, message)
}

fn parse_call(body: &str) -> Result<ToolCall, ToolError> {
    let value: serde_json::Value =
        serde_json::from_str(body.trim()).map_err(|e| malformed(format!("the tool call is not valid JSON ({e})")))?;
    let serde_json::Value::Object(mut call) = value else {
        return Err(malformed(
            r#"the tool call must be a JSON object {"name": ..., "arguments": {...}}"#.into(),
        ));
    };
    let name = match call.remove("name") {
        Some(serde_json::Value::String(name)) => name,
        _ => return Err(malformed("the tool call has no \"name\" string".into())),
    };
    let arguments = match call.remove("arguments") {
        None | Some(serde_json::Value::Null) => "{}".to_string(),
        Some(serde_json::Value::Object(args)) => serde_json::Value::Object(args).to_string(),
        // Some models write the arguments as a JSON string holding the object.
        Some(serde_json::Value::String(text)) => match serde_json::from_str(&text) {
            Ok(serde_json::Value::Object(args)) => serde_json::Value::Object(args).to_string(),
            _ => {
                return Err(malformed(format!(
                    "the \"arguments\" of `{name}` are not a JSON object"
                )));
            }
        },
        Some(_) => {
            return Err(malformed(format!(
                "the \"arguments\" of `{name}` are not a JSON object"
            )));
        }
    };
    Ok(ToolCall { name, arguments })
}

/// The error for a call to a tool not among `offered`.
pub fn unknown_tool(name: &str, offered: &[&str]) -> ToolError {
    let available = match offered {
        [] => "none".to_string(),
        names => names.join(", "),
    };
    ToolError::new(
        ToolErrorKind::UnknownTool,
        format!("unknown tool `{name}` (available: {available})"),
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn kinds(text: &str) -> Vec<Result<String, ToolErrorKind>> {
        parse_tool_calls(text)
            .into_iter()
            .map(|c| c.map(|c| format!("{}{}", c.name, c.arguments)).map_err(|e| e.kind))
            .collect()
    }

    #[test]
    fn parses_hermes_calls() {
        let text = "Let me compute.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"12*34\"}}\n</tool_call>";
        assert_eq!(kinds(text), vec![Ok(r#"calculator{"expression":"12*34"}"#.into())]);
        let two = r#"<tool_call>{"name": "a"}</tool_call> and <tool_call>{"name": "b", "arguments": "{\"x\": 1}"}</tool_call>"#;
        assert_eq!(kinds(two), vec![Ok("a{}".into()), Ok(r#"b{"x":1}"#.into())]);
        assert!(kinds("no calls here </tool_call>").is_empty());
    }

    #[test]
    fn malformed_calls_are_errors_for_the_model() {
        let unclosed = parse_tool_calls("<tool_call>{\"name\": \"calculator\"");
        assert_eq!(unclosed[0].as_ref().unwrap_err().kind, ToolErrorKind::Malformed);
        assert!(unclosed[0].as_ref().unwrap_err().message.contains("not closed"));
        for (text, says) in [
            ("<tool_call>{name: calculator}</tool_call>", "not valid JSON"),
            ("<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
            ("<tool_call>{\"arguments\": {}}</tool_call>", "no \"name\""),
            (
                "<tool_call>{\"name\": \"c\", \"arguments\": [1]}</tool_call>",
                "not a JSON object",
            ),
            (
                "<tool_call>{\"name\": \"c\", \"arguments\": \"x\"}</tool_call>",
                "not a JSON object",
            ),
        ] {
            let error = parse_tool_calls(text).remove(0).unwrap_err();
            assert_eq!(error.kind, ToolErrorKind::Malformed, "{text}");
            assert!(error.message.contains(says), "{text}: {}", error.message);
        }
        let unknown = unknown_tool("search", &["calculator"]);
        assert_eq!(unknown.kind, ToolErrorKind::UnknownTool);
        assert_eq!(unknown.message, "unknown tool `search` (available: calculator)");
    }

    proptest! {
        /// Any text parses without panicking, into one entry per opening tag that starts a
        /// call (an unclosed one ends the list).
        #[test]
        fn any_text_parses(text in "(<tool_call>|</tool_call>|\\{\"name\": \"x\"\\}|[a-z{}\":, ]){0,40}") {
            let calls = parse_tool_calls(&text);
            prop_assert!(calls.len() <= text.matches(OPEN).count());
        }
    }
}
