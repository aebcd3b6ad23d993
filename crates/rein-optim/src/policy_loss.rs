//! Policy-gradient losses for language-model RL, per completion token.
//!
//! ```text
//! w_it = π_θ(y_t|…) / π_old(y_t|…)                                    token level (PPO / GRPO)
//! w_it = exp( 1/|y_i| Σ_t log π_θ(y_t|…)/π_old(y_t|…) )               sequence level (GSPO, Zheng et al. 2025)
//!
//! the objective J_it, one of:
//! J_it = min( w_it Â_it, clip(w_it, 1 − ε_low, 1 + ε_high) Â_it )     clip: asymmetric (DAPO's clip-higher)
//! J_it = max( J_it, c Â_it )  when Â_it < 0                           … with dual clip (Ye et al. 2020), c > 1
//! J_it = sg[ min(w_it, ε_max) ] Â_it log π_θ(y_t|…)                   cispo (MiniMax-M1 2025, eq. 4; sg: stop-gradient)
//! J_it = (4 / τ_i) σ( τ_i (w_it − 1) ) Â_it,  τ_i = τ_pos if Â_it > 0 else τ_neg
//!                                                                      sapo (Gao et al. 2025, eq. 5)
//!
//! J_it ← J_it · 1[H_it ≥ q_{1−ρ}(H)]                                 top-entropy tokens only (Wang et al. 2025)
//! ℓ_it = −J_it + β w_it KL_it − c_ent H_it                            then aggregated over tokens
//! ```
//! `q_{1−ρ}(H)` is the (1 − ρ) quantile of the batch's completion-token entropies (linear
//! interpolation, as `torch.quantile`), so only the share ρ of tokens with the highest entropy
//! — the "forking" tokens of "Beyond the 80/20 rule" (ρ = 0.2) — carry the policy gradient; the
//! KL and entropy terms keep every token.
//! CISPO never drops a token's gradient (the clipped weight only scales it); SAPO's gate has slope
//! 1 at `w = 1`, as the unclipped ratio does, and fades smoothly as `w` moves away instead of
//! cutting off. The KL term is weighted by the importance ratio `w_it` when
//! `kl_importance_weighted` is set (DeepSeek-V3.2's unbiased reverse-KL gradient; TRL's default
//! `use_bias_correction_kl`). This is TRL's `GRPOTrainer` loss (`epsilon_low`, `epsilon_high`,
//! `importance_sampling_level`, `beta`, `loss_type` including `cispo` and `sapo`,
//! `sapo_temperature_pos`/`_neg`), plus dual-clip and an entropy bonus.

use burn::tensor::Tensor;
use burn::tensor::activation::sigmoid;
use burn::tensor::backend::Backend;
use rein_core::RatioLevel;

use crate::aggregation::aggregate;
use crate::kl::kl_estimate;
use rein_core::{Aggregation, KlEstimator};

/// The per-token objective (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum PolicyObjective {
    /// PPO's clipped surrogate, with [`PolicyLossConfig::clip_low`], `clip_high` and `dual_clip`.
    #[default]
    Clip,
    /// CISPO: the importance weight capped at `max_weight` (ε_max; TRL's `epsilon_high` with
    /// `loss_type = "cispo"`), held constant, scales `Â log π`.
    Cispo {
        /// ε_max.
        max_weight: f32,
    },
    /// SAPO: a sigmoid gate of temperature `temperature_pos` (positive advantages) or
    /// `temperature_neg` (the others).
    Sapo {
        /// τ_pos.
        temperature_pos: f32,
        /// τ_neg.
        temperature_neg: f32,
    },
}

/// The loss's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyLossConfig {
    /// Token or sequence ratios.
    pub level: RatioLevel,
    /// What is maximised per token.
    pub objective: PolicyObjective,
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
    /// ρ: the share of completion tokens, those of highest entropy, the objective is taken on
    /// (TRL's `top_entropy_quantile`); 1 keeps every token.
    pub top_entropy_quantile: f32,
}

