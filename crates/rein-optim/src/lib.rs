//! rein's estimators, losses and optimiser steps, each in its own file and readable against
//! its paper's equation.
//!
//! - [`gae`]: generalised advantage estimation with Gymnasium's terminated/truncated split.
//! - [`normalize`]: advantage normalisation; [`RunningMeanStd`] and [`RewardScaler`] for
//!   observation normalisation and reward scaling.
//! - [`ppo_loss`]: PPO's clipped surrogate, clipped value loss and entropy bonus, with the
//!   approximate KL and clip fraction; the same on plain rows with the gradient by hand
//!   ([`clipped_surrogate_rows`], [`value_loss_rows`], the heads' [`categorical_row`] and
//!   [`gaussian_row`] and their backward passes).
//! - [`clip_grad_norm`]: global gradient-norm clipping; [`LinearSchedule`] for learning rates;
//!   [`non_finite_parameter`] and [`non_finite_gradient`] name the tensor a NaN appeared in.
//! - LLM RL: outcome advantages ([`group_normalized`] for GRPO / Dr. GRPO, [`rloo`],
//!   [`reinforce_pp`]; GDPO's [`decoupled_normalized`] for several rewards; [`best_of_group`]
//!   and [`pass_at_k`] to train for pass@k) and their
//!   difficulty-aware weights ([`reweight_by_difficulty`]), GiGPO's episode- and step-level advantages for multi-turn episodes
//!   ([`gigpo_advantages`]), [`policy_loss`] (PPO-clip with clip-higher and dual-clip, GSPO
//!   sequence ratios, KL and entropy terms), [`aggregate`] (token-mean, seq-mean-token-mean,
//!   seq-mean-token-sum-norm; [`share_weight`] for a batch split across devices) and the
//!   [`kl_estimate`] estimators k1, k2, k3;
//!   [`lag_correction`] (TIS, IcePop) for completions another policy sampled;
//!   [`EntropyCoefficient`], Skywork-OR1's adaptive entropy bonus;
//!   [`add_teacher_advantages`] and [`full_reverse_kl`], on-policy distillation's sampled and
//!   full-vocabulary reverse KL; PRIME's [`process_advantages`] from rewards on tokens (step
//!   scores, an implicit PRM's) with no critic, and the implicit PRM's own loss and token rewards
//!   ([`implicit_prm_loss`], [`implicit_token_rewards`]).
//! - PPO on language models: [`token_rewards`] (the score on the last token, −β·KL on every
//!   token), [`token_gae`] (GAE over a completion's tokens) and [`masked_whiten`], as
//!   InstructGPT and TRL's `PPOTrainer` compute them; the critic's loss is [`masked_value_loss`].
//!   Both PPOs log their critic's [`explained_variance`].
//! - Preferences: [`dpo_loss`] (DPO, IPO, hinge, robust), [`kto_loss`] (KTO and unpaired
//!   APO-zero on completions labelled one at a time), [`bradley_terry_loss`] for reward
//!   models and [`step_label_loss`] for process reward models trained on step labels.
//! - Off-policy control: SAC's squashed-Gaussian policy ([`squashed_gaussian`]), soft target
//!   ([`soft_q_target`]), [`twin_critic_loss`], [`sac_actor_loss`] and entropy
//!   [`temperature_loss`]; TD3's [`smoothed_target_actions`], [`clipped_double_q_target`] and
//!   [`deterministic_actor_loss`]; target networks by [`polyak_update`]. The squashed
//!   Gaussian also on plain rows with its gradient by hand ([`squashed_gaussian_row`],
//!   [`squashed_gaussian_row_backward`]).
//! - [`FlatAdam`]: Adam over one flat `f32` buffer, the same steps as burn's `Adam`, for
//!   networks trained without autodiff.
//!
//! Estimators work on plain `f32` slices (property-testable without tensors); losses are burn
//! tensor functions generic over the backend.
//!
//! **Architecture invariant:** no knowledge of environments, plugins, models' structure or
//! training loops.

mod aggregation;
mod bradley_terry;
mod difficulty_weight;
mod distillation;
mod dpo;
mod entropy_coefficient;
mod explained_variance;
mod finite;
mod flat_adam;
mod gae;
mod gdpo;
mod gigpo;
mod grad_clip;
mod group_advantages;
mod implicit_prm;
mod kl;
mod kto;
mod lag_correction;
mod normalize;
#[cfg(test)]
mod pair_testing;
mod pass_at_k;
mod policy_loss;
mod polyak;
mod ppo_loss;
mod ppo_rows;
mod process_advantages;
mod running;
mod schedule;
mod soft_actor_critic;
mod squashed_rows;
mod step_labels;
mod td3;
mod token_advantages;
mod tree_advantages;

pub use aggregation::{Counted, aggregate, share_weight};
pub use bradley_terry::bradley_terry_loss;
pub use difficulty_weight::{difficulty_weight, reweight_by_difficulty};
pub use distillation::{add_teacher_advantages, full_reverse_kl};
pub use dpo::{DpoConfig, DpoLoss, DpoLossKind, dpo_loss};
pub use entropy_coefficient::EntropyCoefficient;
pub use explained_variance::explained_variance;
pub use finite::{non_finite_gradient, non_finite_parameter};
pub use flat_adam::{FlatAdam, StateSizeMismatch};
pub use gae::gae;
pub use gdpo::decoupled_normalized;
pub use gigpo::{GigpoConfig, TurnOutcome, gigpo_advantages};
pub use grad_clip::clip_grad_norm;
pub use group_advantages::{group_normalized, reinforce_pp, rloo, zero_variance};
pub use implicit_prm::{batch_normalized, implicit_prm_loss, implicit_token_rewards};
pub use kl::{kl_estimate, kl_estimate_scalar};
pub use kto::{KtoConfig, KtoLoss, KtoLossKind, kto_loss, kto_reference_point};
pub use lag_correction::{Corrected, Correction, lag_correction};
pub use normalize::normalize;
pub use pass_at_k::{best_of_group, pass_at_k};
pub use policy_loss::{PolicyLoss, PolicyLossConfig, PolicyObjective, policy_loss};
pub use polyak::polyak_update;
pub use ppo_loss::{PpoLoss, PpoLossConfig, PpoLossValues, Surrogate, masked_value_loss, ppo_loss, value_errors};
pub use ppo_rows::{
    categorical_row, categorical_row_backward, clipped_surrogate_rows, gaussian_entropy_row, gaussian_row,
    gaussian_row_backward, value_loss_rows,
};
pub use process_advantages::{TokenRewards, leave_one_out, process_advantages, token_returns};
pub use rein_core::{Aggregation, KlEstimator, RatioLevel, StdScaling};
pub use running::{RewardScaler, RunningMeanStd};
pub use schedule::{LinearSchedule, warmup_then_decay};
pub use soft_actor_critic::{
    LOG_STD_MAX, LOG_STD_MIN, SquashedSample, bounded_log_std, sac_actor_loss, soft_q_target, squashed_gaussian,
    temperature_loss, twin_critic_loss,
};
pub use squashed_rows::{squashed_gaussian_row, squashed_gaussian_row_backward};
pub use step_labels::{step_label_accuracy, step_label_loss};
pub use td3::{clipped_double_q_target, deterministic_actor_loss, smoothed_target_actions};
pub use token_advantages::{TokenAdvantages, masked_whiten, token_gae, token_rewards};
pub use tree_advantages::{Branch, tree_step_advantages};
