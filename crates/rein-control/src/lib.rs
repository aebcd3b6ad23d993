//! Classic control: PPO ([`ppo`], CleanRL's `ppo.py` in algorithm order), SAC and TD3
//! ([`off_policy`]) on a vector of environments, and what those loops share
//! ([`environments`]: the factory, the episodes' returns, resuming by replaying the actions
//! sent, evaluation, the run's report).
//!
//! **Architecture invariant:** environments are `rein_core::VecEnv`s made by the caller's
//! factory; this crate loads no plugin (no wasmtime) and trains no language model. The run's
//! machinery (driver, checkpoints, metrics) is `rein-run`'s.

pub mod environments;
mod error;
mod flat_sections;
pub mod off_policy;
pub mod ppo;

pub use environments::EnvOutcome;
pub use error::ControlError;
