//! The environment world: the [`Environment`] trait and its single and batched adapters.

use std::cell::RefCell;

use crate::__private::environment::exports::rein::plugin::environment_api as wit;
use crate::__private::reward::rein::plugin::types::{PluginError, PluginMetadata as WitMetadata};
use crate::config::Config;
use crate::metadata::Metadata;

/// An observation or action space.
#[derive(Debug, Clone, PartialEq)]
pub enum Space {
    /// A vector of `f32`, one `(low, high)` bound pair per dimension.
    Box {
        /// Lower bounds.
        low: Vec<f32>,
        /// Upper bounds.
        high: Vec<f32>,
    },
    /// One of `n` choices.
    Discrete(u32),
    /// Free text.
    Text,
}

impl Space {
    fn to_wit(&self) -> wit::Space {
        match self {
            Space::Box { low, high } => wit::Space::Box(wit::BoxSpace {
                low: low.clone(),
                high: high.clone(),
            }),
            Space::Discrete(n) => wit::Space::Discrete(*n),
            Space::Text => wit::Space::Text,
        }
    }

    fn dim(&self) -> usize {
        match self {
            Space::Box { low, .. } => low.len(),
            Space::Discrete(_) => 1,
            Space::Text => 0,
        }
    }
}

/// Observation and action spaces.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvSpec {
    /// What the environment observes.
    pub observation: Space,
    /// What it accepts.
    pub action: Space,
}

/// One observation.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// For box spaces.
    Vector(Vec<f32>),
    /// For text spaces.
    Text(String),
}

/// One action, borrowed from the host's batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Action<'a> {
    /// An index for a discrete space.
    Discrete(u32),
    /// A vector for a box space.
    Continuous(&'a [f32]),
    /// Text for a text space.
    Text(&'a str),
}

/// What a step reports besides the observation (Gymnasium's flags).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transition {
    /// The reward for this step.
    pub reward: f64,
    /// The MDP reached a terminal state.
    pub terminated: bool,
    /// The episode was cut short (time limit).
    pub truncated: bool,
}

/// An environment with Gymnasium's semantics. The PDK runs it alone (`env`) or as a batch
/// (`vec-env`, auto-resetting ended episodes), and refuses `step` after an episode ended until
/// `reset`.
pub trait Environment: Sized + 'static {
    /// Name, version, description and accepted config keys.
    const METADATA: Metadata;

    /// Builds the environment from its config (unknown keys were already rejected).
    fn new(config: &Config) -> Result<Self, String>;

    /// Observation and action spaces.
    fn spec(&self) -> EnvSpec;

    /// Starts a new episode; `Some(seed)` reseeds the generator, `None` continues it.
    fn reset(&mut self, seed: Option<u64>);

    /// Applies `action` (already checked against the action space).
    fn step(&mut self, action: Action<'_>) -> Result<Transition, String>;

    /// The current observation.
    fn observation(&self) -> Observation;

    /// Appends the current observation to `out` (vector observations). Override it to skip
    /// the allocation of [`Environment::observation`] on the batched hot path.
    fn write_observation(&self, out: &mut Vec<f32>) {
        if let Observation::Vector(v) = self.observation() {
            out.extend_from_slice(&v);
        }
    }
}

fn error(message: impl Into<String>) -> PluginError {
    PluginError {
        message: message.into(),
    }
}

fn build<E: Environment>(config: &str) -> Result<E, PluginError> {
    let config = Config::parse(config, &E::METADATA).map_err(error)?;
    E::new(&config).map_err(error)
}

fn check_action(space: &Space, action: &Action<'_>) -> Result<(), String> {
    match (space, action) {
        (Space::Discrete(n), Action::Discrete(a)) if a < n => Ok(()),
        (Space::Box { low, .. }, Action::Continuous(v)) if v.len() == low.len() => Ok(()),
        (Space::Text, Action::Text(_)) => Ok(()),
        _ => Err(format!("action {action:?} does not fit the action space {space:?}")),
    }
}

/// One environment behind the `env` resource.
#[doc(hidden)]
pub struct SingleEnv<E> {
    state: RefCell<EpisodeState<E>>,
    spec: EnvSpec,
}

struct EpisodeState<E> {
    env: E,
    /// `false` before the first reset and after an episode ended.
    running: bool,
}

impl<E: Environment> wit::Guest for SingleEnv<E> {
    type Env = Self;
    type VecEnv = BatchEnv<E>;

    fn metadata() -> WitMetadata {
        E::METADATA.to_wit()
    }
}

impl<E: Environment> wit::GuestEnv for SingleEnv<E> {
    fn open(config: String) -> Result<wit::Env, PluginError> {
        let env = build::<E>(&config)?;
        let spec = env.spec();
        Ok(wit::Env::new(SingleEnv {
            state: RefCell::new(EpisodeState { env, running: false }),
            spec,
        }))
    }

