//! Environments: Gymnasium's `reset` / `step` contract, single and batched.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{OutputError, PluginError};

/// A box of `f32`s: one lower and one upper bound per dimension (bounds may be infinite).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BoxSpace {
    /// Lower bounds, one per dimension.
    pub low: Vec<f32>,
    /// Upper bounds, one per dimension.
    pub high: Vec<f32>,
}

impl BoxSpace {
    /// Number of dimensions.
    pub fn dim(&self) -> usize {
        self.low.len()
    }
}

/// An observation or action space.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Space {
    /// A vector of `f32` within bounds.
    Box(BoxSpace),
    /// One of `n` choices, `0..n`.
    Discrete(u32),
    /// Free text.
    Text,
}

impl Space {
    /// Length of the flat `f32` vector that represents one value of this space: the box's
    /// dimension, 1 for discrete (as an index), 0 for text.
    pub fn flat_dim(&self) -> usize {
        match self {
            Space::Box(b) => b.dim(),
            Space::Discrete(_) => 1,
            Space::Text => 0,
        }
    }

    /// Checks the space itself: bounds of equal length, `low <= high`, no NaN, `n > 0`.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Space::Box(b) if b.low.len() != b.high.len() => Err(format!(
                "box has {} lower and {} upper bounds",
                b.low.len(),
                b.high.len()
            )),
            Space::Box(b) => match b
                .low
                .iter()
                .zip(&b.high)
                .position(|(l, h)| l.partial_cmp(h).is_none_or(|o| o.is_gt()))
            {
                Some(i) => Err(format!(
                    "box bound {i} is invalid: low {} > high {}",
                    b.low[i], b.high[i]
                )),
                None => Ok(()),
            },
            Space::Discrete(0) => Err("discrete space has no choices".into()),
            Space::Discrete(_) | Space::Text => Ok(()),
        }
    }
}

impl fmt::Display for Space {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Space::Box(b) => write!(f, "Box(shape=[{}])", b.dim()),
            Space::Discrete(n) => write!(f, "Discrete({n})"),
            Space::Text => write!(f, "Text"),
        }
    }
}

/// What an environment observes and accepts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvSpec {
    /// The observation space.
    pub observation: Space,
    /// The action space.
    pub action: Space,
}

/// One observation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Observation {
    /// For [`Space::Box`] (and discrete observations, as a one-element vector).
    Vector(Vec<f32>),
    /// For [`Space::Text`].
    Text(String),
}

/// One action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// An index into a [`Space::Discrete`].
    Discrete(u32),
    /// A vector in a [`Space::Box`].
    Continuous(Vec<f32>),
    /// Text for a [`Space::Text`].
    Text(String),
}

/// The result of one `step`, with Gymnasium's meaning of the two flags.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// The observation after the action.
    pub observation: Observation,
    /// The reward for the transition.
    pub reward: f64,
    /// The MDP reached a terminal state: do not bootstrap from `observation`.
    pub terminated: bool,
    /// The episode was cut short (time limit): bootstrap from `observation`.
    pub truncated: bool,
}

/// A single environment (Gymnasium's `Env`).
///
/// `step` after an episode ended (or before the first `reset`) is an error; call `reset`.
pub trait Environment: Send {
    /// Observation and action spaces.
    fn spec(&self) -> &EnvSpec;
    /// Starts a new episode. `Some(seed)` reseeds the environment's generator; `None` continues
    /// it, as in Gymnasium.
    fn reset(&mut self, seed: Option<u64>) -> Result<Observation, PluginError>;
    /// Applies one action.
    fn step(&mut self, action: &Action) -> Result<Step, PluginError>;

    /// How many calls have failed so far, by kind.
    fn failures(&self) -> crate::FailureCounts {
        crate::FailureCounts::default()
    }
}

/// One action per environment of a [`VecEnv`].
#[derive(Debug, Clone, PartialEq)]
pub enum BatchActions {
    /// One index per environment.
    Discrete(Vec<u32>),
    /// `num_envs × action_dim` values, row-major.
    Continuous(Vec<f32>),
}

