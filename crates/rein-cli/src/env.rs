//! `rein env rollout`: step an environment plugin and print each transition.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Subcommand;
use rein_core::{Action, Environment, Space};
use rein_plugin::PluginRuntime;

use crate::LimitArgs;

#[derive(Subcommand)]
pub(crate) enum EnvCommand {
    /// Reset an environment, step it, print one JSON line per step.
    Rollout {
        /// The environment plugin.
        file: PathBuf,
        /// The environment's config as a JSON object.
        #[arg(long, default_value = "{}")]
        config: String,
        /// Seed for the reset (and for --random actions).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Comma-separated actions: indices for discrete spaces; for box spaces, one value per
        /// step for 1-D actions, or `;`-separated vectors (`0.5,-1;1,0`).
        #[arg(long, conflicts_with = "random")]
        actions: Option<String>,
        /// Sample uniformly random actions.
        #[arg(long, requires = "steps")]
        random: bool,
        /// Number of random steps.
        #[arg(long)]
        steps: Option<usize>,
        /// Keep stepping across episode ends (reset and continue) instead of stopping.
        #[arg(long)]
        continue_after_done: bool,
        #[command(flatten)]
        limits: LimitArgs,
    },
}

impl EnvCommand {
    pub(crate) fn run(self) -> anyhow::Result<()> {
        let EnvCommand::Rollout {
            file,
            config,
            seed,
            actions,
            random,
            steps,
            continue_after_done,
            limits,
        } = self;
        let plugin = PluginRuntime::default().load(&file, limits.limits())?;
        let mut env = plugin.environment(&config)?;
        let space = env.spec().action.clone();
        let actions: Vec<Action> = match (actions, random) {
            (Some(list), _) => parse_actions(&list, &space)?,
            (None, true) => random_actions(&space, steps.unwrap_or(0), seed)?,
            (None, false) => bail!("give --actions LIST or --random --steps N"),
        };
        let mut out = std::io::stdout().lock();
        let obs = env.reset(Some(seed))?;
        writeln!(out, "{}", serde_json::json!({ "step": 0, "observation": obs }))?;
        for (i, action) in actions.iter().enumerate() {
            let step = env.step(action).with_context(|| format!("step {}", i + 1))?;
            let line = serde_json::json!({
                "step": i + 1,
                "action": action,
                "observation": step.observation,
                "reward": step.reward,
                "terminated": step.terminated,
                "truncated": step.truncated,
            });
            writeln!(out, "{line}")?;
            if step.terminated || step.truncated {
                if !continue_after_done {
                    break;
                }
                env.reset(None)?;
            }
        }
        Ok(())
    }
}

fn parse_actions(list: &str, space: &Space) -> anyhow::Result<Vec<Action>> {
    let parse_f32 = |s: &str| {
        s.trim()
            .parse::<f32>()
            .with_context(|| format!("`{s}` in --actions is not a number"))
    };
    match space {
        Space::Discrete(_) => list
            .split(',')
            .map(|s| {
                let index = s
                    .trim()
                    .parse::<u32>()
                    .with_context(|| format!("`{s}` in --actions is not an action index"))?;
                Ok(Action::Discrete(index))
            })
            .collect(),
        Space::Box(b) if b.dim() == 1 && !list.contains(';') => list
            .split(',')
            .map(|s| Ok(Action::Continuous(vec![parse_f32(s)?])))
            .collect(),
        Space::Box(_) => list
            .split(';')
            .map(|v| {
                Ok(Action::Continuous(
                    v.split(',').map(parse_f32).collect::<anyhow::Result<_>>()?,
                ))
            })
            .collect(),
        Space::Text => Ok(list.split(',').map(|s| Action::Text(s.to_string())).collect()),
    }
}

fn random_actions(space: &Space, steps: usize, seed: u64) -> anyhow::Result<Vec<Action>> {
    let mut state = seed ^ 0x853C_49E6_748F_EA9B;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..steps)
        .map(|_| match space {
            Space::Discrete(n) => Ok(Action::Discrete(((next() * *n as f64) as u32).min(n - 1))),
            Space::Box(b) => Ok(Action::Continuous(
                b.low
                    .iter()
                    .zip(&b.high)
                    .map(|(l, h)| {
                        let (l, h) = (l.max(-1e6) as f64, h.min(1e6) as f64);
                        (l + (h - l) * next()) as f32
                    })
                    .collect(),
            )),
            Space::Text => bail!("--random needs a discrete or box action space, not text"),
        })
        .collect()
}