    fn spec(&self) -> wit::EnvSpec {
        wit::EnvSpec {
            observation: self.spec.observation.to_wit(),
            action: self.spec.action.to_wit(),
        }
    }

    fn reset(&self, seed: Option<u64>) -> Result<wit::Observation, PluginError> {
        let mut state = self.state.borrow_mut();
        state.env.reset(seed);
        state.running = true;
        Ok(observation_to_wit(state.env.observation()))
    }

    fn step(&self, action: wit::Action) -> Result<wit::StepResult, PluginError> {
        let mut state = self.state.borrow_mut();
        if !state.running {
            return Err(error(
                "`step` called before `reset` or after the episode ended; call `reset`",
            ));
        }
        let action = match &action {
            wit::Action::Discrete(a) => Action::Discrete(*a),
            wit::Action::Continuous(v) => Action::Continuous(v),
            wit::Action::Text(t) => Action::Text(t),
        };
        check_action(&self.spec.action, &action).map_err(error)?;
        let t = state.env.step(action).map_err(error)?;
        state.running = !(t.terminated || t.truncated);
        Ok(wit::StepResult {
            observation: observation_to_wit(state.env.observation()),
            reward: t.reward,
            terminated: t.terminated,
            truncated: t.truncated,
        })
    }
}

fn observation_to_wit(obs: Observation) -> wit::Observation {
    match obs {
        Observation::Vector(v) => wit::Observation::Vector(v),
        Observation::Text(t) => wit::Observation::Text(t),
    }
}

/// `num-envs` environments behind the `vec-env` resource, with same-step auto-reset.
#[doc(hidden)]
pub struct BatchEnv<E> {
    envs: RefCell<Vec<E>>,
    spec: EnvSpec,
    started: std::cell::Cell<bool>,
}

impl<E: Environment> wit::GuestVecEnv for BatchEnv<E> {
    fn open(config: String, num_envs: u32) -> Result<wit::VecEnv, PluginError> {
        let envs = (0..num_envs)
            .map(|_| build::<E>(&config))
            .collect::<Result<Vec<E>, _>>()?;
        let Some(first) = envs.first() else {
            return Err(error("num-envs must be at least 1"));
        };
        let spec = first.spec();
        if spec.observation == Space::Text {
            return Err(error("a batched environment needs vector observations"));
        }
        Ok(wit::VecEnv::new(BatchEnv {
            envs: RefCell::new(envs),
            spec,
            started: false.into(),
        }))
    }

    fn spec(&self) -> wit::EnvSpec {
        wit::EnvSpec {
            observation: self.spec.observation.to_wit(),
            action: self.spec.action.to_wit(),
        }
    }

    fn reset(&self, seed: u64) -> Result<Vec<f32>, PluginError> {
        let mut envs = self.envs.borrow_mut();
        let mut observations = Vec::with_capacity(envs.len() * self.spec.observation.dim());
        for (i, env) in envs.iter_mut().enumerate() {
            env.reset(Some(seed.wrapping_add(i as u64)));
            env.write_observation(&mut observations);
        }
        self.started.set(true);
        Ok(observations)
    }

    fn step(&self, actions: wit::BatchActions) -> Result<wit::BatchStep, PluginError> {
        if !self.started.get() {
            return Err(error("`step` called before `reset`"));
        }
        let mut envs = self.envs.borrow_mut();
        let n = envs.len();
        let action_dim = self.spec.action.dim();
        let action = |i: usize| -> Result<Action<'_>, PluginError> {
            let action = match &actions {
                wit::BatchActions::Discrete(a) if a.len() == n => Action::Discrete(a[i]),
                wit::BatchActions::Continuous(v) if v.len() == n * action_dim => {
                    Action::Continuous(&v[i * action_dim..(i + 1) * action_dim])
                }
                _ => return Err(error(format!("expected one action per env for {n} envs"))),
            };
            check_action(&self.spec.action, &action).map_err(|e| error(format!("env {i}: {e}")))?;
            Ok(action)
        };
        let obs_dim = self.spec.observation.dim();
        let mut out = wit::BatchStep {
            observations: Vec::with_capacity(n * obs_dim),
            rewards: Vec::with_capacity(n),
            terminated: Vec::with_capacity(n),
            truncated: Vec::with_capacity(n),
            final_observations: Vec::new(),
        };
        for (i, env) in envs.iter_mut().enumerate() {
            let t = env.step(action(i)?).map_err(|e| error(format!("env {i}: {e}")))?;
            if t.terminated || t.truncated {
                env.write_observation(&mut out.final_observations);
                env.reset(None);
            }
            env.write_observation(&mut out.observations);
            out.rewards.push(t.reward);
            out.terminated.push(t.terminated);
            out.truncated.push(t.truncated);
        }
        Ok(out)
    }
}
