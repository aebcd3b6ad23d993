//! Host bindings generated from `wit/plugin.wit`.

/// The `reward` world.
pub(crate) mod reward {
    wasmtime::component::bindgen!({ path: "wit", world: "reward" });
    pub(crate) use exports::rein::plugin::reward_api::{CompletionScore, Group, RewardInputs, StepScore, Token};
    pub(crate) use rein::plugin::types::Image;
}

/// The `reward` world of `rein:plugin@0.4.0` (`wit-0.4.0/`), for rewards built before images.
pub(crate) mod reward_v0_4 {
    wasmtime::component::bindgen!({
        path: "wit-0.4.0",
        world: "reward",
        with: { "rein:plugin/types@0.4.0": crate::bindings::reward::rein::plugin::types },
    });
    pub(crate) use exports::rein::plugin::reward_api::{CompletionScore, Group, RewardInputs, Token};
}

/// The `reward` world of `rein:plugin@0.3.0` (`wit-0.3.0/`), for rewards built against it: the
/// interfaces it shares with the current version are the current ones ([`crate::previous`]).
pub(crate) mod reward_v0_3 {
    wasmtime::component::bindgen!({
        path: "wit-0.3.0",
        world: "reward",
        with: { "rein:plugin/types@0.3.0": crate::bindings::reward::rein::plugin::types },
    });
    pub(crate) use exports::rein::plugin::reward_api::Group;
}

/// The `reward-with-judge` world: a reward plugin importing `judge`. Its exports are the reward
/// world's; only the import's host side is used from here.
pub(crate) mod judge {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "reward-with-judge",
        with: {
            "rein:plugin/types": crate::bindings::reward::rein::plugin::types,
            "rein:plugin/reward-api": crate::bindings::reward::exports::rein::plugin::reward_api,
        },
    });
}

/// The `environment` world (sharing the `types` interface with the reward world).
pub(crate) mod environment {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "environment",
        with: { "rein:plugin/types": crate::bindings::reward::rein::plugin::types },
    });
    pub(crate) use exports::rein::plugin::environment_api::{Action, BatchActions, BatchStep, Observation, Space};
}

/// The `tool` world.
pub(crate) mod tool {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "tool",
        with: { "rein:plugin/types": crate::bindings::reward::rein::plugin::types },
    });
}

/// The `tool` world of `rein:plugin@0.4.0` (and 0.3.0, the same): calls return text only.
pub(crate) mod tool_v0_4 {
    wasmtime::component::bindgen!({
        path: "wit-0.4.0",
        world: "tool",
        with: { "rein:plugin/types@0.4.0": crate::bindings::reward::rein::plugin::types },
    });
}

/// The `text-env` world.
pub(crate) mod text_env {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "text-env",
        with: { "rein:plugin/types": crate::bindings::reward::rein::plugin::types },
    });
    pub(crate) use exports::rein::plugin::text_env_api::{EpisodeStart, Turn};
    pub(crate) use rein::plugin::types::{Image, Message};
}

/// The `text-env` world of `rein:plugin@0.4.0` (and 0.3.0, the same): no images.
pub(crate) mod text_env_v0_4 {
    wasmtime::component::bindgen!({
        path: "wit-0.4.0",
        world: "text-env",
        with: { "rein:plugin/types@0.4.0": crate::bindings::reward::rein::plugin::types },
    });
    pub(crate) use exports::rein::plugin::text_env_api::{EpisodeStart, Turn};
}

pub(crate) use reward::rein::plugin::types::PluginMetadata as Metadata;
