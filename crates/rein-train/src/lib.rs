//! Runs a recipe: loads its plugins, creates its run directory, and hands the plan to the
//! trainer it names on the device it names — classic control (`rein-control`) or language-model
//! post-training (`rein-posttrain`) — or continues a run from its newest checkpoint.
//!
//! **Architecture invariant:** this crate only launches; the algorithms live in their crates
//! and the run's machinery in `rein-run`. The CLI, the benches and the tests start runs here.

mod error;
mod launch;

pub use error::TrainError;
pub use launch::{RunOutcome, resume, run, run_env};
