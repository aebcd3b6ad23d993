//! `cartpole`: Gymnasium's CartPole-v1, step for step.
//!
//! Same constants, Euler integration, termination thresholds (|x| > 2.4, |θ| > 12°), reward 1
//! on every step including the terminal one, truncation after 500 steps, state in f64 and
//! observations in f32. Resets draw each state variable uniformly from [−0.05, 0.05) with this
//! plugin's own generator (Gymnasium's numpy PCG64 stream is not reproduced); the optional
//! `initial_state` config starts every episode from a given state instead, which is how the
//! parity tests compare trajectories with Gymnasium.

use rein_pdk::{Action, Config, ConfigKey, EnvSpec, Environment, Metadata, Observation, Rng, Space, Transition};

const GRAVITY: f64 = 9.8;
const MASS_CART: f64 = 1.0;
const MASS_POLE: f64 = 0.1;
const TOTAL_MASS: f64 = MASS_POLE + MASS_CART;
const LENGTH: f64 = 0.5;
const POLE_MASS_LENGTH: f64 = MASS_POLE * LENGTH;
const FORCE_MAG: f64 = 10.0;
const TAU: f64 = 0.02;
const THETA_THRESHOLD: f64 = 12.0 * 2.0 * std::f64::consts::PI / 360.0;
const X_THRESHOLD: f64 = 2.4;

/// The environment.
pub struct CartPole {
    /// `[x, x_dot, theta, theta_dot]`.
    state: [f64; 4],
    steps: u32,
    max_episode_steps: u32,
    initial_state: Option<[f64; 4]>,
    rng: Rng,
}

impl CartPole {
    /// The current state, `[x, x_dot, theta, theta_dot]`.
    pub fn state(&self) -> [f64; 4] {
        self.state
    }
}

impl Environment for CartPole {
    const METADATA: Metadata = Metadata::new(
        "cartpole",
        "Gymnasium CartPole-v1: balance a pole on a cart by pushing it left (0) or right (1)",
    )
    .config(&[
        ConfigKey::new("max_episode_steps", "truncate episodes after this many steps").default("500"),
        ConfigKey::new("initial_state", "start every episode from [x, x_dot, theta, theta_dot]"),
    ]);

    fn new(config: &Config) -> Result<Self, String> {
        let initial_state = match config.numbers("initial_state")? {
            None => None,
            Some(v) => Some(<[f64; 4]>::try_from(v.as_slice()).map_err(|_| {
                format!(
                    "config key `initial_state` needs 4 numbers [x, x_dot, theta, theta_dot], got {}",
                    v.len()
                )
            })?),
        };
        let max_episode_steps = u32::try_from(config.u64_or("max_episode_steps", 500)?)
            .map_err(|_| "config key `max_episode_steps` is too large".to_string())?;
        Ok(Self {
            state: [0.0; 4],
            steps: 0,
            max_episode_steps,
            initial_state,
            rng: Rng::new(0),
        })
    }

    fn spec(&self) -> EnvSpec {
        let high = [
            (X_THRESHOLD * 2.0) as f32,
            f32::MAX,
            (THETA_THRESHOLD * 2.0) as f32,
            f32::MAX,
        ];
        EnvSpec {
            observation: Space::Box {
                low: high.iter().map(|h| -h).collect(),
                high: high.to_vec(),
            },
            action: Space::Discrete(2),
        }
    }

    fn reset(&mut self, seed: Option<u64>) {
        if let Some(seed) = seed {
            self.rng = Rng::new(seed);
        }
        self.state = self
            .initial_state
            .unwrap_or_else(|| std::array::from_fn(|_| self.rng.uniform(-0.05, 0.05)));
        self.steps = 0;
    }

    fn step(&mut self, action: Action<'_>) -> Result<Transition, String> {
        let Action::Discrete(action) = action else {
            return Err("cartpole takes a discrete action".into());
        };
        let [x, x_dot, theta, theta_dot] = self.state;
        let force = if action == 1 { FORCE_MAG } else { -FORCE_MAG };
        // Operation order follows Gymnasium's so rounding matches (np.square(a) is a*a, done first).
        let (sin_theta, cos_theta) = (theta.sin(), theta.cos());
        let temp = (force + POLE_MASS_LENGTH * (theta_dot * theta_dot) * sin_theta) / TOTAL_MASS;
        let theta_acc = (GRAVITY * sin_theta - cos_theta * temp)
            / (LENGTH * (4.0 / 3.0 - MASS_POLE * (cos_theta * cos_theta) / TOTAL_MASS));
        let x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos_theta / TOTAL_MASS;
        self.state = [
            x + TAU * x_dot,
            x_dot + TAU * x_acc,
            theta + TAU * theta_dot,
            theta_dot + TAU * theta_acc,
        ];
        self.steps += 1;
        let [x, _, theta, _] = self.state;
        let terminated =
            !(-X_THRESHOLD..=X_THRESHOLD).contains(&x) || !(-THETA_THRESHOLD..=THETA_THRESHOLD).contains(&theta);
        let truncated = !terminated && self.steps >= self.max_episode_steps;
        Ok(Transition {
            reward: 1.0,
            terminated,
            truncated,
        })
    }

    fn observation(&self) -> Observation {
        Observation::Vector(self.state.map(|v| v as f32).to_vec())
    }

    fn write_observation(&self, out: &mut Vec<f32>) {
        out.extend(self.state.map(|v| v as f32));
    }
}

rein_pdk::export_environment!(CartPole);

#[cfg(test)]
mod tests {
    use super::*;

    fn env(config: &str) -> CartPole {
        CartPole::new(&Config::parse(config, &CartPole::METADATA).unwrap()).unwrap()
    }

    #[test]
    fn pushing_one_way_terminates_on_the_angle() {
        let mut env = env(r#"{"initial_state": [0, 0, 0, 0]}"#);
        env.reset(Some(0));
        let mut steps = 0;
        loop {
            steps += 1;
            let t = env.step(Action::Discrete(1)).unwrap();
            assert_eq!(t.reward, 1.0);
            if t.terminated {
                break;
            }
        }
        assert!(env.state()[2] < -THETA_THRESHOLD, "pushed right, the pole falls left");
        assert!(steps < 20, "{steps}");
    }

    #[test]
    fn episodes_truncate_at_the_limit() {
        let mut env = env(r#"{"max_episode_steps": 3}"#);
        env.reset(Some(1));
        let flags: Vec<_> = (0..3)
            .map(|i| env.step(Action::Discrete(i % 2)).unwrap().truncated)
            .collect();
        assert_eq!(flags, vec![false, false, true]);
    }

    #[test]
    fn resets_are_seeded_and_small() {
        let (mut a, mut b) = (env("{}"), env("{}"));
        a.reset(Some(5));
        b.reset(Some(5));
        assert_eq!(a.state(), b.state());
        assert!(a.state().iter().all(|v| v.abs() < 0.05));
        assert!(CartPole::new(&Config::parse(r#"{"initial_state": [1]}"#, &CartPole::METADATA).unwrap()).is_err());
    }
}
