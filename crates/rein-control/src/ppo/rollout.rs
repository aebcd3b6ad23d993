//! A rollout's storage, the minibatches drawn from it, and the statistics of an update.

use rein_optim::{PpoLossValues, normalize};

/// One rollout of `steps × num_envs` transitions, laid out time-major: element
/// `t · num_envs + i` is env `i` at step `t`.
pub(super) struct Rollout {
    obs_dim: usize,
    act_dim: usize,
    pub(super) obs: Vec<f32>,
    pub(super) actions: Vec<f32>,
    pub(super) log_probs: Vec<f32>,
    pub(super) values: Vec<f32>,
    /// `V(s')` each transition bootstraps from (its successor's value, or the value of a
    /// truncated episode's final observation).
    pub(super) next_values: Vec<f32>,
    pub(super) rewards: Vec<f32>,
    pub(super) terminated: Vec<bool>,
    pub(super) truncated: Vec<bool>,
}

/// The rows of one minibatch (`mb_` in CleanRL).
pub(super) struct Minibatch {
    pub(super) obs: Vec<f32>,
    pub(super) actions: Vec<f32>,
    pub(super) log_probs: Vec<f32>,
    pub(super) advantages: Vec<f32>,
    pub(super) values: Vec<f32>,
    pub(super) returns: Vec<f32>,
}

impl Rollout {
    pub(super) fn new(steps: usize, num_envs: usize, obs_dim: usize, act_dim: usize) -> Self {
        let n = steps * num_envs;
        Self {
            obs_dim,
            act_dim,
            obs: vec![0.0; n * obs_dim],
            actions: vec![0.0; n * act_dim],
            log_probs: vec![0.0; n],
            values: vec![0.0; n],
            next_values: vec![0.0; n],
            rewards: vec![0.0; n],
            terminated: vec![false; n],
            truncated: vec![false; n],
        }
    }

    /// The minibatch of `rows`, its advantages normalised when `norm_adv`.
    pub(super) fn gather(&self, rows: &[usize], advantages: &[f32], returns: &[f32], norm_adv: bool) -> Minibatch {
        let pick = |src: &[f32], width: usize| -> Vec<f32> {
            let mut out = Vec::with_capacity(rows.len() * width);
            for &r in rows {
                out.extend_from_slice(&src[r * width..(r + 1) * width]);
            }
            out
        };
        let mut mb_advantages = pick(advantages, 1);
        if norm_adv {
            normalize(&mut mb_advantages);
        }
        Minibatch {
            obs: pick(&self.obs, self.obs_dim),
            actions: pick(&self.actions, self.act_dim),
            log_probs: pick(&self.log_probs, 1),
            advantages: mb_advantages,
            values: pick(&self.values, 1),
            returns: pick(returns, 1),
        }
    }
}

/// The loss terms of an update's minibatches, averaged for logging.
#[derive(Default)]
pub(super) struct LossStats {
    policy: f64,
    value: f64,
    entropy: f64,
    approx_kl: f64,
    clip_frac: f64,
    grad_norm: f64,
    /// The last minibatch's approximate KL (for `target_kl`).
    pub(super) last_kl: f32,
    count: usize,
}

impl LossStats {
    pub(super) fn add(&mut self, loss: &PpoLossValues, grad_norm: f32) {
        self.policy += f64::from(loss.policy);
        self.value += f64::from(loss.value);
        self.entropy += f64::from(loss.entropy);
        self.last_kl = loss.approx_kl;
        self.approx_kl += f64::from(loss.approx_kl);
        self.clip_frac += f64::from(loss.clip_frac);
        self.grad_norm += f64::from(grad_norm);
        self.count += 1;
    }

    /// `(policy, value, entropy, approx_kl, clip_frac, grad_norm)` means.
    pub(super) fn means(&self) -> [f64; 6] {
        let n = self.count.max(1) as f64;
        [
            self.policy / n,
            self.value / n,
            self.entropy / n,
            self.approx_kl / n,
            self.clip_frac / n,
            self.grad_norm / n,
        ]
    }
}
