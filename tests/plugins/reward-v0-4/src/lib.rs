//! A reward plugin built against `rein:plugin@0.4.0` (its WIT frozen in
//! crates/rein-plugin/wit-0.4.0), as a plugin published before images was: the host must still
//! load and run it, tokens and step scores included. It asks for the completions' tokens and
//! scores each completion with its token count, the first token being a step worth 1.

wit_bindgen::generate!({
    path: "../../../crates/rein-plugin/wit-0.4.0",
    world: "reward",
});

use exports::rein::plugin::reward_api::{CompletionScore, Group, Guest, RewardInputs, StepScore};
use rein::plugin::types::{PluginError, PluginMetadata};

struct TokenCount;

impl Guest for TokenCount {
    fn metadata() -> PluginMetadata {
        PluginMetadata {
            name: "reward-v0-4".into(),
            version: "0.4.0".into(),
            description: "the completion's token count (built against 0.4.0)".into(),
            config_keys: Vec::new(),
        }
    }

    fn inputs() -> RewardInputs {
        RewardInputs::TOKENS
    }

    fn init(_config: String) -> Result<(), PluginError> {
        Ok(())
    }

    fn score(groups: Vec<Group>) -> Result<Vec<Vec<CompletionScore>>, PluginError> {
        let score = |tokens: &Vec<exports::rein::plugin::reward_api::Token>| CompletionScore {
            score: Some(tokens.len() as f64),
            components: Vec::new(),
            steps: (tokens.first().filter(|t| !t.text.is_empty()))
                .map(|t| StepScore {
                    start: 0,
                    end: t.text.chars().count() as u32,
                    score: 1.0,
                })
                .into_iter()
                .collect(),
        };
        Ok(groups
            .iter()
            .map(|group| group.tokens.iter().map(score).collect())
            .collect())
    }
}

export!(TokenCount);
