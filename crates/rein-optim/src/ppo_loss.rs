//! PPO's loss (Schulman et al. 2017, <https://arxiv.org/abs/1707.06347>), as in CleanRL's
//! `ppo.py`:
//!
//! ```text
//! r = exp(log π_θ(a|s) − log π_old(a|s))
//! L_clip  = mean( max(−Â r, −Â clip(r, 1 − ε, 1 + ε)) )
//! L_value = ½ mean( max((V − R)², (V_old + clip(V − V_old, −ε, ε) − R)²) )   (or unclipped; value_errors)
//! L = L_clip − c_ent · mean(H) + c_v · L_value
//! approx_kl = mean((r − 1) − log r)          (Schulman's k3 estimator, http://joschu.net/blog/kl-approx.html)
//! clip_frac = mean(|r − 1| > ε)
//! ```

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor};

/// Coefficients of the PPO loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PpoLossConfig {
    /// ε, the surrogate clipping range (and the value clipping range).
    pub clip_coef: f32,
    /// Clip the value loss around the old values.
    pub clip_vloss: bool,
    /// c_ent, the entropy bonus coefficient.
    pub ent_coef: f32,
    /// c_v, the value loss coefficient.
    pub vf_coef: f32,
}

/// The loss to minimise and its parts.
#[derive(Debug, Clone)]
pub struct PpoLoss<B: Backend> {
    /// `L`, to call `backward` on. `[1]`
    pub loss: Tensor<B, 1>,
    /// `L_clip`. `[1]`
    pub policy: Tensor<B, 1>,
    /// `L_value`. `[1]`
    pub value: Tensor<B, 1>,
    /// `mean(H)`. `[1]`
    pub entropy: Tensor<B, 1>,
    /// Approximate KL(π_old ‖ π_θ) (detached). `[1]`
    pub approx_kl: Tensor<B, 1>,
    /// Fraction of samples whose ratio was clipped (detached). `[1]`
    pub clip_frac: Tensor<B, 1>,
}

/// The parts of a minibatch's PPO loss as numbers, as [`PpoLoss`] holds them as tensors.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PpoLossValues {
    /// `L`.
    pub loss: f32,
    /// `L_clip`.
    pub policy: f32,
    /// `L_value`.
    pub value: f32,
    /// `mean(H)`.
    pub entropy: f32,
    /// `mean((r − 1) − log r)`.
    pub approx_kl: f32,
    /// Fraction of rows whose ratio lies outside the clip range.
    pub clip_frac: f32,
}

/// The clipped surrogate's statistics, computed on rows
/// ([`clipped_surrogate_rows`](crate::clipped_surrogate_rows)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Surrogate {
    /// `L_clip`.
    pub loss: f32,
    /// `mean((r − 1) − log r)`.
    pub approx_kl: f32,
    /// Fraction of rows with `|r − 1| > ε`.
    pub clip_frac: f32,
}

impl PpoLossValues {
    /// `L = L_clip − c_ent · mean(H) + c_v · L_value` from its parts, computed on rows
    /// ([`clipped_surrogate_rows`](crate::clipped_surrogate_rows),
    /// [`value_loss_rows`](crate::value_loss_rows)).
    pub fn from_parts(surrogate: Surrogate, value: f32, entropy: f32, config: &PpoLossConfig) -> Self {
        Self {
            loss: surrogate.loss - entropy * config.ent_coef + value * config.vf_coef,
            policy: surrogate.loss,
            value,
            entropy,
            approx_kl: surrogate.approx_kl,
            clip_frac: surrogate.clip_frac,
        }
    }
}

impl<B: Backend> PpoLoss<B> {
    /// The parts as numbers.
    pub fn values(&self) -> PpoLossValues {
        let scalar = |t: &Tensor<B, 1>| -> f32 { t.clone().into_scalar().elem() };
        PpoLossValues {
            loss: scalar(&self.loss),
            policy: scalar(&self.policy),
            value: scalar(&self.value),
            entropy: scalar(&self.entropy),
            approx_kl: scalar(&self.approx_kl),
            clip_frac: scalar(&self.clip_frac),
        }
    }
}

