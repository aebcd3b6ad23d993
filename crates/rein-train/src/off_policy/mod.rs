//! Off-policy actor-critics for continuous actions: SAC ([`sac`]) and TD3 ([`td3`]), one update
//! each in CleanRL's order (`sac_continuous_action.py`, `td3_continuous_action.py`). The losses
//! are rein-optim's, the networks rein-model's; this module owns the order of an update, its
//! optimisers and target networks, and the random draws an update makes (taken as arguments,
//! so a test can give CleanRL's).

pub mod replay_buffer;
pub mod sac;
pub mod td3;

use burn::optim::AdamConfig;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

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

/// A box of continuous actions: `[low, high]` per dimension.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionBox {
    /// Lower bounds.
    pub low: Vec<f32>,
    /// Upper bounds.
    pub high: Vec<f32>,
}

impl ActionBox {
    /// Half the box's width, `s_a = (high − low)/2`, as a `[act_dim]` tensor.
    pub fn scale<B: Backend>(&self, device: &B::Device) -> Tensor<B, 1> {
        self.tensor(self.low.iter().zip(&self.high).map(|(l, h)| (h - l) / 2.0), device)
    }

    /// The box's centre, `b_a = (high + low)/2`.
    pub fn bias<B: Backend>(&self, device: &B::Device) -> Tensor<B, 1> {
        self.tensor(self.low.iter().zip(&self.high).map(|(l, h)| (h + l) / 2.0), device)
    }

    /// `low` as a tensor.
    pub fn low<B: Backend>(&self, device: &B::Device) -> Tensor<B, 1> {
        self.tensor(self.low.iter().copied(), device)
    }

    /// `high` as a tensor.
    pub fn high<B: Backend>(&self, device: &B::Device) -> Tensor<B, 1> {
        self.tensor(self.high.iter().copied(), device)
    }

    /// Action dimensions.
    pub fn dim(&self) -> usize {
        self.low.len()
    }

    fn tensor<B: Backend>(&self, values: impl Iterator<Item = f32>, device: &B::Device) -> Tensor<B, 1> {
        Tensor::from_data(TensorData::new(values.collect::<Vec<_>>(), [self.dim()]), device)
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
