//! Episodes' returns: training's as they complete (for `charts/episodic_return` and the stop
//! condition), and the deterministic policy's evaluation.

use std::collections::VecDeque;

use rein_core::BatchActions;
use serde::{Deserialize, Serialize};

use super::EnvFactory;
use crate::ControlError;

/// The running return of each env and the last `window` completed returns.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct EpisodeReturns {
    running: Vec<f64>,
    recent: VecDeque<f64>,
    window: usize,
    /// Episodes completed so far.
    pub(crate) completed: usize,
}

impl EpisodeReturns {
    pub(crate) fn new(num_envs: usize, window: usize) -> Self {
        Self {
            running: vec![0.0; num_envs],
            recent: VecDeque::with_capacity(window),
            window,
            completed: 0,
        }
    }

    /// Adds one step's rewards; an env whose episode ended starts a new one.
    pub(crate) fn record(&mut self, rewards: &[f64], terminated: &[bool], truncated: &[bool]) {
        for i in 0..self.running.len() {
            self.running[i] += rewards[i];
            if terminated[i] || truncated[i] {
                if self.recent.len() == self.window {
                    self.recent.pop_front();
                }
                self.recent.push_back(self.running[i]);
                self.running[i] = 0.0;
                self.completed += 1;
            }
        }
    }

    /// Mean return over the last `window` episodes, once `window` episodes completed.
    pub(crate) fn mean_return(&self) -> Option<f64> {
        (self.recent.len() == self.window).then(|| self.recent.iter().sum::<f64>() / self.window as f64)
    }
}

/// The mean return of `episodes` episodes of `policy` (observations of the envs, row-major →
/// their actions) on fresh environments, at most 16 at once, seeded apart from training's.
pub(crate) fn evaluate(
    make_env: &EnvFactory<'_>,
    seed: u64,
    episodes: usize,
    policy: &mut dyn FnMut(Vec<f32>, usize) -> BatchActions,
) -> Result<f64, ControlError> {
    let n = episodes.clamp(1, 16);
    let mut envs = make_env(n)?;
    let mut obs = envs.reset(seed.wrapping_add(1_000_003))?;
    let mut running = vec![0.0f64; n];
    let mut returns = Vec::with_capacity(episodes);
    while returns.len() < episodes {
        let step = envs.step(&policy(obs, n))?;
        for (i, total) in running.iter_mut().enumerate() {
            *total += step.rewards[i];
            if step.terminated[i] || step.truncated[i] {
                returns.push(*total);
                *total = 0.0;
            }
        }
        obs = step.observations;
    }
    returns.truncate(episodes);
    Ok(returns.iter().sum::<f64>() / episodes.max(1) as f64)
}