/// Computes the PPO loss for a minibatch.
///
/// # Shapes
/// All inputs `[batch]`: new and old log-probabilities of the taken actions, advantages,
/// new and old value estimates, returns, and the policy entropy at each state.
#[allow(clippy::too_many_arguments)]
pub fn ppo_loss<B: Backend>(
    new_log_prob: Tensor<B, 1>,
    old_log_prob: Tensor<B, 1>,
    advantages: Tensor<B, 1>,
    new_values: Tensor<B, 1>,
    old_values: Tensor<B, 1>,
    returns: Tensor<B, 1>,
    entropy: Tensor<B, 1>,
    config: &PpoLossConfig,
) -> PpoLoss<B> {
    let eps = config.clip_coef;
    let log_ratio = new_log_prob - old_log_prob;
    let ratio = log_ratio.clone().exp();

    let pg_loss1 = advantages.clone().neg() * ratio.clone();
    let pg_loss2 = advantages.neg() * ratio.clone().clamp(1.0 - eps, 1.0 + eps);
    let policy = pg_loss1.max_pair(pg_loss2).mean();

    let clip = config.clip_vloss.then_some(eps);
    let value = value_errors(new_values, old_values, returns, clip)
        .mean()
        .mul_scalar(0.5);

    let entropy = entropy.mean();
    let loss = policy.clone() - entropy.clone().mul_scalar(config.ent_coef) + value.clone().mul_scalar(config.vf_coef);

    let ratio = ratio.detach();
    let approx_kl = ((ratio.clone() - 1.0) - log_ratio.detach()).mean();
    let clip_frac = (ratio - 1.0).abs().greater_elem(eps).float().mean();
    PpoLoss {
        loss,
        policy,
        value,
        entropy,
        approx_kl,
        clip_frac,
    }
}

/// The critic's squared errors, before they are averaged: `(V − R)²`, or with a clip range `ε`
/// the larger of that and `(V_old + clip(V − V_old, −ε, ε) − R)²`, so that a step cannot gain by
/// moving a value further than `ε` from the value it had when the batch was collected. Any
/// shape: `[batch]` on environments, `[rows, tokens]` on completions (where the caller takes the
/// masked mean).
pub fn value_errors<B: Backend, const D: usize>(
    new_values: Tensor<B, D>,
    old_values: Tensor<B, D>,
    returns: Tensor<B, D>,
    clip: Option<f32>,
) -> Tensor<B, D> {
    let unclipped = (new_values.clone() - returns.clone()).powi_scalar(2);
    match clip {
        Some(eps) => {
            let v_clipped = old_values.clone() + (new_values - old_values).clamp(-eps, eps);
            unclipped.max_pair((v_clipped - returns).powi_scalar(2))
        }
        None => unclipped,
    }
}

