//! A GRPO step's loss for tests that compare two ways of computing it and its gradients: the
//! policy loss with its KL and entropy terms at temperature 0.8, against copies of the batch's
//! own log-probabilities shifted (the sampler's by +0.05, the reference's by −0.1).

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Tensor, TensorData};
use rein_model::lm::CausalLm;
use rein_optim::{PolicyLossConfig, policy_loss};
use rein_posttrain::{TokenBatch, completion_log_probs};

type B = Autodiff<Flex>;

/// The loss of `model` on `batch` with one advantage per row.
pub fn grpo_loss(
    model: &CausalLm<B>,
    batch: &TokenBatch,
    advantages: &[f32],
    config: &PolicyLossConfig,
) -> Tensor<B, 1> {
    let device = Default::default();
    let (log_prob, entropy) = completion_log_probs(model, batch, 0.8, true, &device);
    let shifted = |by: f32| log_prob.clone().detach().add_scalar(by);
    let advantages = Tensor::<B, 2>::from_data(TensorData::new(advantages.to_vec(), [batch.rows, 1]), &device);
    policy_loss(
        log_prob.clone(),
        shifted(0.05),
        advantages,
        batch.mask::<B>(&device),
        Some(shifted(-0.1)),
        entropy,
        config,
    )
    .loss
}
