//! A reward plugin built against `rein:plugin@0.3.0` (its WIT frozen in
//! crates/rein-plugin/wit-0.3.0), as a plugin published before step scores was: the host must
//! still load and run it. It scores a completion 1 when it contains the reference, with a
//! `length` component, and rejects a config with any key.

wit_bindgen::generate!({
    path: "../../../crates/rein-plugin/wit-0.3.0",
    world: "reward",
});

use exports::rein::plugin::reward_api::{CompletionScore, Group, Guest};
use rein::plugin::types::{Component, PluginError, PluginMetadata};

struct Contains;

impl Guest for Contains {
    fn metadata() -> PluginMetadata {
        PluginMetadata {
            name: "reward-v0-3".into(),
            version: "0.3.0".into(),
            description: "1 when the completion contains the reference (built against 0.3.0)".into(),
            config_keys: Vec::new(),
        }
    }

    fn init(config: String) -> Result<(), PluginError> {
        match config.trim() {
            "{}" => Ok(()),
            other => Err(PluginError {
                message: format!("takes no config, got {other}"),
            }),
        }
    }

    fn score(groups: Vec<Group>) -> Result<Vec<Vec<CompletionScore>>, PluginError> {
        let score = |group: &Group, completion: &String| CompletionScore {
            score: group
                .reference
                .as_ref()
                .map(|r| f64::from(u8::from(completion.contains(r.as_str())))),
            components: vec![Component {
                name: "length".into(),
                value: completion.chars().count() as f64,
            }],
        };
        Ok(groups
            .iter()
            .map(|group| group.completions.iter().map(|c| score(group, c)).collect())
            .collect())
    }
}

export!(Contains);