/// PPO's value loss on completions, `½ Σ m · value_errors / Σ m` over the counted tokens (TRL's
/// `0.5 * masked_mean(vf_loss_max, mask)`).
///
/// # Shapes
/// All `[rows, tokens]` → `[1]`.
pub fn masked_value_loss<B: Backend>(
    new_values: Tensor<B, 2>,
    old_values: Tensor<B, 2>,
    returns: Tensor<B, 2>,
    mask: Tensor<B, 2>,
    clip: Option<f32>,
) -> Tensor<B, 1> {
    let errors = value_errors(new_values, old_values, returns, clip);
    (errors * mask.clone())
        .sum()
        .div(mask.sum().clamp_min(1.0))
        .mul_scalar(0.5)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::TensorData;
    use proptest::prelude::*;

    type B = Flex;

    fn t(v: &[f32]) -> Tensor<B, 1> {
        Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), &Default::default())
    }

    fn scalar(x: Tensor<B, 1>) -> f32 {
        x.into_scalar()
    }

    const CONFIG: PpoLossConfig = PpoLossConfig {
        clip_coef: 0.2,
        clip_vloss: true,
        ent_coef: 0.0,
        vf_coef: 0.0,
    };

    proptest! {
        #[test]
        fn ratio_one_gives_the_unclipped_surrogate(
            samples in prop::collection::vec((-5.0f32..5.0, -3.0f32..0.0), 1..64),
        ) {
            let adv: Vec<f32> = samples.iter().map(|s| s.0).collect();
            let logp: Vec<f32> = samples.iter().map(|s| s.1).collect();
            let zeros = vec![0.0; adv.len()];
            let out = ppo_loss(t(&logp), t(&logp), t(&adv), t(&zeros), t(&zeros), t(&zeros), t(&zeros), &CONFIG);
            let mean_adv = adv.iter().sum::<f32>() / adv.len() as f32;
            prop_assert!((scalar(out.policy) + mean_adv).abs() < 1e-5);
            prop_assert!(scalar(out.approx_kl).abs() < 1e-7);
            prop_assert_eq!(scalar(out.clip_frac), 0.0);
        }

        #[test]
        fn clipping_never_gains_beyond_the_clip_range(adv in -5.0f32..5.0, log_ratio in -2.0f32..2.0) {
            // The per-sample objective −L_clip = min(r Â, clip(r) Â) is at most (1 ± ε) Â.
            let out = ppo_loss(t(&[log_ratio]), t(&[0.0]), t(&[adv]), t(&[0.0]), t(&[0.0]), t(&[0.0]), t(&[0.0]), &CONFIG);
            let objective = -scalar(out.policy);
            let bound = if adv >= 0.0 { 1.2 * adv } else { 0.8 * adv };
            prop_assert!(objective <= bound + 1e-5, "objective {objective} > bound {bound}");
            prop_assert!(objective <= log_ratio.exp() * adv + 1e-5, "never above the unclipped surrogate");
        }
    }

    #[test]
    fn value_loss_clips_around_the_old_values() {
        // V moved from 0 to 1 towards R = 2; the clipped estimate stays at 0.2, so the larger
        // (clipped) error counts: ½ (0.2 − 2)² = 1.62.
        let config = PpoLossConfig { vf_coef: 1.0, ..CONFIG };
        let out = ppo_loss(
            t(&[0.0]),
            t(&[0.0]),
            t(&[0.0]),
            t(&[1.0]),
            t(&[0.0]),
            t(&[2.0]),
            t(&[0.0]),
            &config,
        );
        assert!((scalar(out.value) - 1.62).abs() < 1e-5);
        let unclipped = PpoLossConfig {
            clip_vloss: false,
            ..config
        };
        let out = ppo_loss(
            t(&[0.0]),
            t(&[0.0]),
            t(&[0.0]),
            t(&[1.0]),
            t(&[0.0]),
            t(&[2.0]),
            t(&[0.0]),
            &unclipped,
        );
        assert!((scalar(out.value) - 0.5).abs() < 1e-6);
    }

    #[test]
    fn total_combines_the_parts_and_stats_are_right() {
        let config = PpoLossConfig {
            clip_coef: 0.2,
            clip_vloss: false,
            ent_coef: 0.01,
            vf_coef: 0.5,
        };
        let log_ratio = [0.5f32, -0.1];
        let out = ppo_loss(
            t(&log_ratio),
            t(&[0.0, 0.0]),
            t(&[1.0, -1.0]),
            t(&[1.0, 1.0]),
            t(&[0.0, 0.0]),
            t(&[0.0, 0.0]),
            t(&[0.7, 0.9]),
            &config,
        );
        let total = scalar(out.loss);
        let parts = scalar(out.policy) - 0.01 * scalar(out.entropy) + 0.5 * scalar(out.value);
        assert!((total - parts).abs() < 1e-6);
        assert_eq!(scalar(out.clip_frac), 0.5);
        let kl: f32 = log_ratio.iter().map(|l| (l.exp() - 1.0) - l).sum::<f32>() / 2.0;
        assert!((scalar(out.approx_kl) - kl).abs() < 1e-6);
    }
}
