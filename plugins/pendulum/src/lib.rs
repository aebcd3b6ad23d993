//! `pendulum`: Gymnasium's Pendulum-v1, step for step.
//!
//! Same constants (max speed 8, max torque 2, dt 0.05, g 10, m 1, l 1), the cost
//! θₙ² + 0.1 θ̇² + 0.001 u² computed from the pre-step state with the angle wrapped by a floor
//! modulo, the velocity clip, never terminating, truncation after 200 steps. The torque is
//! clipped to ±2 and, as in Gymnasium (numpy float32 arithmetic on the action), the torque
//! terms `0.001 u²` and `3u` are computed in f32. Resets draw θ from [−π, π) and θ̇ from
//! [−1, 1) with this plugin's generator; `initial_state` = [θ, θ̇] starts every episode there.

use rein_pdk::{Action, Config, ConfigKey, EnvSpec, Environment, Metadata, Observation, Rng, Space, Transition};

const MAX_SPEED: f64 = 8.0;
const MAX_TORQUE: f32 = 2.0;
const DT: f64 = 0.05;
const G: f64 = 10.0;
const M: f64 = 1.0;
const L: f64 = 1.0;

/// The environment.
pub struct Pendulum {
    /// `[theta, theta_dot]`.
    state: [f64; 2],
    steps: u32,
    max_episode_steps: u32,
    initial_state: Option<[f64; 2]>,
    rng: Rng,
}

/// Wraps an angle to [−π, π) with a floor modulo (Python's `%`), not a truncating one.
pub fn angle_normalize(x: f64) -> f64 {
    use std::f64::consts::PI;
    (x + PI).rem_euclid(2.0 * PI) - PI
}

impl Pendulum {
    /// The current state, `[theta, theta_dot]`.
    pub fn state(&self) -> [f64; 2] {
        self.state
    }
}

impl Environment for Pendulum {
    const METADATA: Metadata = Metadata::new(
        "pendulum",
        "Gymnasium Pendulum-v1: swing a pendulum up and keep it upright with a torque in [-2, 2]",
    )
    .config(&[
        ConfigKey::new("max_episode_steps", "truncate episodes after this many steps").default("200"),
        ConfigKey::new("initial_state", "start every episode from [theta, theta_dot]"),
    ]);

    fn new(config: &Config) -> Result<Self, String> {
        let initial_state = match config.numbers("initial_state")? {
            None => None,
            Some(v) => Some(<[f64; 2]>::try_from(v.as_slice()).map_err(|_| {
                format!(
                    "config key `initial_state` needs 2 numbers [theta, theta_dot], got {}",
                    v.len()
                )
            })?),
        };
        let max_episode_steps = u32::try_from(config.u64_or("max_episode_steps", 200)?)
            .map_err(|_| "config key `max_episode_steps` is too large".to_string())?;
        Ok(Self {
            state: [0.0; 2],
            steps: 0,
            max_episode_steps,
            initial_state,
            rng: Rng::new(0),
        })
    }

    fn spec(&self) -> EnvSpec {
        EnvSpec {
            observation: Space::Box {
                low: vec![-1.0, -1.0, -MAX_SPEED as f32],
                high: vec![1.0, 1.0, MAX_SPEED as f32],
            },
            action: Space::Box {
                low: vec![-MAX_TORQUE],
                high: vec![MAX_TORQUE],
            },
        }
    }

    fn reset(&mut self, seed: Option<u64>) {
        if let Some(seed) = seed {
            self.rng = Rng::new(seed);
        }
        self.state = self.initial_state.unwrap_or_else(|| {
            [
                self.rng.uniform(-std::f64::consts::PI, std::f64::consts::PI),
                self.rng.uniform(-1.0, 1.0),
            ]
        });
        self.steps = 0;
    }

    fn step(&mut self, action: Action<'_>) -> Result<Transition, String> {
        let Action::Continuous(&[u]) = action else {
            return Err("pendulum takes one torque value".into());
        };
        let [th, thdot] = self.state;
        let u = u.clamp(-MAX_TORQUE, MAX_TORQUE);
        let cost = angle_normalize(th).powi(2) + 0.1 * (thdot * thdot) + f64::from(0.001f32 * (u * u));
        let new_thdot = thdot + (3.0 * G / (2.0 * L) * th.sin() + f64::from(3.0 / (M * L * L) as f32 * u)) * DT;
        let new_thdot = new_thdot.clamp(-MAX_SPEED, MAX_SPEED);
        self.state = [th + new_thdot * DT, new_thdot];
        self.steps += 1;
        Ok(Transition {
            reward: -cost,
            terminated: false,
            truncated: self.steps >= self.max_episode_steps,
        })
    }

    fn observation(&self) -> Observation {
        let mut v = Vec::with_capacity(3);
        self.write_observation(&mut v);
        Observation::Vector(v)
    }

    fn write_observation(&self, out: &mut Vec<f32>) {
        let [th, thdot] = self.state;
        out.extend([th.cos() as f32, th.sin() as f32, thdot as f32]);
    }
}

rein_pdk::export_environment!(Pendulum);

#[cfg(test)]
mod tests {
    use super::*;

    fn env(config: &str) -> Pendulum {
        Pendulum::new(&Config::parse(config, &Pendulum::METADATA).unwrap()).unwrap()
    }

    #[test]
    fn angle_wraps_with_a_floor_modulo() {
        use std::f64::consts::PI;
        assert!((angle_normalize(3.0 * PI / 2.0) + PI / 2.0).abs() < 1e-12);
        assert!((angle_normalize(-3.0 * PI / 2.0) - PI / 2.0).abs() < 1e-12);
        assert_eq!(angle_normalize(0.25), 0.25);
    }

    #[test]
    fn upright_and_still_costs_only_the_torque() {
        let mut env = env(r#"{"initial_state": [0, 0]}"#);
        env.reset(None);
        let t = env.step(Action::Continuous(&[5.0])).unwrap();
        assert!((t.reward + 0.004).abs() < 1e-9, "torque clipped to 2: {}", t.reward);
        assert!(!t.terminated);
    }

    #[test]
    fn truncates_after_200_steps_and_caps_speed() {
        let mut env = env(r#"{"initial_state": [3.0, 0]}"#);
        env.reset(None);
        for i in 1..=200 {
            let t = env.step(Action::Continuous(&[2.0])).unwrap();
            assert_eq!(t.truncated, i == 200);
            assert!(env.state()[1].abs() <= MAX_SPEED);
        }
    }
}
