//! A SAC or TD3 run: the loop driven over the recipe's steps, then the deterministic policy
//! evaluated and saved (`policy.safetensors`, the actor).

use rein_model::ReinAutodiffBackend;
use rein_recipe::{LoadedRecipe, OffPolicyRecipe};

use super::trainer::OffPolicy;
use crate::ControlError;
use crate::environments::{EnvFactory, EnvOutcome, Timings, drive, episodes};
use rein_run::RunDir;
use rein_run::checkpoint::Checkpointing;

/// Trains the recipe's SAC or TD3 agent on `device`, writing the run into `run` when given,
/// with checkpoints (and resuming) as `checkpointing` says.
pub fn train<B: ReinAutodiffBackend>(
    loaded: &LoadedRecipe,
    plan: OffPolicyRecipe<'_>,
    make_env: &EnvFactory<'_>,
    device: &B::Device,
    run: Option<&RunDir>,
    checkpointing: &Checkpointing,
) -> Result<EnvOutcome, ControlError> {
    let recipe = plan.recipe;
    let mut learner = OffPolicy::<B>::new(plan, make_env, device, checkpointing.dir.is_some())?;
    let (driven, mut metrics) = drive(recipe, &mut learner, run, checkpointing)?;

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
    outcome.write_report(loaded, run, metrics.as_mut())?;
    Ok(outcome)
}
