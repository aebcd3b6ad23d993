//! Environment plugins as [`Environment`]s and [`VecEnv`]s.

use rein_core::{
    Action, BatchActions, BoxSpace, EnvSpec, Environment, FailureCounts, Observation, OutputError, PluginError,
    PluginErrorKind, Space, Step, VecEnv, VecStep, validate_action, validate_batch_actions, validate_observation,
};
use wasmtime::component::ResourceAny;

use crate::bindings::environment::{self as wit, Environment as Bindings};
use crate::plugin::{Plugin, PluginKind};
use crate::sandbox::Instance;

/// A live instance with its env resource.
struct Live {
    instance: Instance<Bindings>,
    env: ResourceAny,
}

/// One environment from a plugin, owning its sandboxed instance.
///
/// After a trap the instance is discarded; the next `reset` opens a fresh one (a `step` before
/// that is an error, as the episode's state is gone).
pub struct EnvPlugin {
    plugin: Plugin,
    config: String,
    spec: EnvSpec,
    live: Option<Live>,
    failures: FailureCounts,
}

/// `num_envs` environments stepped in one call to one sandboxed instance.
pub struct VecEnvPlugin {
    plugin: Plugin,
    config: String,
    num_envs: usize,
    spec: EnvSpec,
    obs_dim: usize,
    live: Option<Live>,
    failures: FailureCounts,
}

impl std::fmt::Debug for EnvPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvPlugin")
            .field("plugin", &self.plugin.name())
            .field("spec", &self.spec)
            .finish()
    }
}

impl std::fmt::Debug for VecEnvPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VecEnvPlugin")
            .field("plugin", &self.plugin.name())
            .field("num_envs", &self.num_envs)
            .field("spec", &self.spec)
            .finish()
    }
}

impl Plugin {
    /// Opens one environment with its config (a JSON object as text).
    pub fn environment(&self, config: &str) -> Result<EnvPlugin, PluginError> {
        let (live, spec) = self.open(config, None)?;
        Ok(EnvPlugin {
            plugin: self.clone(),
            config: config.into(),
            spec,
            live: Some(live),
            failures: FailureCounts::default(),
        })
    }

    /// Opens `num_envs` environments stepped together (vector observations only).
    pub fn vec_env(&self, config: &str, num_envs: usize) -> Result<VecEnvPlugin, PluginError> {
        let (live, spec) = self.open(config, Some(num_envs))?;
        let obs_dim = match &spec.observation {
            Space::Text => {
                let reason = "a batched env needs vector observations, this one observes text".into();
                return Err(PluginError::new(
                    self.name(),
                    Some("open"),
                    PluginErrorKind::Host { reason },
                ));
            }
            space => space.flat_dim(),
        };
        Ok(VecEnvPlugin {
            plugin: self.clone(),
            config: config.into(),
            num_envs,
            spec,
            obs_dim,
            live: Some(live),
            failures: FailureCounts::default(),
        })
    }

    /// A fresh instance with an opened env (single, or batched with `num_envs`) and its spec.
    fn open(&self, config: &str, num_envs: Option<usize>) -> Result<(Live, EnvSpec), PluginError> {
        if self.kind() != PluginKind::Environment {
            return Err(self.wrong_kind(PluginKind::Environment));
        }
        let (name, limits) = (self.name(), self.limits());
        let mut instance = self.instantiate_environment()?;
        let n = match num_envs.map(u32::try_from) {
            Some(Ok(0)) | Some(Err(_)) => {
                let reason = format!("num_envs must be between 1 and {}", u32::MAX);
                return Err(PluginError::new(name, Some("open"), PluginErrorKind::Host { reason }));
            }
            Some(Ok(n)) => Some(n),
            None => None,
        };
        let env = instance.call(name, "open", limits, |store, b| {
            let api = b.rein_plugin_environment_api();
            let opened = match n {
                Some(n) => api.vec_env().call_open(store, config, n)?,
                None => api.env().call_open(store, config)?,
            };
            Ok(opened.map_err(|e| e.message))
        })?;
        let spec = instance.call(name, "spec", limits, |store, b| {
            let api = b.rein_plugin_environment_api();
            let spec = match n {
                Some(_) => api.vec_env().call_spec(store, env)?,
                None => api.env().call_spec(store, env)?,
            };
            Ok(Ok(spec))
        })?;
        let spec = EnvSpec {
            observation: space(spec.observation),
            action: space(spec.action),
        };
        for (what, space) in [("observation", &spec.observation), ("action", &spec.action)] {
            space.validate().map_err(|reason| {
                let reason = OutputError::SpaceMismatch {
                    what: format!("{what} space"),
                    space: space.to_string(),
                    reason,
                };
                PluginError::new(name, Some("spec"), reason.into())
            })?;
        }
        Ok((Live { instance, env }, spec))
    }
}

