//! A text environment built against `rein:plugin@0.4.0` (crates/rein-plugin/wit-0.4.0), before
//! episodes could carry images: the host must load and run it as it did. It opens with the
//! row's prompt, echoes each turn back in upper case, and ends after the second turn with a
//! reward of 1.

use std::cell::RefCell;
use std::collections::HashMap;

wit_bindgen::generate!({
    path: "../../../crates/rein-plugin/wit-0.4.0",
    world: "text-env",
});

use exports::rein::plugin::text_env_api::{EpisodeStart, Guest, Opening, Reply, Turn};
use rein::plugin::types::{Message, PluginError, PluginMetadata};

thread_local! {
    /// Turns taken per live episode.
    static TURNS: RefCell<HashMap<u64, u32>> = RefCell::new(HashMap::new());
}

struct Echo;

impl Guest for Echo {
    fn metadata() -> PluginMetadata {
        PluginMetadata {
            name: "text-env-v0-4".into(),
            version: "0.4.0".into(),
            description: "echoes turns in upper case (built against 0.4.0)".into(),
            config_keys: Vec::new(),
        }
    }

    fn init(_config: String) -> Result<(), PluginError> {
        Ok(())
    }

    fn reset(starts: Vec<EpisodeStart>) -> Result<Vec<Opening>, PluginError> {
        TURNS.with(|turns| {
            let mut turns = turns.borrow_mut();
            Ok(starts
                .into_iter()
                .map(|start| {
                    turns.insert(start.id, 0);
                    Opening {
                        messages: vec![Message {
                            role: "user".into(),
                            content: start.prompt,
                        }],
                        tools: Vec::new(),
                    }
                })
                .collect())
        })
    }

    fn step(turns: Vec<Turn>) -> Result<Vec<Reply>, PluginError> {
        TURNS.with(|taken| {
            let mut taken = taken.borrow_mut();
            turns
                .into_iter()
                .map(|turn| {
                    let count = taken.get_mut(&turn.id).ok_or_else(|| PluginError {
                        message: format!("episode {} is not open", turn.id),
                    })?;
                    *count += 1;
                    let done = *count == 2;
                    Ok(Reply {
                        messages: vec![Message {
                            role: "user".into(),
                            content: turn.content.to_uppercase(),
                        }],
                        reward: done.then_some(1.0),
                        components: Vec::new(),
                        done,
                        state_key: None,
                    })
                })
                .collect()
        })
    }

    fn close(ids: Vec<u64>) {
        TURNS.with(|turns| {
            for id in ids {
                turns.borrow_mut().remove(&id);
            }
        });
    }
}

export!(Echo);
