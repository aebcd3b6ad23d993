//! `{{name}}`: a tool that counts the words and characters of a text.

use rein_pdk::json::{Map, Value, json};
use rein_pdk::{Config, ConfigKey, Metadata, Tool, ToolOutput, ToolSpec};

/// The tool.
pub struct {{Type}} {
    max_chars: usize,
}

impl Tool for {{Type}} {
    const METADATA: Metadata = Metadata::new("{{name}}", "Counts the words and characters of a text")
        .config(&[ConfigKey::new("max_chars", "longest text accepted").default("10000")]);

    fn new(config: &Config) -> Result<Self, String> {
        Ok(Self { max_chars: config.u64_or("max_chars", 10_000)? as usize })
    }

    /// What the model sees (an OpenAI function schema).
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "{{name}}".into(),
            description: "Count the words and characters of a text.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"text": {"type": "string", "description": "The text to count"}},
                "required": ["text"],
            }),
        }
    }

    /// `Ok` is the result the model reads (text, or text with images:
    /// `ToolOutput::with_images`); `Err` an error message it reads instead.
    fn call(&mut self, arguments: &Map<String, Value>) -> Result<ToolOutput, String> {
        let Some(Value::String(text)) = arguments.get("text") else {
            return Err("`text` must be a string".into());
        };
        if text.chars().count() > self.max_chars {
            return Err(format!("the text is longer than {} characters", self.max_chars));
        }
        Ok(format!("{} words, {} characters", text.split_whitespace().count(), text.chars().count()).into())
    }
}

rein_pdk::export_tool!({{Type}});

#[cfg(test)]
mod tests {
    use super::*;

    fn arguments(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn counts_words_and_refuses_bad_arguments() {
        let config = Config::parse(r#"{"max_chars": 20}"#, &{{Type}}::METADATA).unwrap();
        let mut tool = {{Type}}::new(&config).unwrap();
        assert_eq!(tool.call(&arguments(json!({"text": "two  words"}))), Ok("2 words, 10 characters".into()));
        assert!(tool.call(&arguments(json!({"text": 3}))).is_err());
        assert!(tool.call(&arguments(json!({"text": "x".repeat(21)}))).is_err());
    }
}
