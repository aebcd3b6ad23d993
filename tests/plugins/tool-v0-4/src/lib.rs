//! A tool plugin built against `rein:plugin@0.4.0` (crates/rein-plugin/wit-0.4.0), before tool
//! outputs could carry images: the host must load and call it as it did. It returns its
//! arguments' `text` reversed.

wit_bindgen::generate!({
    path: "../../../crates/rein-plugin/wit-0.4.0",
    world: "tool",
});

use exports::rein::plugin::tool_api::{Guest, ToolError, ToolSpec};
use rein::plugin::types::{PluginError, PluginMetadata};

struct Reverse;

impl Guest for Reverse {
    fn metadata() -> PluginMetadata {
        PluginMetadata {
            name: "tool-v0-4".into(),
            version: "0.4.0".into(),
            description: "reverses text (built against 0.4.0)".into(),
            config_keys: Vec::new(),
        }
    }

    fn init(_config: String) -> Result<ToolSpec, PluginError> {
        Ok(ToolSpec {
            name: "reverse".into(),
            description: "Reverses `text`.".into(),
            parameters: r#"{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}"#.into(),
        })
    }

    fn call(arguments: String) -> Result<String, ToolError> {
        let marker = "\"text\":\"";
        let start = arguments.find(marker).map(|at| at + marker.len());
        let text = start.and_then(|s| arguments[s..].find('"').map(|end| &arguments[s..s + end]));
        match text {
            Some(text) => Ok(text.chars().rev().collect()),
            None => Err(ToolError {
                message: "expected {\"text\": \"...\"}".into(),
            }),
        }
    }
}

export!(Reverse);
