//! `rein_sandbox._native`: rein's plugin sandbox for Python.
//!
//! This crate owns the Python boundary only: it loads plugins through [`rein_plugin`] and turns
//! their results and errors into Python values and exceptions. It must not grow scoring or
//! environment logic of its own (that lives in the plugins and in `rein-plugin`), and it leaves
//! the Python-facing conveniences (built-in plugin names, TRL/verl adapters, Gymnasium spaces)
//! to the pure-Python package in `python/rein_sandbox/`.
//!
//! Every call into a plugin releases the GIL: other Python threads run while a plugin scores,
//! and a plugin that hangs is stopped by its own deadline (wasmtime epoch interruption from the
//! sandbox's ticker thread), whichever thread called it.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use rein_core::{Action, BatchActions, EnvSpec, Environment, Group, Observation, RewardFn, Space, VecEnv};
use rein_plugin::{EnvPlugin, Plugin, PluginRuntime, RewardPlugin, SandboxLimits, VecEnvPlugin};

create_exception!(
    rein_sandbox,
    PluginError,
    PyException,
    "A plugin failed: it trapped, ran past a sandbox limit, returned an invalid result or refused \
     its input. The message names the plugin and, for a limit, the limit."
);

/// One runtime per process: its engines, compiled-component cache and epoch ticker are shared
/// by every plugin loaded from Python.
fn runtime() -> &'static PluginRuntime {
    static RUNTIME: OnceLock<PluginRuntime> = OnceLock::new();
    RUNTIME.get_or_init(PluginRuntime::default)
}

fn plugin_error(error: rein_core::PluginError) -> PyErr {
    PluginError::new_err(error.to_string())
}

/// The sandbox limits a constructor was given; unset ones keep rein's defaults.
fn limits(
    timeout_ms: Option<u64>,
    memory_mib: Option<u64>,
    fuel: Option<u64>,
    stack_kib: Option<u64>,
) -> PyResult<SandboxLimits> {
    let defaults = SandboxLimits::default();
    let limits = SandboxLimits {
        timeout_ms: timeout_ms.unwrap_or(defaults.timeout_ms),
        memory_mib: memory_mib.unwrap_or(defaults.memory_mib),
        stack_kib: stack_kib.unwrap_or(defaults.stack_kib),
        fuel: fuel.or(defaults.fuel),
        ..defaults
    };
    limits.validate().map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(limits)
}

fn load(py: Python<'_>, path: &PathBuf, limits: SandboxLimits) -> PyResult<Plugin> {
    py.detach(|| runtime().load(path, limits)).map_err(plugin_error)
}

/// A lock that a panic elsewhere cannot poison for good: plugins' own failures are values, so
/// the guarded state is never left half-updated.
fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A reward plugin with its config: groups of completions in, one score per completion out.
#[pyclass(module = "rein_sandbox._native", frozen)]
struct Reward {
    name: String,
    inner: Mutex<RewardPlugin>,
}

#[pymethods]
impl Reward {
    #[new]
    #[pyo3(signature = (path, config = "{}", *, timeout_ms = None, memory_mib = None, fuel = None, stack_kib = None))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        config: &str,
        timeout_ms: Option<u64>,
        memory_mib: Option<u64>,
        fuel: Option<u64>,
        stack_kib: Option<u64>,
    ) -> PyResult<Self> {
        let plugin = load(py, &path, limits(timeout_ms, memory_mib, fuel, stack_kib)?)?;
        let reward = py.detach(|| plugin.reward(config)).map_err(plugin_error)?;
        Ok(Reward {
            name: plugin.name().to_string(),
            inner: Mutex::new(reward),
        })
    }

    /// The plugin's name, from its metadata.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Scores groups given as JSON (`[{"prompt", "completions", "reference"?, "metadata"?}]`);
    /// returns JSON, one list per group of `{"score", "components"}`.
    fn score_json(&self, py: Python<'_>, groups: &str) -> PyResult<String> {
        let groups: Vec<Group> = serde_json::from_str(groups).map_err(|e| {
            PyValueError::new_err(format!(
                "not a list of groups ({{\"prompt\", \"completions\", \"reference\"?, \"metadata\"?}}): {e}"
            ))
        })?;
        let scores = py.detach(|| locked(&self.inner).score(&groups)).map_err(plugin_error)?;
        serde_json::to_string(&scores).map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// The tail of what the plugin printed.
    fn stdout(&self) -> String {
        locked(&self.inner).stdout()
    }
}