fn space(space: wit::Space) -> Space {
    match space {
        wit::Space::Box(b) => Space::Box(BoxSpace {
            low: b.low,
            high: b.high,
        }),
        wit::Space::Discrete(n) => Space::Discrete(n),
        wit::Space::Text => Space::Text,
    }
}

fn observation(obs: wit::Observation) -> Observation {
    match obs {
        wit::Observation::Vector(v) => Observation::Vector(v),
        wit::Observation::Text(t) => Observation::Text(t),
    }
}

fn invalid(plugin: &Plugin, call: &'static str, reason: OutputError) -> PluginError {
    PluginError::new(plugin.name(), Some(call), reason.into())
}

/// Runs `call` on the live instance, discarding it on a trap.
fn call_live<R>(
    plugin: &Plugin,
    live: &mut Option<Live>,
    call: &'static str,
    f: impl FnOnce(
        &mut wasmtime::Store<crate::sandbox::HostState>,
        &Bindings,
        ResourceAny,
    ) -> wasmtime::Result<Result<R, String>>,
) -> Result<R, PluginError> {
    let Some(Live { instance, env }) = live.as_mut() else {
        let reason = "the environment was discarded after a trap; call reset to start a new episode".into();
        return Err(PluginError::new(
            plugin.name(),
            Some(call),
            PluginErrorKind::Host { reason },
        ));
    };
    let env = *env;
    let result = instance.call(plugin.name(), call, plugin.limits(), |store, b| f(store, b, env));
    if result.as_ref().is_err_and(PluginError::is_trap) {
        *live = None;
    }
    result
}

impl EnvPlugin {
    /// The plugin this environment runs.
    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }
}

impl Environment for EnvPlugin {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<Observation, PluginError> {
        let result = self.try_reset(seed);
        self.failures.count(result)
    }

    fn step(&mut self, action: &Action) -> Result<Step, PluginError> {
        let result = self.try_step(action);
        self.failures.count(result)
    }

    fn failures(&self) -> FailureCounts {
        self.failures
    }
}

impl EnvPlugin {
    fn try_reset(&mut self, seed: Option<u64>) -> Result<Observation, PluginError> {
        if self.live.is_none() {
            self.live = Some(self.plugin.open(&self.config, None)?.0);
        }
        let obs = call_live(&self.plugin, &mut self.live, "reset", |store, b, env| {
            Ok(b.rein_plugin_environment_api()
                .env()
                .call_reset(store, env, seed)?
                .map_err(|e| e.message))
        })?;
        let obs = observation(obs);
        validate_observation(&self.spec.observation, &obs, "observation")
            .map_err(|e| invalid(&self.plugin, "reset", e))?;
        Ok(obs)
    }

    fn try_step(&mut self, action: &Action) -> Result<Step, PluginError> {
        validate_action(&self.spec.action, action).map_err(|e| {
            PluginError::new(
                self.plugin.name(),
                Some("step"),
                PluginErrorKind::Host { reason: e.to_string() },
            )
        })?;
        let action = match action {
            Action::Discrete(a) => wit::Action::Discrete(*a),
            Action::Continuous(v) => wit::Action::Continuous(v.clone()),
            Action::Text(t) => wit::Action::Text(t.clone()),
        };
        let step = call_live(&self.plugin, &mut self.live, "step", |store, b, env| {
            Ok(b.rein_plugin_environment_api()
                .env()
                .call_step(store, env, &action)?
                .map_err(|e| e.message))
        })?;
        let step = Step {
            observation: observation(step.observation),
            reward: step.reward,
            terminated: step.terminated,
            truncated: step.truncated,
        };
        validate_observation(&self.spec.observation, &step.observation, "observation")
            .map_err(|e| invalid(&self.plugin, "step", e))?;
        if !step.reward.is_finite() {
            let e = OutputError::NonFinite {
                what: "reward".into(),
                value: step.reward,
            };
            return Err(invalid(&self.plugin, "step", e));
        }
        Ok(step)
    }
}

