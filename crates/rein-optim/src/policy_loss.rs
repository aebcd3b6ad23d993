//! Policy-gradient losses for language-model RL, per completion token.
//!
//! ```text
//! w_it = π_θ(y_t|…) / π_old(y_t|…)                                    token level (PPO / GRPO)
//! w_it = exp( 1/|y_i| Σ_t log π_θ(y_t|…)/π_old(y_t|…) )               sequence level (GSPO, Zheng et al. 2025)
//! J_it = min( w_it Â_it, clip(w_it, 1 − ε_low, 1 + ε_high) Â_it )     asymmetric clip (DAPO's clip-higher)
//! J_it = max( J_it, c Â_it )  when Â_it < 0                           dual clip (Ye et al. 2020), c > 1
//! ℓ_it = −J_it + β w_it KL_it − c_ent H_it                            then aggregated over tokens
//! ```
//! The KL term is weighted by the importance ratio `w_it` when `kl_importance_weighted` is set
//! (DeepSeek-V3.2's unbiased reverse-KL gradient; TRL's default `use_bias_correction_kl`).
//! This is TRL's `GRPOTrainer` loss (`epsilon_low`, `epsilon_high`, `importance_sampling_level`,
//! `beta`, `loss_type`), plus dual-clip and an entropy bonus.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use rein_core::RatioLevel;

use crate::aggregation::aggregate;
use crate::kl::kl_estimate;
use rein_core::{Aggregation, KlEstimator};

/// The loss's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyLossConfig {
    /// Token or sequence ratios.
    pub level: RatioLevel,
    /// ε_low.
    pub clip_low: f32,
    /// ε_high (= ε_low for symmetric PPO clipping; 0.28 in DAPO).
    pub clip_high: f32,
    /// Dual-clip constant c (> 1) for negative advantages.
    pub dual_clip: Option<f32>,
    /// How per-token losses are reduced.
    pub aggregation: Aggregation,
    /// L_max for [`Aggregation::SeqMeanTokenSumNorm`].
    pub max_completion_len: usize,
    /// β, the KL penalty in the loss (0 disables it).
    pub kl_coef: f32,
    /// Which KL estimator.
    pub kl_estimator: KlEstimator,
    /// Multiply the KL term by the importance ratio (TRL's `use_bias_correction_kl`).
    pub kl_importance_weighted: bool,
    /// Entropy bonus coefficient.
    pub entropy_coef: f32,
}

/// The loss and what to log about it.
#[derive(Debug, Clone)]
pub struct PolicyLoss<B: Backend> {
    /// To minimise. `[1]`
    pub loss: Tensor<B, 1>,
    /// Fraction of completion tokens whose ratio was clipped (detached). `[1]`
    pub clip_frac: Tensor<B, 1>,
    /// Mean per-token KL to the reference (detached), when a reference was given. `[1]`
    pub kl: Option<Tensor<B, 1>>,
}

