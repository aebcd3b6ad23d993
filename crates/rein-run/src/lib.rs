//! A training run's machinery, the same for every algorithm: the loop that drives a
//! [`driver::Trainer`] one step at a time, crash-safe [`checkpoint`]s, the [`watchdog`] that
//! stops a stalled phase, the run directory with `metrics.jsonl` and TensorBoard's event files
//! ([`RunDir`], [`tensorboard`]), the [`progress`] line and peak [`memory`].
//!
//! **Architecture invariant:** this crate knows a trainer only through [`driver::Trainer`]; it
//! names no algorithm, recipe, plugin or model. The algorithms' crates (classic control,
//! language-model post-training) depend on it, never the other way.

pub mod checkpoint;
pub mod driver;
mod error;
pub mod memory;
pub mod progress;
mod run_dir;
pub mod tensorboard;
pub mod watchdog;

pub use error::{RunError, StepError};
pub use run_dir::{MetricsWriter, RunDir, tensorboard_tag};
