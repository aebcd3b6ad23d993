//! An environment plugin that misbehaves as its config's `attack` says: wrong observation
//! shapes, NaN observations or rewards, an invalid space, an infinite loop or an hour's sleep on
//! step, rewards so large (finite) that training overflows. With no attack it is a 2-D random walk that ends
//! after `horizon` steps: four discrete moves, or with `actions = "box"` any move in `[−1, 1]²`
//! (`"unbounded-box"`: a box without bounds).

use std::hint::black_box;

use rein_pdk::{Action, Config, ConfigKey, EnvSpec, Environment, Metadata, Observation, Rng, Space, Transition};

struct HostileEnv {
    attack: String,
    /// `discrete`, `box` or `unbounded-box`.
    actions: String,
    horizon: u32,
    /// For `huge-reward`: steps (over all episodes) before the rewards become huge.
    after: u64,
    steps: u32,
    total_steps: u64,
    position: [f32; 2],
    rng: Rng,
}

impl Environment for HostileEnv {
    const METADATA: Metadata = Metadata::new("hostile-env", "misbehaves on request").config(&[
        ConfigKey::new(
            "attack",
            "short-obs, nan-obs, nan-reward, huge-reward, bad-space, loop-on-step, loop-after-3, sleep-on-step",
        ),
        ConfigKey::new("actions", "discrete (default), box, or unbounded-box"),
        ConfigKey::new("horizon", "episode length"),
        ConfigKey::new("after", "huge-reward: steps before the rewards become 1e38"),
    ]);

    fn new(config: &Config) -> Result<Self, String> {
        Ok(Self {
            attack: config.str_or("attack", "")?.to_string(),
            actions: config.str_or("actions", "discrete")?.to_string(),
            horizon: config.u64_or("horizon", 5)? as u32,
            after: config.u64_or("after", 0)?,
            steps: 0,
            total_steps: 0,
            position: [0.0; 2],
            rng: Rng::new(0),
        })
    }

    fn spec(&self) -> EnvSpec {
        let observation = if self.attack == "bad-space" {
            Space::Box {
                low: vec![1.0, 1.0],
                high: vec![0.0, 0.0],
            }
        } else {
            Space::Box {
                low: vec![-100.0; 2],
                high: vec![100.0; 2],
            }
        };
        let bound = match self.actions.as_str() {
            "box" => 1.0,
            "unbounded-box" => f32::INFINITY,
            _ => {
                return EnvSpec {
                    observation,
                    action: Space::Discrete(4),
                };
            }
        };
        EnvSpec {
            observation,
            action: Space::Box {
                low: vec![-bound; 2],
                high: vec![bound; 2],
            },
        }
    }

    fn reset(&mut self, seed: Option<u64>) {
        if let Some(seed) = seed {
            self.rng = Rng::new(seed);
        }
        self.position = [self.rng.uniform(-1.0, 1.0) as f32, 0.0];
        self.steps = 0;
    }

    fn step(&mut self, action: Action<'_>) -> Result<Transition, String> {
        let delta = match action {
            Action::Discrete(a) if a < 4 => [(1.0, 0.0), (-1.0, 0.0), (0.0, 1.0), (0.0, -1.0)][a as usize],
            Action::Continuous(&[x, y]) => (x.clamp(-1.0, 1.0), y.clamp(-1.0, 1.0)),
            _ => return Err(format!("not an action of this environment: {action:?}")),
        };
        self.steps += 1;
        self.total_steps += 1;
        if self.attack == "loop-on-step" || (self.attack == "loop-after-3" && self.steps > 3) {
            let mut x = 0u64;
            loop {
                x = black_box(x.wrapping_add(1));
            }
        }
        if self.attack == "sleep-on-step" {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
        self.position[0] += delta.0;
        self.position[1] += delta.1;
        let reward = if self.attack == "nan-reward" {
            f64::NAN
        } else if self.attack == "huge-reward" && self.total_steps > self.after {
            1e38
        } else {
            -f64::from(self.position[0].abs())
        };
        Ok(Transition {
            reward,
            terminated: false,
            truncated: self.steps >= self.horizon,
        })
    }

    fn observation(&self) -> Observation {
        match self.attack.as_str() {
            "short-obs" => Observation::Vector(vec![self.position[0]]),
            "nan-obs" => Observation::Vector(vec![f32::NAN, self.position[1]]),
            _ => Observation::Vector(self.position.to_vec()),
        }
    }
}

rein_pdk::export_environment!(HostileEnv);