impl VecEnvPlugin {
    /// The plugin these environments run.
    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    fn check_step(&self, step: &wit::BatchStep) -> Result<(), OutputError> {
        let n = self.num_envs;
        let ended = step
            .terminated
            .iter()
            .zip(&step.truncated)
            .filter(|(a, b)| **a || **b)
            .count();
        let lengths = [
            ("observations", step.observations.len(), n * self.obs_dim),
            ("rewards", step.rewards.len(), n),
            ("terminated flags", step.terminated.len(), n),
            ("truncated flags", step.truncated.len(), n),
            (
                "final observation values",
                step.final_observations.len(),
                ended * self.obs_dim,
            ),
        ];
        for (what, got, expected) in lengths {
            if got != expected {
                return Err(OutputError::WrongLength {
                    what: what.into(),
                    expected,
                    got,
                });
            }
        }
        let bad_obs = step
            .observations
            .iter()
            .chain(&step.final_observations)
            .position(|x| !x.is_finite());
        if let Some(i) = bad_obs {
            let (what, value) = if i < step.observations.len() {
                (
                    format!(
                        "observation value {} of env {}",
                        i % self.obs_dim.max(1),
                        i / self.obs_dim.max(1)
                    ),
                    step.observations[i],
                )
            } else {
                (
                    "final observation value".to_string(),
                    step.final_observations[i - step.observations.len()],
                )
            };
            return Err(OutputError::NonFinite {
                what,
                value: value as f64,
            });
        }
        if let Some(i) = step.rewards.iter().position(|r| !r.is_finite()) {
            return Err(OutputError::NonFinite {
                what: format!("reward of env {i}"),
                value: step.rewards[i],
            });
        }
        Ok(())
    }
}

impl VecEnv for VecEnvPlugin {
    fn num_envs(&self) -> usize {
        self.num_envs
    }

    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: u64) -> Result<Vec<f32>, PluginError> {
        let result = self.try_reset(seed);
        self.failures.count(result)
    }

    fn step(&mut self, actions: &BatchActions) -> Result<VecStep, PluginError> {
        let result = self.try_step(actions);
        self.failures.count(result)
    }

    fn failures(&self) -> FailureCounts {
        self.failures
    }
}

impl VecEnvPlugin {
    fn try_reset(&mut self, seed: u64) -> Result<Vec<f32>, PluginError> {
        if self.live.is_none() {
            self.live = Some(self.plugin.open(&self.config, Some(self.num_envs))?.0);
        }
        let obs = call_live(&self.plugin, &mut self.live, "reset", |store, b, env| {
            Ok(b.rein_plugin_environment_api()
                .vec_env()
                .call_reset(store, env, seed)?
                .map_err(|e| e.message))
        })?;
        let expected = self.num_envs * self.obs_dim;
        if obs.len() != expected {
            let e = OutputError::WrongLength {
                what: "observations".into(),
                expected,
                got: obs.len(),
            };
            return Err(invalid(&self.plugin, "reset", e));
        }
        if let Some(i) = obs.iter().position(|x| !x.is_finite()) {
            let e = OutputError::NonFinite {
                what: format!("observation value {i}"),
                value: obs[i] as f64,
            };
            return Err(invalid(&self.plugin, "reset", e));
        }
        Ok(obs)
    }

    fn try_step(&mut self, actions: &BatchActions) -> Result<VecStep, PluginError> {
        validate_batch_actions(&self.spec.action, self.num_envs, actions).map_err(|e| {
            PluginError::new(
                self.plugin.name(),
                Some("step"),
                PluginErrorKind::Host { reason: e.to_string() },
            )
        })?;
        let actions = match actions {
            BatchActions::Discrete(a) => wit::BatchActions::Discrete(a.clone()),
            BatchActions::Continuous(v) => wit::BatchActions::Continuous(v.clone()),
        };
        let step = call_live(&self.plugin, &mut self.live, "step", |store, b, env| {
            Ok(b.rein_plugin_environment_api()
                .vec_env()
                .call_step(store, env, &actions)?
                .map_err(|e| e.message))
        })?;
        self.check_step(&step).map_err(|e| invalid(&self.plugin, "step", e))?;
        Ok(VecStep {
            observations: step.observations,
            rewards: step.rewards,
            terminated: step.terminated,
            truncated: step.truncated,
            final_observations: step.final_observations,
        })
    }
}
