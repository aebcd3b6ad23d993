//! A tool plugin that attacks the host when its arguments say `{"attack": "..."}` (what a model
//! asking a code-running tool to run hostile code amounts to) and otherwise echoes
//! `{"text": ...}`. One instance can thus be attacked and then called again, showing that the
//! attack became a message for the model and the tool recovered.
//!
//! Its config may ask for an invalid spec (`{"spec": "bad-name" | "bad-schema"}`).

use std::hint::black_box;

use rein_pdk::json::{Map, Value, json};
use rein_pdk::{Config, ConfigKey, Image, Metadata, Tool, ToolOutput, ToolSpec};

struct Hostile {
    spec: String,
}

fn recurse(depth: u64) -> u64 {
    if depth == 0 {
        0
    } else {
        1 + recurse(black_box(depth - 1))
    }
}

impl Tool for Hostile {
    const METADATA: Metadata = Metadata::new("hostile-tool", "attacks the host on request").config(&[ConfigKey::new(
        "spec",
        "an invalid spec to return: bad-name, bad-schema",
    )]);

    fn new(config: &Config) -> Result<Self, String> {
        Ok(Hostile {
            spec: config.str_or("spec", "")?.to_string(),
        })
    }

    fn spec(&self) -> ToolSpec {
        let (name, parameters) = match self.spec.as_str() {
            "bad-name" => ("rm -rf", json!({"type": "object"})),
            "bad-schema" => ("hostile", json!("not an object")),
            _ => (
                "hostile",
                json!({"type": "object", "properties": {"attack": {"type": "string"}, "text": {"type": "string"}}}),
            ),
        };
        ToolSpec {
            name: name.into(),
            description: "runs what it is asked to".into(),
            parameters,
        }
    }

    fn call(&mut self, arguments: &Map<String, Value>) -> Result<ToolOutput, String> {
        match arguments.get("attack").and_then(Value::as_str) {
            None => {}
            Some("infinite-loop") => {
                let mut x = 0u64;
                loop {
                    x = black_box(x.wrapping_add(1));
                }
            }
            Some("memory-bomb") => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    black_box(&hoard);
                }
            }
            Some("deep-recursion") => return Ok(recurse(black_box(u64::MAX)).to_string().into()),
            Some("panic") => panic!("the hostile tool panics on purpose"),
            Some("oversized-output") => return Ok("x".repeat(80 << 20).into()),
            // A PNG's signature in front of 80 MiB: over the output limit as an image.
            Some("oversized-image") => {
                let mut data = b"\x89PNG\r\n\x1a\n".to_vec();
                data.resize(80 << 20, 0);
                return Ok(ToolOutput::with_images("<image>", vec![Image::png(data)]));
            }
            // A 2 GiB image, written 32 MiB at a time as an encoder would: the sandbox's memory
            // limit stops it before the host sees it.
            Some("two-gib-image") => {
                let mut data = b"\x89PNG\r\n\x1a\n".to_vec();
                for _ in 0..64 {
                    data.resize(data.len() + (32 << 20), black_box(0));
                }
                return Ok(ToolOutput::with_images("", vec![Image::png(data)]));
            }
            // PNG bytes said to be a JPEG.
            Some("mislabelled-image") => {
                let image = Image::jpeg(b"\x89PNG\r\n\x1a\n".to_vec());
                return Ok(ToolOutput::with_images("", vec![image]));
            }
            Some("refuse") => return Err("I refuse".into()),
            Some(other) => return Err(format!("unknown attack `{other}`")),
        }
        match arguments.get("text") {
            Some(Value::String(text)) => Ok(text.clone().into()),
            _ => Err("give me a `text`".into()),
        }
    }
}

rein_pdk::export_tool!(Hostile);
