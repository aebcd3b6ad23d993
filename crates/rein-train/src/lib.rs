//! rein's training loops and everything a run needs around them: recipes, run directories,
//! metrics and progress.
//!
//! - [`ppo`]: PPO on a vector of environment plugins (CleanRL's `ppo.py`, in algorithm order);
//!   [`off_policy`]: SAC and TD3 on them; [`environments`]: what those loops share.
//! - [`lm`]: language-model post-training — SFT, the GRPO family, PPO with a critic, the DPO
//!   family and reward models, data from files or a generated task, held-out evaluation.
//! - [`RunDir`]: `runs/<name>-<timestamp>/` with the resolved recipe, `metrics.jsonl` (and
//!   TensorBoard's event files, [`tensorboard`]) and the final policy; [`checkpoint`]:
//!   crash-safe checkpoints in it, and [`resume`].
//! - [`memory`]: each step's peak resident memory, for the metrics.
//!
//! **Architecture invariant:** this is where the other crates meet (core traits, plugins,
//! models, samplers, losses); nothing here is imported by them.

pub mod checkpoint;
pub mod data_parallel;
pub mod driver;
pub mod environments;
mod error;
mod flat_sections;
mod launch;
pub mod lm;
pub mod memory;
pub mod off_policy;
pub mod ppo;
pub mod progress;
mod run_dir;
pub mod tensorboard;
pub mod watchdog;

pub use environments::EnvOutcome;
pub use error::TrainError;
pub use launch::{RunOutcome, resume, run, run_env};
pub use lm::run::{LmOutcome, describe};
pub use lm::setup::evaluate_recipe;
pub use run_dir::{MetricsWriter, RunDir, tensorboard_tag};