/// The result of stepping all environments of a [`VecEnv`] once.
///
/// # Shapes
/// - `observations`: `[num_envs, obs_dim]`, row-major
/// - `rewards`, `terminated`, `truncated`: `[num_envs]`
/// - `final_observations`: `[num_ended, obs_dim]`, one row per env with `terminated || truncated`,
///   in env order
#[derive(Debug, Clone, PartialEq, Default)]
pub struct VecStep {
    /// Each env's next observation. For an env whose episode ended on this step it is the first
    /// observation of its next episode (auto-reset, see [`VecEnv`]).
    pub observations: Vec<f32>,
    /// Each env's reward for this step.
    pub rewards: Vec<f64>,
    /// Each env reached a terminal state on this step.
    pub terminated: Vec<bool>,
    /// Each env's episode was truncated on this step.
    pub truncated: Vec<bool>,
    /// The last observation of each episode that ended on this step (needed to bootstrap
    /// truncated episodes).
    pub final_observations: Vec<f32>,
}

impl VecStep {
    /// The last observation of each episode that ended on this step: `(env index, observation)`.
    pub fn final_observations(&self, obs_dim: usize) -> impl Iterator<Item = (usize, &[f32])> {
        let ended = (0..self.terminated.len()).filter(|&i| self.terminated[i] || self.truncated[i]);
        ended.zip(self.final_observations.chunks_exact(obs_dim.max(1)))
    }
}

/// N environments of one kind stepped together (Gymnasium's `VectorEnv`), observations flat.
///
/// **Auto-reset** ("same-step", as Stable-Baselines3 and Gymnasium's `AutoresetMode.SAME_STEP`):
/// when an env's episode ends on a step, the env is reset within that same step. The step reports
/// the ended episode's reward and flags, `observations` holds the new episode's first observation,
/// and `final_observations` holds the ended episode's last one. No step is ever wasted on a reset.
/// Env `i` is seeded with `seed + i` by [`VecEnv::reset`]; later auto-resets continue each env's
/// own generator.
pub trait VecEnv: Send {
    /// Number of environments.
    fn num_envs(&self) -> usize;
    /// Observation and action spaces (the same for every env).
    fn spec(&self) -> &EnvSpec;
    /// Resets every env, env `i` with seed `seed + i`. Returns `[num_envs, obs_dim]`.
    fn reset(&mut self, seed: u64) -> Result<Vec<f32>, PluginError>;
    /// Steps every env once with its action.
    fn step(&mut self, actions: &BatchActions) -> Result<VecStep, PluginError>;

    /// How many calls have failed so far, by kind.
    fn failures(&self) -> crate::FailureCounts {
        crate::FailureCounts::default()
    }
}

/// Checks an observation against its space: right variant, right length, finite.
pub fn validate_observation(space: &Space, obs: &Observation, what: &str) -> Result<(), OutputError> {
    let mismatch = |reason: String| OutputError::SpaceMismatch {
        what: what.into(),
        space: space.to_string(),
        reason,
    };
    match (space, obs) {
        (Space::Text, Observation::Text(_)) => Ok(()),
        (Space::Box(_) | Space::Discrete(_), Observation::Vector(v)) => {
            if v.len() != space.flat_dim() {
                return Err(mismatch(format!("{} values, expected {}", v.len(), space.flat_dim())));
            }
            finite(v, what)?;
            match (space, v.first()) {
                (Space::Discrete(n), Some(&x)) if !(x >= 0.0 && x < *n as f32 && x.fract() == 0.0) => {
                    Err(mismatch(format!("{x} is not an index below {n}")))
                }
                _ => Ok(()),
            }
        }
        (_, Observation::Text(_)) => Err(mismatch("text for a numeric space".into())),
        (Space::Text, Observation::Vector(_)) => Err(mismatch("a vector for a text space".into())),
    }
}

/// Checks an action against its space before it is sent to an environment.
pub fn validate_action(space: &Space, action: &Action) -> Result<(), OutputError> {
    let mismatch = |reason: String| OutputError::SpaceMismatch {
        what: "action".into(),
        space: space.to_string(),
        reason,
    };
    match (space, action) {
        (Space::Discrete(n), Action::Discrete(a)) if a < n => Ok(()),
        (Space::Discrete(n), Action::Discrete(a)) => Err(mismatch(format!("{a} is not below {n}"))),
        (Space::Box(b), Action::Continuous(v)) if v.len() != b.dim() => {
            Err(mismatch(format!("{} values, expected {}", v.len(), b.dim())))
        }
        (Space::Box(_), Action::Continuous(v)) => finite(v, "action"),
        (Space::Text, Action::Text(_)) => Ok(()),
        _ => Err(mismatch("wrong kind of action".into())),
    }
}

