//! Running a recipe end to end: plugins loaded, run directory created, the right algorithm on
//! the right device.

use std::path::Path;

use rein_core::VecEnv;
use rein_plugin::PluginRuntime;

use crate::TrainError;
use crate::lm_run::{LmOutcome, run_lm};
use crate::ppo::{self, PpoOutcome};
use crate::recipe::{Algorithm, Device, LoadedRecipe};
use crate::run_dir::RunDir;

/// What a run reports.
#[derive(Debug, Clone)]
pub enum RunOutcome {
    /// A PPO run on environments.
    Ppo(PpoOutcome),
    /// A language-model run (SFT and/or GRPO).
    Lm(LmOutcome),
}

/// Trains `loaded` with plugins from `plugin_dir`. With `write_run`, the run directory goes
/// under the recipe's `train.runs_dir`.
pub fn run(loaded: &LoadedRecipe, plugin_dir: &Path, write_run: bool) -> Result<RunOutcome, TrainError> {
    if matches!(loaded.recipe.algorithm, Algorithm::Ppo(_)) {
        return run_ppo(loaded, plugin_dir, write_run).map(RunOutcome::Ppo);
    }
    let run_dir = create_run_dir(loaded, write_run)?;
    let outcome = match loaded.recipe.device {
        Device::Cpu => run_lm::<rein_model::CpuAutodiff>(loaded, plugin_dir, run_dir.as_ref(), &Default::default()),
        #[cfg(feature = "cuda")]
        Device::Cuda => run_lm::<burn::backend::Autodiff<burn::backend::Cuda>>(
            loaded,
            plugin_dir,
            run_dir.as_ref(),
            &Default::default(),
        ),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda => Err(no_cuda(loaded)),
    };
    outcome.map(RunOutcome::Lm)
}

/// Trains a PPO recipe.
pub fn run_ppo(loaded: &LoadedRecipe, plugin_dir: &Path, write_run: bool) -> Result<PpoOutcome, TrainError> {
    let recipe = &loaded.recipe;
    let env = recipe.env.as_ref().ok_or_else(|| TrainError::Unsupported {
        plugin: String::new(),
        message: "no [env] section".into(),
    })?;
    let plugin_path = loaded.env_plugin_path(plugin_dir)?;
    let runtime = PluginRuntime::default();
    let plugin = runtime.load(&plugin_path, env.limits.clone())?;
    let config = serde_json::to_string(&env.config).unwrap_or_else(|_| "{}".into());
    let make_env = |n: usize| plugin.vec_env(&config, n).map(|e| Box::new(e) as Box<dyn VecEnv>);
    let run_dir = create_run_dir(loaded, write_run)?;
    match recipe.device {
        Device::Cpu => ppo::train::<rein_model::CpuAutodiff>(loaded, &make_env, &Default::default(), run_dir.as_ref()),
        #[cfg(feature = "cuda")]
        Device::Cuda => ppo::train::<burn::backend::Autodiff<burn::backend::Cuda>>(
            loaded,
            &make_env,
            &Default::default(),
            run_dir.as_ref(),
        ),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda => Err(no_cuda(loaded)),
    }
}

fn create_run_dir(loaded: &LoadedRecipe, write_run: bool) -> Result<Option<RunDir>, TrainError> {
    if !write_run {
        return Ok(None);
    }
    Ok(Some(RunDir::create(
        Path::new(&loaded.recipe.train.runs_dir),
        loaded.name(),
        &loaded.to_toml(),
    )?))
}

#[cfg(not(feature = "cuda"))]
fn no_cuda(loaded: &LoadedRecipe) -> TrainError {
    TrainError::Recipe(crate::recipe::RecipeError::Invalid {
        file: loaded.path.clone(),
        path: "device".into(),
        message: "this build has no CUDA support; rebuild with `--features cuda`".into(),
    })
}