/// Computes the policy loss for a batch of completions.
///
/// # Shapes
/// - `log_prob`, `old_log_prob`, `mask` (1 on completion tokens, 0 on padding): `[batch, tokens]`
/// - `advantages`: `[batch, 1]` (one per completion, the GRPO family) or `[batch, tokens]` (one
///   per token, GiGPO's per-turn advantages)
/// - `ref_log_prob`, `entropy`: `[batch, tokens]`, optional
#[allow(clippy::too_many_arguments)]
pub fn policy_loss<B: Backend>(
    log_prob: Tensor<B, 2>,
    old_log_prob: Tensor<B, 2>,
    advantages: Tensor<B, 2>,
    mask: Tensor<B, 2>,
    ref_log_prob: Option<Tensor<B, 2>>,
    entropy: Option<Tensor<B, 2>>,
    config: &PolicyLossConfig,
) -> PolicyLoss<B> {
    let [batch, tokens] = log_prob.dims();
    let log_ratio = log_prob.clone() - old_log_prob;
    let log_weight = match config.level {
        RatioLevel::Token => log_ratio,
        RatioLevel::Sequence => {
            let per_seq = (log_ratio * mask.clone())
                .sum_dim(1)
                .div(mask.clone().sum_dim(1).clamp_min(1.0));
            per_seq.expand([batch, tokens])
        }
    };
    let weight = log_weight.exp();
    let clipped = weight.clone().clamp(1.0 - config.clip_low, 1.0 + config.clip_high);
    let adv = advantages.expand([batch, tokens]);
    let mut objective = (weight.clone() * adv.clone()).min_pair(clipped * adv.clone());
    if let Some(c) = config.dual_clip {
        let floor = adv.clone().mul_scalar(c);
        let negative = adv.clone().lower_elem(0.0);
        objective = objective.clone().mask_where(negative, objective.max_pair(floor));
    }
    let mut per_token = objective.neg();
    let kl = ref_log_prob.map(|reference| kl_estimate(log_prob, reference, config.kl_estimator));
    if let Some(kl) = &kl
        && config.kl_coef != 0.0
    {
        let term = if config.kl_importance_weighted {
            kl.clone() * weight.clone()
        } else {
            kl.clone()
        };
        per_token = per_token + term.mul_scalar(config.kl_coef);
    }
    if let Some(h) = entropy
        && config.entropy_coef != 0.0
    {
        per_token = per_token - h.mul_scalar(config.entropy_coef);
    }
    let loss = aggregate(per_token, mask.clone(), config.aggregation, config.max_completion_len);

    let weight = weight.detach();
    let low = weight
        .clone()
        .lower_elem(1.0 - config.clip_low)
        .bool_and(adv.clone().lower_elem(0.0));
    let high = weight
        .greater_elem(1.0 + config.clip_high)
        .bool_and(adv.greater_elem(0.0));
    let tokens_total = mask.clone().sum().clamp_min(1.0);
    let clip_frac = (low.bool_or(high).float() * mask.clone())
        .sum()
        .div(tokens_total.clone());
    let kl = kl.map(|k| (k.detach() * mask).sum().div(tokens_total));
    PolicyLoss { loss, clip_frac, kl }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::TensorData;
    use proptest::prelude::*;

    type B = Flex;

    fn t2(v: &[f32], rows: usize) -> Tensor<B, 2> {
        Tensor::from_data(TensorData::new(v.to_vec(), [rows, v.len() / rows]), &Default::default())
    }

    /// One advantage per completion, `[batch, 1]`.
    fn per_completion(v: &[f32]) -> Tensor<B, 2> {
        Tensor::from_data(TensorData::new(v.to_vec(), [v.len(), 1]), &Default::default())
    }

    fn config(aggregation: Aggregation) -> PolicyLossConfig {
        PolicyLossConfig {
            level: RatioLevel::Token,
            clip_low: 0.2,
            clip_high: 0.28,
            dual_clip: None,
            aggregation,
            max_completion_len: 6,
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K3,
            kl_importance_weighted: false,
            entropy_coef: 0.0,
        }
    }

    /// Random batches: 2–4 completions of up to 6 tokens with at least one token each.
    fn batch() -> impl Strategy<Value = (usize, Vec<f32>, Vec<f32>, Vec<f32>)> {
        (2usize..5).prop_flat_map(|b| {
            (
                Just(b),
                prop::collection::vec(-4.0f32..0.0, b * 6),
                prop::collection::vec(-3.0f32..3.0, b),
                prop::collection::vec(1usize..=6, b),
            )
                .prop_map(|(b, logp, adv, lens)| {
                    let mask = (0..b * 6)
                        .map(|k| if k % 6 < lens[k / 6] { 1.0 } else { 0.0 })
                        .collect();
                    (b, logp, adv, mask)
                })
        })
    }

    proptest! {
        #[test]
        fn ratio_one_without_kl_is_minus_the_mean_advantage((b, logp, adv, mask) in batch()) {
            for aggregation in [Aggregation::TokenMean, Aggregation::SeqMeanTokenMean, Aggregation::SeqMeanTokenSumNorm] {
                for level in [RatioLevel::Token, RatioLevel::Sequence] {
                    let cfg = PolicyLossConfig { level, ..config(aggregation) };
                    let out = policy_loss(t2(&logp, b), t2(&logp, b), per_completion(&adv), t2(&mask, b), None, None, &cfg);
                    let lens: Vec<f32> = mask.chunks(6).map(|m| m.iter().sum()).collect();
                    let expected = match aggregation {
                        Aggregation::TokenMean => -adv.iter().zip(&lens).map(|(a, l)| a * l).sum::<f32>() / lens.iter().sum::<f32>(),
                        Aggregation::SeqMeanTokenMean => -adv.iter().sum::<f32>() / b as f32,
                        Aggregation::SeqMeanTokenSumNorm => -adv.iter().zip(&lens).map(|(a, l)| a * l).sum::<f32>() / (b * 6) as f32,
                    };
                    prop_assert!((out.loss.into_scalar() - expected).abs() < 1e-5, "{aggregation:?} {level:?}");
                    prop_assert_eq!(out.clip_frac.into_scalar(), 0.0);
                }
            }
        }

        #[test]
        fn clip_higher_never_clips_positive_advantages_below_one_plus_clip_high(
            log_ratio in -0.5f32..0.5, adv in 0.01f32..3.0,
        ) {
            // Below 1 + ε_high, a positive-advantage token keeps its unclipped objective w Â.
            let w = log_ratio.exp();
            prop_assume!(w <= 1.28);
            let out = policy_loss(t2(&[log_ratio], 1), t2(&[0.0], 1), per_completion(&[adv]), t2(&[1.0], 1), None, None, &config(Aggregation::TokenMean));
            prop_assert!((out.loss.into_scalar() + w * adv).abs() < 1e-5);
            prop_assert_eq!(out.clip_frac.into_scalar(), 0.0);
        }

        #[test]
        fn dual_clip_bounds_the_loss_of_negative_advantages(log_ratio in 0.0f32..4.0, adv in -3.0f32..-0.01) {
            let cfg = PolicyLossConfig { dual_clip: Some(3.0), ..config(Aggregation::TokenMean) };
            let out = policy_loss(t2(&[log_ratio], 1), t2(&[0.0], 1), per_completion(&[adv]), t2(&[1.0], 1), None, None, &cfg);
            prop_assert!(out.loss.into_scalar() <= -3.0 * adv + 1e-4);
        }
    }

    #[test]
    fn the_kl_term_and_entropy_bonus_enter_the_loss() {
        let cfg = PolicyLossConfig {
            kl_coef: 0.5,
            entropy_coef: 0.1,
            ..config(Aggregation::TokenMean)
        };
        let (logp, reference) = ([-1.0f32, -2.0], [-1.5f32, -1.0]);
        let out = policy_loss(
            t2(&logp, 1),
            t2(&logp, 1),
            per_completion(&[0.0]),
            t2(&[1.0, 1.0], 1),
            Some(t2(&reference, 1)),
            Some(t2(&[0.3, 0.7], 1)),
            &cfg,
        );
        let k3: Vec<f32> = logp
            .iter()
            .zip(&reference)
            .map(|(p, r)| (r - p).exp() - 1.0 - (r - p))
            .collect();
        let expected = 0.5 * (k3[0] + k3[1]) / 2.0 - 0.1 * 0.5;
        assert!((out.loss.into_scalar() - expected).abs() < 1e-6);
        assert!((out.kl.unwrap().into_scalar() - (k3[0] + k3[1]) / 2.0).abs() < 1e-6);
    }
}
