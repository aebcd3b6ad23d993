//! A PPO run: the algorithm driven over the recipe's updates, then the deterministic policy
//! evaluated and saved.

use rein_model::ReinAutodiffBackend;
use rein_recipe::{LoadedRecipe, PpoRecipe};

use super::Ppo;
use super::policy::evaluate;
use crate::ControlError;
use crate::environments::{EnvFactory, EnvOutcome, Timings, drive};
use rein_run::RunDir;
use rein_run::checkpoint::Checkpointing;

/// Trains the recipe's PPO agent on `device`, writing the run into `run` when given, with
/// checkpoints (and resuming) as `checkpointing` says.
pub fn train<B: ReinAutodiffBackend>(
    loaded: &LoadedRecipe,
    plan: PpoRecipe<'_>,
    make_env: &EnvFactory<'_>,
    device: &B::Device,
    run: Option<&RunDir>,
    checkpointing: &Checkpointing,
) -> Result<EnvOutcome, ControlError> {
    let (recipe, section) = (plan.recipe, plan.ppo);
    let mut ppo = Ppo::new::<B>(plan, make_env, device, checkpointing.dir.is_some())?;
    let (driven, mut metrics) = drive(recipe, &mut ppo, run, checkpointing)?;
    let timings = Timings::of(&driven);

    let eval_return = match recipe.train.eval_episodes {
        0 => None,
        _ => {
            let stats = ppo.state.obs_stats.as_ref();
            Some(evaluate(
                (ppo.learner.as_mut(), ppo.head),
                make_env,
                recipe,
                stats,
                section,
                ppo.bounds.as_ref(),
            )?)
        }
    };
    if let Some(run) = run {
        let policy = run.path().join("policy.safetensors");
        rein_model::safetensors_file::write(&policy, &ppo.learner.tensors(), "pt")?;
        if let Some(stats) = &ppo.state.obs_stats {
            let json = serde_json::to_string_pretty(stats).unwrap_or_default();
            std::fs::write(run.path().join("obs_normalizer.json"), json)?;
        }
    }
    let outcome = EnvOutcome {
        algorithm: "PPO",
        updates: driven.steps,
        env_steps: ppo.state.env_steps,
        episodes: ppo.state.episodes.completed,
        mean_return: ppo.state.episodes.mean_return(),
        solved_at: ppo.state.solved_at,
        eval_return,
        timings,
        run_dir: run.map(|r| r.path().to_path_buf()),
    };
    outcome.write_report(loaded, run, metrics.as_mut())?;
    Ok(outcome)
}
