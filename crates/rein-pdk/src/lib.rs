//! The rein plugin development kit: write reward functions, environments, tools and text
//! environments as sandboxed WebAssembly components in a single short Rust file.
//!
//! A reward plugin implements [`Reward`] and exports it with [`export_reward!`]; an environment
//! implements [`Environment`] and exports it with [`export_environment!`] (a reward may ask the
//! judge model its recipe grants through [`judge::ask`]); a tool for agents
//! implements [`Tool`] ([`export_tool!`]); a multi-turn text environment implements [`TextEnv`]
//! ([`export_text_env!`]). Build with
//! `cargo build --release --target wasm32-wasip2` (or `cargo xtask build-plugins`).
//!
//! ```ignore
//! use rein_pdk::{Config, Group, Metadata, Reward, Score};
//!
//! struct Shout;
//!
//! impl Reward for Shout {
//!     const METADATA: Metadata = Metadata::new("shout", "1 for completions in capitals");
//!     fn new(_config: &Config) -> Result<Self, String> {
//!         Ok(Shout)
//!     }
//!     fn score(&mut self, group: &Group) -> Result<Vec<Score>, String> {
//!         Ok(group.completions.iter().map(|c| Score::from(c.chars().all(|ch| !ch.is_lowercase()))).collect())
//!     }
//! }
//!
//! rein_pdk::export_reward!(Shout);
//! ```
//!
//! **API boundary:** this crate and `rein-plugin/wit/plugin.wit` are what plugin authors
//! build against; the generated bindings stay private (`__private`) so the WIT can evolve
//! behind these types. The helpers in [`answer`] and [`format`] are what math and verifier
//! rewards need, and [`steps`] cuts a completion into the steps a process reward scores; they
//! are plain Rust and tested natively. [`image`] reads the images a plugin receives and writes
//! the ones it returns (pixels with the `decode` feature).

pub mod answer;
mod config;
mod env;
pub mod format;
pub mod image;
mod instance;
pub mod judge;
mod message;
mod metadata;
mod reward;
mod rng;
pub mod steps;
mod text_env;
mod tool;

pub use config::Config;
pub use env::{Action, EnvSpec, Environment, Observation, Space, Transition};
pub use image::Image;
pub use message::Message;
pub use metadata::{ConfigKey, Metadata};
pub use reward::{Group, Reward, Score, Token};
pub use rng::Rng;
/// JSON, for plugins that read group metadata ([`Group::metadata_json`]).
pub use serde_json as json;
pub use text_env::{EpisodeStart, Opening, Reply, TextEnv};
pub use tool::{Tool, ToolOutput, ToolSpec};

#[doc(hidden)]
pub mod __private {
    pub use crate::env::{BatchEnv, SingleEnv};
    pub use crate::reward::RewardExport;
    pub use crate::text_env::TextEnvExport;
    pub use crate::tool::ToolExport;

    /// Bindings of the `reward` world.
    pub mod reward {
        wit_bindgen::generate!({
            path: "../rein-plugin/wit",
            world: "reward",
            pub_export_macro: true,
            export_macro_name: "__export_reward_world",
            default_bindings_module: "rein_pdk::__private::reward",
        });
    }

    /// Bindings of the `judge-import` world: the `judge` import ([`crate::judge::ask`]) of
    /// `reward-with-judge`. Only a component that calls it imports it.
    pub mod judge_import {
        wit_bindgen::generate!({
            path: "../rein-plugin/wit",
            world: "judge-import",
            with: { "rein:plugin/types@0.5.0": crate::__private::reward::rein::plugin::types },
        });
    }

    /// Bindings of the `environment` world.
    pub mod environment {
        wit_bindgen::generate!({
            path: "../rein-plugin/wit",
            world: "environment",
            pub_export_macro: true,
            export_macro_name: "__export_environment_world",
            default_bindings_module: "rein_pdk::__private::environment",
            with: { "rein:plugin/types@0.5.0": crate::__private::reward::rein::plugin::types },
        });
    }

    /// Bindings of the `tool` world.
    pub mod tool {
        wit_bindgen::generate!({
            path: "../rein-plugin/wit",
            world: "tool",
            pub_export_macro: true,
            export_macro_name: "__export_tool_world",
            default_bindings_module: "rein_pdk::__private::tool",
            with: { "rein:plugin/types@0.5.0": crate::__private::reward::rein::plugin::types },
        });
    }

    /// Bindings of the `text-env` world.
    pub mod text_env {
        wit_bindgen::generate!({
            path: "../rein-plugin/wit",
            world: "text-env",
            pub_export_macro: true,
            export_macro_name: "__export_text_env_world",
            default_bindings_module: "rein_pdk::__private::text_env",
            with: { "rein:plugin/types@0.5.0": crate::__private::reward::rein::plugin::types },
        });
    }
}

/// Exports a [`Reward`] implementation as this component's reward plugin.
#[macro_export]
macro_rules! export_reward {
    ($reward:ty) => {
        // Exports only exist in the component; native builds (unit tests, benchmarks) use the
        // type directly.
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            type __ReinRewardExport = $crate::__private::RewardExport<$reward>;
            $crate::__private::reward::__export_reward_world!(__ReinRewardExport with_types_in $crate::__private::reward);
        };
    };
}

/// Exports an [`Environment`] implementation as this component's environment plugin (single
/// and batched).
#[macro_export]
macro_rules! export_environment {
    ($env:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            type __ReinEnvironmentExport = $crate::__private::SingleEnv<$env>;
            $crate::__private::environment::__export_environment_world!(
                __ReinEnvironmentExport with_types_in $crate::__private::environment
            );
        };
    };
}

/// Exports a [`Tool`] implementation as this component's tool plugin.
#[macro_export]
macro_rules! export_tool {
    ($tool:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            type __ReinToolExport = $crate::__private::ToolExport<$tool>;
    $crate::__private::tool::__export_tool_world!(__ReinToolExport with_types_in $crate::__private::tool);
        };
    };
}

/// Exports a [`TextEnv`] implementation as this component's text-environment plugin.
#[macro_export]
macro_rules! export_text_env {
    ($env:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            type __ReinTextEnvExport = $crate::__private::TextEnvExport<$env>;
            $crate::__private::text_env::__export_text_env_world!(
                __ReinTextEnvExport with_types_in $crate::__private::text_env
            );
        };
    };
}