/// The loss and what to log about it.
#[derive(Debug, Clone)]
pub struct PolicyLoss<B: Backend> {
    /// To minimise. `[1]`
    pub loss: Tensor<B, 1>,
    /// Fraction of completion tokens whose ratio was clipped (detached): by the clip, where it
    /// is active; by CISPO's cap, positive advantages only (TRL's `cispo_clip_ratio`); 0 with
    /// SAPO, which clips nothing. `[1]`
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
/// - `ref_log_prob`, `entropy`: `[batch, tokens]`, optional; `entropy` is needed when
///   `top_entropy_quantile < 1` (the call panics without it: the caller computes what its
///   config asks for)
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
    let adv = advantages.expand([batch, tokens]);
    let objective = match config.objective {
        PolicyObjective::Clip => clipped_surrogate(weight.clone(), adv.clone(), config),
        PolicyObjective::Cispo { max_weight } => {
            weight.clone().clamp_max(max_weight).detach() * adv.clone() * log_prob.clone()
        }
        PolicyObjective::Sapo {
            temperature_pos,
            temperature_neg,
        } => {
            let tau = adv
                .zeros_like()
                .add_scalar(temperature_neg)
                .mask_fill(adv.clone().greater_elem(0.0), temperature_pos);
            let gate = sigmoid(tau.clone() * weight.clone().sub_scalar(1.0)).mul_scalar(4.0) / tau;
            gate * adv.clone()
        }
    };
    let objective = match config.top_entropy_quantile < 1.0 {
        true => {
            let h = entropy
                .clone()
                .expect("policy_loss: top_entropy_quantile < 1 needs the entropies");
            objective * high_entropy_tokens(h.detach(), mask.clone(), config.top_entropy_quantile)
        }
        false => objective,
    };
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

    let tokens_total = mask.clone().sum().clamp_min(1.0);
    let clipped = clipped_tokens(weight.detach(), adv, config);
    let clip_frac = (clipped.float() * mask.clone()).sum().div(tokens_total.clone());
    let kl = kl.map(|k| (k.detach() * mask).sum().div(tokens_total));
    PolicyLoss { loss, clip_frac, kl }
}

/// PPO's clipped surrogate, with the dual clip when set.
fn clipped_surrogate<B: Backend>(weight: Tensor<B, 2>, adv: Tensor<B, 2>, config: &PolicyLossConfig) -> Tensor<B, 2> {
    let clipped = weight.clone().clamp(1.0 - config.clip_low, 1.0 + config.clip_high);
    let objective = (weight * adv.clone()).min_pair(clipped * adv.clone());
    let Some(c) = config.dual_clip else {
        return objective;
    };
    let floor = adv.clone().mul_scalar(c);
    let negative = adv.lower_elem(0.0);
    objective.clone().mask_where(negative, objective.max_pair(floor))
}

/// 1 on the completion tokens whose entropy is at least the batch's (1 − ρ) quantile, 0 elsewhere
/// (TRL's `get_high_entropy_mask`; with no completion token, none).
fn high_entropy_tokens<B: Backend>(entropy: Tensor<B, 2>, mask: Tensor<B, 2>, rho: f32) -> Tensor<B, 2> {
    let values = entropy
        .to_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("f32 entropies");
    let on = mask.to_data().convert::<f32>().to_vec::<f32>().expect("f32 mask");
    let mut kept: Vec<f32> = values
        .iter()
        .zip(&on)
        .filter(|(_, m)| **m > 0.0)
        .map(|(h, _)| *h)
        .collect();
    if kept.is_empty() {
        return mask.zeros_like();
    }
    kept.sort_by(f32::total_cmp);
    let threshold = quantile(&kept, 1.0 - rho);
    entropy.greater_equal_elem(threshold).float() * mask
}

/// The `q` quantile of ascending `sorted` by linear interpolation between the two nearest ranks,
/// computed as `torch.quantile` computes it (its `lerp`: from the nearer end).
fn quantile(sorted: &[f32], q: f32) -> f32 {
    let position = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f32;
    let below = position.floor() as usize;
    let above = (below + 1).min(sorted.len() - 1);
    let (start, end, weight) = (sorted[below], sorted[above], position - below as f32);
    match weight < 0.5 {
        true => start + weight * (end - start),
        false => end - (end - start) * (1.0 - weight),
    }
}

