//! Running a recipe end to end: plugins loaded, run directory created, the right algorithm on
//! the right device.

use std::path::Path;

use rein_core::VecEnv;
use rein_plugin::PluginRuntime;

use crate::TrainError;
use rein_control::environments::{EnvFactory, EnvOutcome};
use rein_control::{off_policy, ppo};
use rein_posttrain::{LmOutcome, run_lm};
use rein_recipe::{Device, LoadedRecipe, OffPolicyRecipe, Plan, PpoRecipe};
use rein_run::RunDir;
use rein_run::RunError;
use rein_run::checkpoint::{Checkpoint, CheckpointDir, Checkpointing};

/// What a run reports.
#[derive(Debug, Clone)]
pub enum RunOutcome {
    /// A run on environments (PPO, SAC, TD3).
    Env(EnvOutcome),
    /// A language-model run (SFT, GRPO, DPO, a reward model).
    Lm(Box<LmOutcome>),
}

/// Trains `loaded` with plugins from `plugin_dir`. With `write_run`, the run directory goes
/// under the recipe's `train.runs_dir`, with checkpoints every `train.checkpoint_every` steps.
pub fn run(loaded: &LoadedRecipe, plugin_dir: &Path, write_run: bool) -> Result<RunOutcome, TrainError> {
    let run_dir = create_run_dir(loaded, write_run)?;
    run_in(loaded, plugin_dir, run_dir.as_ref(), None)
}

/// Continues the run in `dir` (killed, interrupted or finished) from its newest intact
/// checkpoint, or from the start when it has none. `loaded` must resolve to the recipe the run
/// was started with. The metrics logged after that checkpoint are dropped and produced again,
/// so `metrics.jsonl` ends up as an uninterrupted run's (the same seed gives the same values on
/// the CPU; only timings differ).
pub fn resume(loaded: &LoadedRecipe, plugin_dir: &Path, dir: &Path) -> Result<RunOutcome, TrainError> {
    let run_dir = RunDir::open(dir).map_err(|e| RunError::Resume {
        run: dir.to_path_buf(),
        message: e.to_string(),
    })?;
    let saved = run_dir.recipe_toml()?;
    if let Some(difference) = recipe_difference(&saved, &loaded.to_toml()) {
        return Err(RunError::Resume {
            run: dir.to_path_buf(),
            message: format!(
                "{} does not resolve to the recipe this run was started with: {difference}",
                loaded.path.display()
            ),
        }
        .into());
    }
    let (latest, skipped) = CheckpointDir::of_run(dir).latest()?;
    for bad in &skipped {
        eprintln!("warning: skipping {bad}");
    }
    // Each line formatted first and written whole: stderr is unbuffered, and a line written in
    // pieces can be cut by a kill between them.
    let line = match &latest {
        Some(c) => format!("resuming {} from {}", dir.display(), c.path.display()),
        None => format!("{} has no usable checkpoint; starting it again", dir.display()),
    };
    eprintln!("{line}");
    run_in(loaded, plugin_dir, Some(&run_dir), latest)
}

fn run_in(
    loaded: &LoadedRecipe,
    plugin_dir: &Path,
    run_dir: Option<&RunDir>,
    resume: Option<Checkpoint>,
) -> Result<RunOutcome, TrainError> {
    let checkpointing = checkpointing(loaded, run_dir, resume);
    let plan = loaded.plan()?;
    if let Some(plan) = EnvPlan::of(plan) {
        return env_in(loaded, plan, plugin_dir, run_dir, &checkpointing).map(RunOutcome::Env);
    }
    let outcome = match loaded.recipe.device {
        Device::Cpu => {
            run_lm::<rein_model::CpuAutodiff>(loaded, plan, plugin_dir, run_dir, &checkpointing, &Default::default())
        }
        #[cfg(feature = "cuda")]
        Device::Cuda => run_lm::<burn::backend::Autodiff<burn::backend::Cuda>>(
            loaded,
            plan,
            plugin_dir,
            run_dir,
            &checkpointing,
            &Default::default(),
        ),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda => return Err(no_cuda(loaded)),
    };
    Ok(RunOutcome::Lm(Box::new(outcome?)))
}

