//! Off-policy actor-critics for continuous actions: SAC ([`sac`]) and TD3 ([`td3`]), one update
//! each in CleanRL's order (`sac_continuous_action.py`, `td3_continuous_action.py`), and the
//! loop that runs them on environment plugins ([`OffPolicy`], [`train`]). The losses are
//! rein-optim's, the networks rein-model's; this module owns the order of an update, its
//! optimisers and target networks, the replay buffer, and the random draws an update makes
//! (taken as arguments, so a test can give CleanRL's).

mod build;
pub mod flat;
mod learner;
pub mod replay_buffer;
mod run;
pub mod sac;
pub mod td3;
mod trainer;

pub use run::train;
pub use trainer::OffPolicy;

use burn::optim::AdamConfig;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use rein_core::BoxSpace;

/// A minibatch of transitions as the replay buffer gives it: row-major values.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Transitions.
    pub rows: usize,
    /// `s`, `[rows, obs_dim]`.
    pub obs: Vec<f32>,
    /// `a`, `[rows, act_dim]`.
    pub actions: Vec<f32>,
    /// `r`, `[rows]`.
    pub rewards: Vec<f32>,
    /// `s'`, `[rows, obs_dim]`.
    pub next_obs: Vec<f32>,
    /// 1 where the transition terminated, `[rows]`.
    pub dones: Vec<f32>,
}

impl Batch {
    /// The batch as tensors on `device`.
    pub fn to_device<B: Backend>(&self, device: &B::Device) -> Transitions<B> {
        let n = self.rows;
        let t2 =
            |values: &[f32]| Tensor::from_data(TensorData::new(values.to_vec(), [n, values.len() / n.max(1)]), device);
        let t1 = |values: &[f32]| Tensor::from_data(TensorData::new(values.to_vec(), [n]), device);
        Transitions {
            obs: t2(&self.obs),
            actions: t2(&self.actions),
            rewards: t1(&self.rewards),
            next_obs: t2(&self.next_obs),
            dones: t1(&self.dones),
        }
    }
}

/// A minibatch of transitions, on the device.
#[derive(Debug, Clone)]
pub struct Transitions<B: Backend> {
    /// `s`, `[batch, obs_dim]`.
    pub obs: Tensor<B, 2>,
    /// `a`, `[batch, act_dim]`.
    pub actions: Tensor<B, 2>,
    /// `r`, `[batch]`.
    pub rewards: Tensor<B, 1>,
    /// `s'`, the observation after the step (the final one where an episode was truncated),
    /// `[batch, obs_dim]`.
    pub next_obs: Tensor<B, 2>,
    /// 1 where the episode terminated at this step (not where it was truncated), `[batch]`.
    pub dones: Tensor<B, 1>,
}

/// An action box (the environment's [`BoxSpace`]) as the `[act_dim]` tensors an update reads:
/// made once per agent, on the autodiff backend (constants: no gradient), and read on the inner
/// one through [`BoxTensors::inner`].
#[derive(Debug, Clone)]
struct BoxTensors<B: Backend> {
    /// Half the box's width, `s_a = (high − low)/2`.
    scale: Tensor<B, 1>,
    /// The box's centre, `b_a = (high + low)/2`.
    bias: Tensor<B, 1>,
    low: Tensor<B, 1>,
    high: Tensor<B, 1>,
}

impl<B: Backend> BoxTensors<B> {
    fn new(bounds: &BoxSpace, device: &B::Device) -> Self {
        let tensor = |values: Vec<f32>| Tensor::from_data(TensorData::new(values, [bounds.dim()]), device);
        let sides = || bounds.low.iter().zip(&bounds.high);
        Self {
            scale: tensor(sides().map(|(l, h)| (h - l) / 2.0).collect()),
            bias: tensor(sides().map(|(l, h)| (h + l) / 2.0).collect()),
            low: tensor(bounds.low.clone()),
            high: tensor(bounds.high.clone()),
        }
    }

    /// `s_a y + b_a` for `y` in `[−1, 1]` (a tanh's output), row by row.
    fn squash(&self, y: Tensor<B, 2>) -> Tensor<B, 2> {
        y * self.scale.clone().unsqueeze::<2>() + self.bias.clone().unsqueeze::<2>()
    }
}

impl<B: AutodiffBackend> BoxTensors<B> {
    fn inner(&self) -> BoxTensors<B::InnerBackend> {
        BoxTensors {
            scale: self.scale.clone().inner(),
            bias: self.bias.clone().inner(),
            low: self.low.clone().inner(),
            high: self.high.clone().inner(),
        }
    }
}

/// PyTorch's `optim.Adam` defaults, which CleanRL keeps: β = (0.9, 0.999), ε = 1e-8.
fn torch_adam() -> AdamConfig {
    AdamConfig::new().with_beta_1(0.9).with_beta_2(0.999).with_epsilon(1e-8)
}

/// `[rows, cols]` standard normal draws on the device, from host values.
pub fn normals<B: Backend>(values: Vec<f32>, [rows, cols]: [usize; 2], device: &B::Device) -> Tensor<B, 2> {
    Tensor::from_data(TensorData::new(values, [rows, cols]), device)
}