/// A space as Python reads it: `("box", 0, low, high)` or `("discrete", n, [], [])` (`"text"`
/// for text spaces, which Gymnasium environments do not use).
type SpaceParts = (&'static str, u32, Vec<f32>, Vec<f32>);

fn space_parts(space: &Space) -> SpaceParts {
    match space {
        Space::Box(b) => ("box", 0, b.low.clone(), b.high.clone()),
        Space::Discrete(n) => ("discrete", *n, Vec::new(), Vec::new()),
        Space::Text => ("text", 0, Vec::new(), Vec::new()),
    }
}

fn vector(observation: Observation) -> PyResult<Vec<f32>> {
    match observation {
        Observation::Vector(v) => Ok(v),
        Observation::Text(_) => Err(PyValueError::new_err("a text observation: not a Gymnasium environment")),
    }
}

/// One environment plugin (Gymnasium's `Env` semantics; the Python package wraps it in one).
#[pyclass(module = "rein_sandbox._native", frozen)]
struct Env {
    spec: EnvSpec,
    inner: Mutex<EnvPlugin>,
}

#[pymethods]
impl Env {
    #[new]
    #[pyo3(signature = (path, config = "{}", *, timeout_ms = None, memory_mib = None, fuel = None, stack_kib = None))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        config: &str,
        timeout_ms: Option<u64>,
        memory_mib: Option<u64>,
        fuel: Option<u64>,
        stack_kib: Option<u64>,
    ) -> PyResult<Self> {
        let plugin = load(py, &path, limits(timeout_ms, memory_mib, fuel, stack_kib)?)?;
        let env = py.detach(|| plugin.environment(config)).map_err(plugin_error)?;
        Ok(Env {
            spec: env.spec().clone(),
            inner: Mutex::new(env),
        })
    }

    fn observation_space(&self) -> SpaceParts {
        space_parts(&self.spec.observation)
    }

    fn action_space(&self) -> SpaceParts {
        space_parts(&self.spec.action)
    }

    /// Starts an episode; `None` continues the environment's generator.
    #[pyo3(signature = (seed = None))]
    fn reset(&self, py: Python<'_>, seed: Option<u64>) -> PyResult<Vec<f32>> {
        let observation = py.detach(|| locked(&self.inner).reset(seed)).map_err(plugin_error)?;
        vector(observation)
    }

    /// One step with an index action: `(observation, reward, terminated, truncated)`.
    fn step_discrete(&self, py: Python<'_>, action: u32) -> PyResult<(Vec<f32>, f64, bool, bool)> {
        self.step(py, Action::Discrete(action))
    }

    /// One step with a vector action: `(observation, reward, terminated, truncated)`.
    fn step_continuous(&self, py: Python<'_>, action: Vec<f32>) -> PyResult<(Vec<f32>, f64, bool, bool)> {
        self.step(py, Action::Continuous(action))
    }
}

impl Env {
    fn step(&self, py: Python<'_>, action: Action) -> PyResult<(Vec<f32>, f64, bool, bool)> {
        let step = py.detach(|| locked(&self.inner).step(&action)).map_err(plugin_error)?;
        Ok((vector(step.observation)?, step.reward, step.terminated, step.truncated))
    }
}

/// What one step of a vector environment returns to Python: observations (flat, `[n × dim]`),
/// rewards, terminated, truncated and the ended episodes' last observations (flat).
type VecStepParts = (Vec<f32>, Vec<f64>, Vec<bool>, Vec<bool>, Vec<f32>);

/// N copies of one environment plugin stepped together, resetting each within the step its
/// episode ends (Gymnasium's same-step autoreset).
#[pyclass(module = "rein_sandbox._native", frozen)]
struct VectorEnv {
    spec: EnvSpec,
    num_envs: usize,
    inner: Mutex<VecEnvPlugin>,
}

#[pymethods]
impl VectorEnv {
    #[new]
    #[pyo3(signature = (path, num_envs, config = "{}", *, timeout_ms = None, memory_mib = None, fuel = None, stack_kib = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        num_envs: usize,
        config: &str,
        timeout_ms: Option<u64>,
        memory_mib: Option<u64>,
        fuel: Option<u64>,
        stack_kib: Option<u64>,
    ) -> PyResult<Self> {
        let plugin = load(py, &path, limits(timeout_ms, memory_mib, fuel, stack_kib)?)?;
        let env = py.detach(|| plugin.vec_env(config, num_envs)).map_err(plugin_error)?;
        Ok(VectorEnv {
            spec: env.spec().clone(),
            num_envs,
            inner: Mutex::new(env),
        })
    }

    #[getter]
    fn num_envs(&self) -> usize {
        self.num_envs
    }

    fn observation_space(&self) -> SpaceParts {
        space_parts(&self.spec.observation)
    }

    fn action_space(&self) -> SpaceParts {
        space_parts(&self.spec.action)
    }

    /// Resets every environment, environment `i` with seed `seed + i`; flat observations.
    fn reset(&self, py: Python<'_>, seed: u64) -> PyResult<Vec<f32>> {
        py.detach(|| locked(&self.inner).reset(seed)).map_err(plugin_error)
    }

    /// One step with one index per environment.
    fn step_discrete(&self, py: Python<'_>, actions: Vec<u32>) -> PyResult<VecStepParts> {
        self.step(py, BatchActions::Discrete(actions))
    }

    /// One step with `num_envs × action_dim` values, row-major.
    fn step_continuous(&self, py: Python<'_>, actions: Vec<f32>) -> PyResult<VecStepParts> {
        self.step(py, BatchActions::Continuous(actions))
    }
}

impl VectorEnv {
    fn step(&self, py: Python<'_>, actions: BatchActions) -> PyResult<VecStepParts> {
        let step = py.detach(|| locked(&self.inner).step(&actions)).map_err(plugin_error)?;
        Ok((
            step.observations,
            step.rewards,
            step.terminated,
            step.truncated,
            step.final_observations,
        ))
    }
}

/// The module `rein_sandbox._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Reward>()?;
    m.add_class::<Env>()?;
    m.add_class::<VectorEnv>()?;
    m.add("PluginError", m.py().get_type::<PluginError>())?;
    m.add("INTERFACE_VERSION", rein_plugin::INTERFACE_VERSION)?;
    Ok(())
}