/// The tokens whose weight the objective clipped ([`PolicyLoss::clip_frac`]).
fn clipped_tokens<B: Backend>(
    weight: Tensor<B, 2>,
    adv: Tensor<B, 2>,
    config: &PolicyLossConfig,
) -> Tensor<B, 2, burn::tensor::Bool> {
    match config.objective {
        PolicyObjective::Clip => {
            let low = (weight.clone().lower_elem(1.0 - config.clip_low)).bool_and(adv.clone().lower_elem(0.0));
            let high = (weight.greater_elem(1.0 + config.clip_high)).bool_and(adv.greater_elem(0.0));
            low.bool_or(high)
        }
        PolicyObjective::Cispo { max_weight } => weight.greater_elem(max_weight).bool_and(adv.greater_elem(0.0)),
        PolicyObjective::Sapo { .. } => weight.zeros_like().greater_elem(0.0),
    }
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
            objective: PolicyObjective::Clip,
            clip_low: 0.2,
            clip_high: 0.28,
            dual_clip: None,
            aggregation,
            max_completion_len: 6,
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K3,
            kl_importance_weighted: false,
            entropy_coef: 0.0,
            top_entropy_quantile: 1.0,
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

    proptest! {
        #[test]
        fn cispo_scales_log_probabilities_by_the_capped_weight(
            logp in -4.0f32..-0.1, log_ratio in -1.0f32..1.0, adv in -3.0f32..3.0, cap in 0.5f32..2.0,
        ) {
            let cfg = PolicyLossConfig { objective: PolicyObjective::Cispo { max_weight: cap }, ..config(Aggregation::TokenMean) };
            let out = policy_loss(t2(&[logp], 1), t2(&[logp - log_ratio], 1), per_completion(&[adv]), t2(&[1.0], 1), None, None, &cfg);
            let expected = -log_ratio.exp().min(cap) * adv * logp;
            prop_assert!((out.loss.into_scalar() - expected).abs() < 1e-5 * (1.0 + expected.abs()));
            let capped = log_ratio.exp() > cap && adv > 0.0;
            prop_assert_eq!(out.clip_frac.into_scalar(), if capped { 1.0 } else { 0.0 });
        }

        #[test]
        fn sapos_gate_is_the_plain_ratio_to_first_order_and_picks_its_temperature_by_sign(
            log_ratio in -0.5f32..0.5, adv in -3.0f32..3.0,
        ) {
            prop_assume!(adv.abs() > 1e-3);
            let (pos, neg) = (1.0f32, 3.0f32);
            let cfg = PolicyLossConfig {
                objective: PolicyObjective::Sapo { temperature_pos: pos, temperature_neg: neg },
                ..config(Aggregation::TokenMean)
            };
            let out = policy_loss(t2(&[log_ratio], 1), t2(&[0.0], 1), per_completion(&[adv]), t2(&[1.0], 1), None, None, &cfg);
            let tau = if adv > 0.0 { pos } else { neg };
            let gate = 4.0 / tau / (1.0 + (-tau * (log_ratio.exp() - 1.0)).exp());
            prop_assert!((out.loss.into_scalar() + gate * adv).abs() < 1e-5);
            // At w = 1 the gate is 2/τ with slope 1: close to 1, it moves as 2/τ + (w − 1).
            let w = log_ratio.exp();
            prop_assert!((gate - (2.0 / tau + (w - 1.0))).abs() <= tau * tau * (w - 1.0).powi(2) + 1e-5);
            prop_assert_eq!(out.clip_frac.into_scalar(), 0.0);
        }

        #[test]
        fn the_top_entropy_mask_keeps_the_objective_on_the_highest_entropy_tokens(
            (b, logp, adv, mask) in batch(), entropy in prop::collection::vec(0.0f32..5.0, 24), rho in 0.05f32..1.0,
        ) {
            let entropy = entropy[..b * 6].to_vec();
            let cfg = |top_entropy_quantile| PolicyLossConfig { top_entropy_quantile, ..config(Aggregation::TokenMean) };
            let masked = policy_loss(t2(&logp, b), t2(&logp, b), per_completion(&adv), t2(&mask, b), None, Some(t2(&entropy, b)), &cfg(rho));
            // At w = 1 each token's objective is its advantage: the loss is minus the sum of the
            // kept tokens' advantages over all tokens.
            let mut kept: Vec<f32> = entropy.iter().zip(&mask).filter(|(_, m)| **m > 0.0).map(|(h, _)| *h).collect();
            kept.sort_by(f32::total_cmp);
            let threshold = quantile(&kept, 1.0 - rho);
            let expected: f32 = (0..b * 6)
                .filter(|&k| mask[k] > 0.0 && entropy[k] >= threshold)
                .map(|k| -adv[k / 6])
                .sum::<f32>() / kept.len() as f32;
            prop_assert!((masked.loss.into_scalar() - expected).abs() < 1e-5);
            let share = kept.iter().filter(|h| **h >= threshold).count() as f32 / kept.len() as f32;
            prop_assert!(share >= rho - 1.0 / kept.len() as f32 - 1e-6, "kept {share} of the tokens for ρ = {rho}");
        }
    }

    #[test]
    fn quantiles_interpolate_between_ranks_as_torch_does() {
        let sorted = [1.0f32, 2.0, 4.0, 8.0];
        for (q, expected) in [(0.0, 1.0), (1.0, 8.0), (0.5, 3.0), (0.8, 5.6), (1.0 / 3.0, 2.0)] {
            assert!(
                (quantile(&sorted, q) - expected).abs() < 1e-6,
                "q = {q}: {}",
                quantile(&sorted, q)
            );
        }
        assert_eq!(quantile(&[7.0], 0.3), 7.0);
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
