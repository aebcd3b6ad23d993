//! rein's WebAssembly plugin host.
//!
//! **Architecture invariant:** this is the only crate that links wasmtime. It loads plugin
//! components (reward functions, environments, tools and text environments built against
//! `wit/plugin.wit`, or its earlier versions), runs them in a sandbox, and hands the rest of rein plain [`rein_core`]
//! trait objects: a [`RewardPlugin`] is a [`rein_core::RewardFn`], an [`EnvPlugin`] an
//! [`rein_core::Environment`], a [`VecEnvPlugin`] a [`rein_core::VecEnv`], a [`ToolPlugin`] a [`rein_core::Tool`] and a
//! [`TextEnvPlugin`] a [`rein_core::TextEnv`]. Nothing outside sees a `Store` or a trap; a
//! tool's trap reaches the model as a message, not the run as an error.
//!
//! # The sandbox
//!
//! - **Memory**: each instance may grow its linear memories to [`SandboxLimits::memory_mib`] in
//!   total (pooling allocator; a denied `memory.grow` is reported as
//!   [`PluginErrorKind::MemoryLimit`](rein_core::PluginErrorKind::MemoryLimit)).
//! - **Time**: every call has a wall-clock deadline ([`SandboxLimits::timeout_ms`]) enforced by
//!   epoch interruption from a ticker thread; optional fuel ([`SandboxLimits::fuel`]) gives a
//!   deterministic budget per call.
//! - **Stack**: [`SandboxLimits::stack_kib`] of wasm stack.
//! - **WASI**: deny-all — no preopened directories, no environment variables or arguments, no
//!   sockets or name lookup, deterministic randomness; stdout and stderr are captured, keeping
//!   the last [`SandboxLimits::stdio_kib`], and shown in trap messages.
//! - **Floats**: deterministic relaxed SIMD, so results do not depend on the host CPU; NaN
//!   canonicalisation on request ([`SandboxLimits::canonicalize_nans`]; every NaN a plugin
//!   returns is rejected anyway).
//! - **Outputs**: every result is validated (lengths, finite numbers, spaces, total size).
//!
//! A trap (deadline, fuel, memory, stack overflow, panic) poisons a wasmtime `Store`, so the
//! host drops it; the next call instantiates afresh from the shared `InstancePre` (tens of
//! microseconds). A plugin's own `plugin-error` leaves its instance in place.
//!
//! Compiled components are cached on disk ([`ArtifactCache`]), keyed by the hash of the
//! `.wasm` bytes and the engine's compatibility hash, so loading a plugin a second time costs a
//! deserialisation, not a compilation.

mod bindings;
mod cache;
pub mod clocks;
mod env;
mod epoch;
mod imports;
mod judge;
mod plugin;
mod previous;
mod reward;
mod runtime;
mod sandbox;
mod stdio;
mod text_env;
mod tool;

pub use cache::ArtifactCache;
pub use env::{EnvPlugin, VecEnvPlugin};
pub use imports::{Access, Import};
pub use judge::{JUDGE_IMPORT, JudgeGrant, MAX_TOP_LOGPROBS};
pub use plugin::{ConfigKey, Plugin, PluginInfo, PluginKind, PluginMetadata};
pub use rein_core::{InvalidLimit, SandboxLimits};
pub use reward::RewardPlugin;
pub use runtime::PluginRuntime;
pub use text_env::TextEnvPlugin;
pub use tool::ToolPlugin;

/// The version of the `rein:plugin` WIT package this host speaks.
pub const INTERFACE_VERSION: &str = "0.5.0";
