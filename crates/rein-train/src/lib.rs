//! rein's training loops and everything a run needs around them: recipes, run directories,
//! metrics and progress.
//!
//! - [`recipe`]: TOML recipes, composition (`extends`, `--set`) and validation.
//! - [`ppo`]: PPO on a vector of environment plugins (CleanRL's `ppo.py`, in algorithm order).
//! - [`RunDir`]: `runs/<name>-<timestamp>/` with the resolved recipe, `metrics.jsonl` and the
//!   final policy.
//!
//! **Architecture invariant:** this is where the other crates meet (core traits, plugins,
//! models, samplers, losses); nothing here is imported by them.

pub mod ppo;
mod progress;
pub mod recipe;
mod run_dir;
mod runner;

pub use run_dir::{MetricsWriter, RunDir};
pub use runner::run;
