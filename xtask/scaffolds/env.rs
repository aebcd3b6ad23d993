//! `{{name}}`: a corridor of `length` cells; walk left (0) or right (1) and reach the right end.
//! Reward 1 on arrival (terminated), −0.01 per step otherwise; truncated after `max_episode_steps`.

use rein_pdk::{Action, Config, ConfigKey, EnvSpec, Environment, Metadata, Observation, Rng, Space, Transition};

/// The environment.
pub struct {{Type}} {
    length: u32,
    max_episode_steps: u32,
    position: u32,
    steps: u32,
    rng: Rng,
}

impl Environment for {{Type}} {
    const METADATA: Metadata = Metadata::new("{{name}}", "walk a corridor to its right end").config(&[
        ConfigKey::new("length", "number of cells").default("8"),
        ConfigKey::new("max_episode_steps", "truncate after this many steps").default("100"),
    ]);

    fn new(config: &Config) -> Result<Self, String> {
        let length = config.u64_or("length", 8)?.clamp(2, 1 << 20) as u32;
        let max_episode_steps = config.u64_or("max_episode_steps", 100)?.clamp(1, 1 << 30) as u32;
        Ok(Self { length, max_episode_steps, position: 0, steps: 0, rng: Rng::new(0) })
    }

    fn spec(&self) -> EnvSpec {
        EnvSpec { observation: Space::Box { low: vec![0.0], high: vec![1.0] }, action: Space::Discrete(2) }
    }

    fn reset(&mut self, seed: Option<u64>) {
        if let Some(seed) = seed {
            self.rng = Rng::new(seed);
        }
        // Start somewhere in the left half.
        self.position = (self.rng.next_u64() % u64::from(self.length / 2)) as u32;
        self.steps = 0;
    }

    fn step(&mut self, action: Action<'_>) -> Result<Transition, String> {
        let Action::Discrete(action) = action else { return Err("expected a discrete action".into()) };
        self.position = if action == 1 { self.position + 1 } else { self.position.saturating_sub(1) };
        self.steps += 1;
        let terminated = self.position == self.length - 1;
        Ok(Transition {
            reward: if terminated { 1.0 } else { -0.01 },
            terminated,
            truncated: !terminated && self.steps >= self.max_episode_steps,
        })
    }

    fn observation(&self) -> Observation {
        Observation::Vector(vec![self.position as f32 / (self.length - 1) as f32])
    }
}

rein_pdk::export_environment!({{Type}});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walking_right_reaches_the_end() {
        let mut env = {{Type}}::new(&Config::parse(r#"{"length": 4}"#, &{{Type}}::METADATA).unwrap()).unwrap();
        env.reset(Some(0));
        let mut last = None;
        for _ in 0..4 {
            let t = env.step(Action::Discrete(1)).unwrap();
            last = Some(t);
            if t.terminated {
                break;
            }
        }
        assert_eq!(last.map(|t| (t.reward, t.terminated)), Some((1.0, true)));
        assert_eq!(env.observation(), Observation::Vector(vec![1.0]));
    }
}