/// The first key whose value differs between two resolved recipes, described.
fn recipe_difference(saved: &str, now: &str) -> Option<String> {
    fn flatten(prefix: &str, value: &toml::Value, out: &mut std::collections::BTreeMap<String, String>) {
        match value {
            toml::Value::Table(table) => {
                for (key, v) in table {
                    let path = if prefix.is_empty() {
                        key.clone()
                    } else {
                        format!("{prefix}.{key}")
                    };
                    flatten(&path, v, out);
                }
            }
            other => {
                out.insert(prefix.to_string(), other.to_string());
            }
        }
    }
    let parse = |text: &str| {
        let mut out = std::collections::BTreeMap::new();
        match text.parse::<toml::Table>() {
            Ok(table) => flatten("", &toml::Value::Table(table), &mut out),
            Err(e) => {
                out.insert("(recipe.toml)".into(), e.to_string());
            }
        }
        out
    };
    let (saved, now) = (parse(saved), parse(now));
    let keys: std::collections::BTreeSet<&String> = saved.keys().chain(now.keys()).collect();
    keys.into_iter().find_map(|key| {
        let (a, b) = (saved.get(key), now.get(key));
        (a != b).then(|| {
            let show = |v: Option<&String>| v.map_or("(absent)".to_string(), Clone::clone);
            format!("`{key}` was {} and is now {}", show(a), show(b))
        })
    })
}

/// Trains a recipe on environments (PPO, SAC, TD3).
pub fn run_env(loaded: &LoadedRecipe, plugin_dir: &Path, write_run: bool) -> Result<EnvOutcome, TrainError> {
    let plan = EnvPlan::of(loaded.plan()?)
        .ok_or_else(|| TrainError::Unsupported(format!("{} is not a recipe on environments", loaded.name())))?;
    let run_dir = create_run_dir(loaded, write_run)?;
    let checkpointing = checkpointing(loaded, run_dir.as_ref(), None);
    env_in(loaded, plan, plugin_dir, run_dir.as_ref(), &checkpointing)
}

/// The plan of a recipe on environments, which picks its trainer.
#[derive(Clone, Copy)]
enum EnvPlan<'a> {
    Ppo(PpoRecipe<'a>),
    OffPolicy(OffPolicyRecipe<'a>),
}

impl<'a> EnvPlan<'a> {
    /// `plan`, if it trains on environments.
    fn of(plan: Plan<'a>) -> Option<Self> {
        match plan {
            Plan::Ppo(ppo) => Some(Self::Ppo(ppo)),
            Plan::OffPolicy(off_policy) => Some(Self::OffPolicy(off_policy)),
            _ => None,
        }
    }

    /// Trains it on `device`.
    fn train<B: rein_model::ReinAutodiffBackend>(
        self,
        loaded: &LoadedRecipe,
        make_env: &EnvFactory<'_>,
        device: &B::Device,
        run_dir: Option<&RunDir>,
        checkpointing: &Checkpointing,
    ) -> Result<EnvOutcome, TrainError> {
        match self {
            Self::Ppo(plan) => Ok(ppo::train::<B>(loaded, plan, make_env, device, run_dir, checkpointing)?),
            Self::OffPolicy(plan) => Ok(off_policy::train::<B>(
                loaded,
                plan,
                make_env,
                device,
                run_dir,
                checkpointing,
            )?),
        }
    }
}

/// Checkpoints into `run_dir` (none without one) every `train.checkpoint_every` steps,
/// continuing from `resume`.
fn checkpointing(loaded: &LoadedRecipe, run_dir: Option<&RunDir>, resume: Option<Checkpoint>) -> Checkpointing {
    Checkpointing {
        dir: run_dir.map(|r| CheckpointDir::of_run(r.path())),
        every: loaded.recipe.train.checkpoint_every,
        resume,
        ..Checkpointing::default()
    }
}

fn env_in(
    loaded: &LoadedRecipe,
    plan: EnvPlan<'_>,
    plugin_dir: &Path,
    run_dir: Option<&RunDir>,
    checkpointing: &Checkpointing,
) -> Result<EnvOutcome, TrainError> {
    let env = match plan {
        EnvPlan::Ppo(PpoRecipe { env, .. }) | EnvPlan::OffPolicy(OffPolicyRecipe { env, .. }) => env,
    };
    let plugin_path = loaded.env_plugin_path(plugin_dir)?;
    let runtime = PluginRuntime::default();
    let plugin = runtime.load(&plugin_path, env.limits.clone())?;
    let config = serde_json::to_string(&env.config).unwrap_or_else(|_| "{}".into());
    let make_env = |n: usize| plugin.vec_env(&config, n).map(|e| Box::new(e) as Box<dyn VecEnv>);
    match loaded.recipe.device {
        Device::Cpu => {
            plan.train::<rein_model::CpuAutodiff>(loaded, &make_env, &Default::default(), run_dir, checkpointing)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda => plan.train::<burn::backend::Autodiff<burn::backend::Cuda>>(
            loaded,
            &make_env,
            &Default::default(),
            run_dir,
            checkpointing,
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
    TrainError::Recipe(rein_recipe::RecipeError::Invalid {
        file: loaded.path.clone(),
        path: "device".into(),
        message: "this build has no CUDA support; rebuild with `--features cuda`".into(),
    })
}
