//! What every trainer on a vector of environment plugins shares (PPO, SAC, TD3): the factory
//! that makes the environments, the episodes' returns, resuming by replaying the actions sent
//! ([`replay`]), the deterministic policy's evaluation, and what a finished run reports.

pub(crate) mod episodes;
pub(crate) mod replay;

use std::path::PathBuf;
use std::time::Duration;

use rein_core::{PluginError, VecEnv};
use rein_recipe::{LoadedRecipe, Recipe};

use crate::ControlError;
use rein_run::checkpoint::Checkpointing;
use rein_run::driver::{self, Driven, Driver, Trainer};
use rein_run::{MetricsWriter, RunDir};

/// Makes `n` environments (the recipe's plugin and config); called for training and again
/// for evaluation.
pub type EnvFactory<'a> = dyn Fn(usize) -> Result<Box<dyn VecEnv>, PluginError> + 'a;

/// Where the wall-clock time of a run went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// Stepping environments (plugin calls).
    pub env: Duration,
    /// Forward passes that choose actions, action sampling, advantages.
    pub inference: Duration,
    /// Training forward passes, losses and backward passes.
    pub backward: Duration,
    /// Gradient clipping and optimiser steps.
    pub optimizer: Duration,
    /// Everything, from start to the last update.
    pub total: Duration,
}

impl Timings {
    /// The driver's phases, by name.
    pub(crate) fn of(driven: &Driven) -> Self {
        let phase = |name: &str| driven.phases.get(name).copied().unwrap_or_default();
        Self {
            env: phase("env"),
            inference: phase("inference"),
            backward: phase("backward"),
            optimizer: phase("optimizer"),
            total: driven.elapsed,
        }
    }
}

/// Drives `trainer` over its steps with the recipe's checkpoints and stall timeout, its metrics
/// going to `run` (after those a resumed checkpoint had logged); what the driver reports, and
/// the metrics' writer for the report.
pub(crate) fn drive(
    recipe: &Recipe,
    trainer: &mut impl Trainer<Error = ControlError>,
    run: Option<&RunDir>,
    checkpointing: &Checkpointing,
) -> Result<(Driven, Option<MetricsWriter>), ControlError> {
    let metrics_len = match &checkpointing.resume {
        Some(checkpoint) => driver::metrics_len(checkpoint)?,
        None => 0,
    };
    let mut metrics = (run.map(|r| r.metrics_from(metrics_len, recipe.train.tensorboard()))).transpose()?;
    let driven = Driver {
        metrics: metrics.as_mut(),
        checkpointing,
        stall_timeout: Duration::from_secs_f64(recipe.train.stall_timeout_s),
        stage: None,
    }
    .run(trainer)?;
    Ok((driven, metrics))
}

/// What a finished run on environments reports.
#[derive(Debug, Clone)]
pub struct EnvOutcome {
    /// The algorithm (`PPO`, `SAC`, `TD3`).
    pub algorithm: &'static str,
    /// Updates performed.
    pub updates: usize,
    /// Environment steps taken (all envs).
    pub env_steps: u64,
    /// Episodes completed during training.
    pub episodes: usize,
    /// Mean return of the last `return_window` training episodes.
    pub mean_return: Option<f64>,
    /// When the mean return first reached `stop_at_return`: (env steps, seconds).
    pub solved_at: Option<(u64, f64)>,
    /// Mean return of the deterministic policy over `eval_episodes` episodes.
    pub eval_return: Option<f64>,
    /// Where the time went.
    pub timings: Timings,
    /// The run directory, when one was written.
    pub run_dir: Option<PathBuf>,
}

impl EnvOutcome {
    /// Writes `report.md` into `run` (and the report as TensorBoard text, with `metrics`).
    pub(crate) fn write_report(
        &self,
        loaded: &LoadedRecipe,
        run: Option<&RunDir>,
        metrics: Option<&mut MetricsWriter>,
    ) -> Result<(), ControlError> {
        let Some(run) = run else {
            return Ok(());
        };
        let report = self.report_markdown(loaded);
        std::fs::write(run.path().join("report.md"), &report)?;
        if let Some(metrics) = metrics {
            metrics.text("report", &report)?;
        }
        Ok(())
    }

    /// `report.md` of the run: what was reached, when, and whether it reproduces.
    fn report_markdown(&self, loaded: &LoadedRecipe) -> String {
        let number = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.1}"));
        let solved = match self.solved_at {
            Some((steps, seconds)) => format!("after {steps} env steps ({seconds:.1} s)"),
            None => "not reached".to_string(),
        };
        format!(
            "# {}\n\n{}, seed {}, {} updates, {} env steps, {} episodes, {:.1} s\n\n{}\n\n\
             | figure | value |\n|---|---|\n\
             | mean return, last training episodes | {} |\n\
             | `train.stop_at_return` reached | {} |\n\
             | deterministic policy, {} evaluation episodes | {} |\n",
            loaded.name(),
            self.algorithm,
            loaded.recipe.seed,
            self.updates,
            self.env_steps,
            self.episodes,
            self.timings.total.as_secs_f64(),
            loaded.reproducibility(),
            number(self.mean_return),
            solved,
            loaded.recipe.train.eval_episodes,
            number(self.eval_return),
        )
    }
}
