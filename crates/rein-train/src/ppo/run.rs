//! A PPO run: the algorithm driven over the recipe's updates, then the deterministic policy
//! evaluated and saved.

use std::path::PathBuf;
use std::time::Duration;

use burn::module::AutodiffModule;
use rein_model::ReinAutodiffBackend;
use rein_recipe::{LoadedRecipe, Plan};

use super::policy::{evaluate, save_policy};
use super::{EnvFactory, Ppo};
use crate::TrainError;
use crate::checkpoint::Checkpointing;
use crate::driver::{self, Driver};
use crate::run_dir::RunDir;

/// Where the wall-clock time of a run went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// Stepping environments (plugin calls).
    pub env: Duration,
    /// Rollout forward passes, action sampling and advantages.
    pub inference: Duration,
    /// Training forward passes, losses and backward passes.
    pub backward: Duration,
    /// Gradient clipping and optimiser steps.
    pub optimizer: Duration,
    /// Everything, from start to the last update.
    pub total: Duration,
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct PpoOutcome {
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

/// Trains the recipe's PPO agent on `device`, writing the run into `run` when given, with
/// checkpoints (and resuming) as `checkpointing` says.
pub fn train<B: ReinAutodiffBackend>(
    loaded: &LoadedRecipe,
    make_env: &EnvFactory<'_>,
    device: &B::Device,
    run: Option<&RunDir>,
    checkpointing: &Checkpointing,
) -> Result<PpoOutcome, TrainError> {
    let Plan::Ppo(plan) = loaded.plan()? else {
        return Err(TrainError::Unsupported("not a PPO recipe".into()));
    };
    let (recipe, section) = (plan.recipe, plan.ppo);
    let mut ppo = Ppo::<B>::new(plan, make_env, device, checkpointing.dir.is_some())?;
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
    .run(&mut ppo)?;
    let phase = |name: &str| driven.phases.get(name).copied().unwrap_or_default();
    let timings = Timings {
        env: phase("env"),
        inference: phase("inference"),
        backward: phase("backward"),
        optimizer: phase("optimizer"),
        total: driven.elapsed,
    };

    let policy = ppo.model.valid();
    let eval_return = match recipe.train.eval_episodes {
        0 => None,
        _ => {
            let stats = ppo.state.obs_stats.as_ref();
            Some(evaluate(
                &policy,
                make_env,
                recipe,
                stats,
                section,
                ppo.bounds.as_ref(),
                device,
            )?)
        }
    };
    if let Some(run) = run {
        save_policy(&policy, run.path())?;
        if let Some(stats) = &ppo.state.obs_stats {
            let json = serde_json::to_string_pretty(stats).unwrap_or_default();
            std::fs::write(run.path().join("obs_normalizer.json"), json)?;
        }
    }
    let outcome = PpoOutcome {
        updates: driven.steps,
        env_steps: ppo.state.env_steps,
        episodes: ppo.state.episodes.completed,
        mean_return: ppo.state.episodes.mean_return(),
        solved_at: ppo.state.solved_at,
        eval_return,
        timings,
        run_dir: run.map(|r| r.path().to_path_buf()),
    };
    if let Some(run) = run {
        let report = report_markdown(loaded, &outcome);
        std::fs::write(run.path().join("report.md"), &report)?;
        if let Some(metrics) = metrics.as_mut() {
            metrics.text("report", &report)?;
        }
    }
    Ok(outcome)
}

/// `report.md` of a PPO run: what was reached, when, and whether it reproduces.
fn report_markdown(loaded: &LoadedRecipe, outcome: &PpoOutcome) -> String {
    let number = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.1}"));
    let solved = match outcome.solved_at {
        Some((steps, seconds)) => format!("after {steps} env steps ({seconds:.1} s)"),
        None => "not reached".to_string(),
    };
    format!(
        "# {}\n\nseed {}, {} updates, {} env steps, {} episodes, {:.1} s\n\n{}\n\n\
         | figure | value |\n|---|---|\n\
         | mean return, last training episodes | {} |\n\
         | `train.stop_at_return` reached | {} |\n\
         | deterministic policy, {} evaluation episodes | {} |\n",
        loaded.name(),
        loaded.recipe.seed,
        outcome.updates,
        outcome.env_steps,
        outcome.episodes,
        outcome.timings.total.as_secs_f64(),
        loaded.reproducibility(),
        number(outcome.mean_return),
        solved,
        loaded.recipe.train.eval_episodes,
        number(outcome.eval_return),
    )
}
