//! Training episodes' returns as they complete, for `charts/episodic_return` and the stop
//! condition.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// The running return of each env and the last `window` completed returns.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct EpisodeReturns {
    running: Vec<f64>,
    recent: VecDeque<f64>,
    window: usize,
    /// EpisodeReturns completed so far.
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