/// Checks a batch of actions for `num_envs` environments.
pub fn validate_batch_actions(space: &Space, num_envs: usize, actions: &BatchActions) -> Result<(), OutputError> {
    let mismatch = |reason: String| OutputError::SpaceMismatch {
        what: "batch of actions".into(),
        space: space.to_string(),
        reason,
    };
    match (space, actions) {
        (Space::Discrete(n), BatchActions::Discrete(a)) => {
            if a.len() != num_envs {
                return Err(mismatch(format!("{} actions for {num_envs} envs", a.len())));
            }
            match a.iter().position(|x| x >= n) {
                Some(i) => Err(mismatch(format!("action {} of env {i} is not below {n}", a[i]))),
                None => Ok(()),
            }
        }
        (Space::Box(b), BatchActions::Continuous(v)) => {
            if v.len() != num_envs * b.dim() {
                return Err(mismatch(format!(
                    "{} values for {num_envs} envs × {} dims",
                    v.len(),
                    b.dim()
                )));
            }
            finite(v, "batch of actions")
        }
        _ => Err(mismatch("wrong kind of actions".into())),
    }
}

fn finite(values: &[f32], what: &str) -> Result<(), OutputError> {
    match values.iter().position(|x| !x.is_finite()) {
        Some(i) => Err(OutputError::NonFinite {
            what: format!("{what}[{i}]"),
            value: values[i] as f64,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn box2() -> Space {
        Space::Box(BoxSpace {
            low: vec![-1.0; 2],
            high: vec![1.0; 2],
        })
    }

    #[test]
    fn observations_must_match_the_space() {
        assert!(validate_observation(&box2(), &Observation::Vector(vec![0.0, 5.0]), "obs").is_ok());
        let short = validate_observation(&box2(), &Observation::Vector(vec![0.0]), "obs").unwrap_err();
        assert_eq!(
            short.to_string(),
            "obs does not match the space Box(shape=[2]): 1 values, expected 2"
        );
        let nan = validate_observation(&box2(), &Observation::Vector(vec![0.0, f32::NAN]), "obs");
        assert!(matches!(nan, Err(OutputError::NonFinite { .. })));
        assert!(validate_observation(&box2(), &Observation::Text("x".into()), "obs").is_err());
        assert!(validate_observation(&Space::Discrete(3), &Observation::Vector(vec![3.0]), "obs").is_err());
        assert!(validate_observation(&Space::Discrete(3), &Observation::Vector(vec![2.0]), "obs").is_ok());
    }

    #[test]
    fn actions_must_match_the_space() {
        assert!(validate_action(&Space::Discrete(2), &Action::Discrete(1)).is_ok());
        assert!(validate_action(&Space::Discrete(2), &Action::Discrete(2)).is_err());
        assert!(validate_action(&box2(), &Action::Continuous(vec![0.0; 3])).is_err());
        assert!(validate_action(&box2(), &Action::Discrete(0)).is_err());
        assert!(validate_batch_actions(&Space::Discrete(2), 3, &BatchActions::Discrete(vec![0, 1, 1])).is_ok());
        assert!(validate_batch_actions(&Space::Discrete(2), 3, &BatchActions::Discrete(vec![0, 1])).is_err());
        assert!(validate_batch_actions(&box2(), 2, &BatchActions::Continuous(vec![0.0; 4])).is_ok());
        assert!(validate_batch_actions(&box2(), 2, &BatchActions::Continuous(vec![f32::NAN; 4])).is_err());
    }

    #[test]
    fn invalid_spaces_are_reported() {
        assert!(Space::Discrete(0).validate().is_err());
        let inverted = Space::Box(BoxSpace {
            low: vec![1.0],
            high: vec![0.0],
        });
        assert!(inverted.validate().unwrap_err().contains("low 1 > high 0"));
        let ragged = Space::Box(BoxSpace {
            low: vec![0.0],
            high: vec![],
        });
        assert!(ragged.validate().is_err());
        assert!(box2().validate().is_ok());
    }

    #[test]
    fn final_observations_pair_with_ended_envs() {
        let step = VecStep {
            observations: vec![0.0; 6],
            rewards: vec![1.0; 3],
            terminated: vec![false, true, false],
            truncated: vec![false, false, true],
            final_observations: vec![1.0, 1.5, 2.0, 2.5],
        };
        let ended: Vec<_> = step.final_observations(2).collect();
        assert_eq!(ended, vec![(1, &[1.0, 1.5][..]), (2, &[2.0, 2.5][..])]);
    }
}
