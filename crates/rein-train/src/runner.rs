//! Running a recipe end to end: plugins loaded, run directory created, the right algorithm on
//! the right device.

use std::path::Path;

use rein_core::VecEnv;
use rein_plugin::PluginRuntime;

use crate::ppo::{self, PpoOutcome, TrainError};
use crate::recipe::{Algorithm, Device, LoadedRecipe};
use crate::run_dir::RunDir;

/// Trains `loaded` with plugins from `plugin_dir`. With `write_run`, the run directory goes
/// under the recipe's `train.runs_dir`.
pub fn run(loaded: &LoadedRecipe, plugin_dir: &Path, write_run: bool) -> Result<PpoOutcome, TrainError> {
    let recipe = &loaded.recipe;
    let Algorithm::Ppo(_) = &recipe.algorithm;
    let env = recipe.env.as_ref().ok_or_else(|| TrainError::Unsupported {
        plugin: String::new(),
        message: "no [env] section".into(),
    })?;
    let plugin_path = loaded.env_plugin_path(plugin_dir)?;
    let runtime = PluginRuntime::default();
    let plugin = runtime.load(&plugin_path, env.limits.clone())?;
    let config = serde_json::to_string(&env.config).unwrap_or_else(|_| "{}".into());
    let make_env = |n: usize| plugin.vec_env(&config, n).map(|e| Box::new(e) as Box<dyn VecEnv>);
    let run_dir = if write_run {
        Some(RunDir::create(
            Path::new(&recipe.train.runs_dir),
            loaded.name(),
            &loaded.to_toml(),
        )?)
    } else {
        None
    };
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
        Device::Cuda => Err(TrainError::Recipe(crate::recipe::RecipeError::Invalid {
            file: loaded.path.clone(),
            path: "device".into(),
            message: "this build has no CUDA support; rebuild with `--features cuda`".into(),
        })),
    }
}
