//! rein's estimators, losses and optimiser steps, each in its own file and readable against
//! its paper's equation.
//!
//! - [`gae`]: generalised advantage estimation with Gymnasium's terminated/truncated split.
//! - [`normalize`]: advantage normalisation; [`RunningMeanStd`] and [`RewardScaler`] for
//!   observation normalisation and reward scaling.
//! - [`ppo_loss`]: PPO's clipped surrogate, clipped value loss and entropy bonus, with the
//!   approximate KL and clip fraction.
//! - [`clip_grad_norm`]: global gradient-norm clipping; [`LinearSchedule`] for learning rates.
//!
//! Estimators work on plain `f32` slices (property-testable without tensors); losses are burn
//! tensor functions generic over the backend.
//!
//! **Architecture invariant:** no knowledge of environments, plugins, models' structure or
//! training loops.

mod gae;
mod grad_clip;
mod normalize;
mod ppo_loss;
mod running;
mod schedule;

pub use gae::gae;
pub use grad_clip::clip_grad_norm;
pub use normalize::normalize;
pub use ppo_loss::{PpoLoss, PpoLossConfig, ppo_loss};
pub use running::{RewardScaler, RunningMeanStd};
pub use schedule::LinearSchedule;
