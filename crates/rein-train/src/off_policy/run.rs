//! A SAC or TD3 run: the loop driven over the recipe's steps, then the deterministic policy
//! evaluated and saved (`policy.safetensors`, the actor).

use std::time::Duration;

use rein_model::ReinAutodiffBackend;
use rein_recipe::{LoadedRecipe, Plan};

use super::trainer::OffPolicy;
use crate::TrainError;
use crate::checkpoint::Checkpointing;
use crate::driver::{self, Driver};
use crate::environments::{EnvFactory, EnvOutcome, Timings, episodes};
use crate::run_dir::RunDir;

/// Trains the recipe's SAC or TD3 agent on `device`, writing the run into `run` when given,
/// with checkpoints (and resuming) as `checkpointing` says.
pub fn train<B: ReinAutodiffBackend>(
    loaded: &LoadedRecipe,
    make_env: &EnvFactory<'_>,
    device: &B::Device,
    run: Option<&RunDir>,
    checkpointing: &Checkpointing,
) -> Result<EnvOutcome, TrainError> {
    let Plan::OffPolicy(plan) = loaded.plan()? else {
        return Err(TrainError::Unsupported("not a SAC or TD3 recipe".into()));
    };
    let recipe = plan.recipe;
    let mut learner = OffPolicy::<B>::new(plan, make_env, device, checkpointing.dir.is_some())?;
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
    .run(&mut learner)?;

    let eval_return = match recipe.train.eval_episodes {
        0 => None,
        n => Some(episodes::evaluate(make_env, recipe.seed, n, &mut |obs, _| {
            learner.deterministic(obs)
        })?),
    };
    if let Some(run) = run {
        learner.agent.save_policy(&run.path().join("policy.safetensors"))?;
    }
    let state = &learner.state;
    let outcome = EnvOutcome {
        algorithm: plan.algorithm.name(),
        updates: state.updates as usize,
        env_steps: state.env_steps,
        episodes: state.episodes.completed,
        mean_return: state.episodes.mean_return(),
        solved_at: state.solved_at,
        eval_return,
        timings: Timings::of(&driven),
        run_dir: run.map(|r| r.path().to_path_buf()),
    };
    if let Some(run) = run {
        let report = outcome.report_markdown(loaded);
        std::fs::write(run.path().join("report.md"), &report)?;
        if let Some(metrics) = metrics.as_mut() {
            metrics.text("report", &report)?;
        }
    }
    Ok(outcome)
}
