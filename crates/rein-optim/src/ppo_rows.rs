//! PPO's loss ([`ppo_loss`](crate::ppo_loss)) on plain rows, with its gradient by hand, for
//! actor-critics trained without autodiff. Per row `i` of `n`, with `ℓᵢ = log π_θ(aᵢ|sᵢ)`:
//!
//! ```text
//! rᵢ = exp(ℓᵢ − ℓᵢ_old)
//! L_clip  = 1/n Σ max(−Âᵢ rᵢ, −Âᵢ clip(rᵢ, 1 − ε, 1 + ε))
//!   ∂L_clip/∂ℓᵢ = −Âᵢ rᵢ / n   where the first term is the larger or rᵢ lies inside the clip range, else 0
//! L_value = ½ · 1/n Σ max((Vᵢ − Rᵢ)², (V_oldᵢ + clip(Vᵢ − V_oldᵢ, −ε, ε) − Rᵢ)²)
//!   ∂L_value/∂Vᵢ = (Vᵢ − Rᵢ) / n  where the first term is the larger or Vᵢ lies within ε of V_oldᵢ, else 0
//! ```
//!
//! and the two action heads' `ℓ` and entropy `H` on one row:
//!
//! ```text
//! categorical, logits z:  ℓ = z_a − logsumexp(z),  H = −Σ pⱼ log pⱼ
//!   ∂ℓ/∂zⱼ = [j = a] − pⱼ,   ∂H/∂zⱼ = −pⱼ (log pⱼ + H)
//! Gaussian, mean μ, log-std σ̃ (one per dimension d):  zᵈ = (aᵈ − μᵈ) e^{−σ̃ᵈ}
//!   ℓ = Σ_d −½ (zᵈ)² − σ̃ᵈ − ½ log 2π,   H = Σ_d σ̃ᵈ + ½ + ½ log 2π (the same on every row)
//!   ∂ℓ/∂μᵈ = zᵈ e^{−σ̃ᵈ},   ∂ℓ/∂σ̃ᵈ = (zᵈ)² − 1,   ∂H/∂σ̃ᵈ = 1
//! ```
//!
//! `L = L_clip − c_ent · mean(H) + c_v · L_value`; the caller chains `∂L/∂ℓ` and `∂L/∂H` into its
//! heads and `c_v · ∂L_value/∂V` into its critic.

use crate::ppo_loss::Surrogate;
use crate::soft_actor_critic::HALF_LOG_TWO_PI;

/// `L_clip` of the rows and its gradient `∂L_clip/∂ℓ` into `d_log_prob`.
///
/// All slices: one value per row.
pub fn clipped_surrogate_rows(
    log_prob: &[f32],
    old_log_prob: &[f32],
    advantages: &[f32],
    clip_coef: f32,
    d_log_prob: &mut [f32],
) -> Surrogate {
    let n = log_prob.len() as f32;
    let (mut loss, mut approx_kl, mut clipped) = (0.0f32, 0.0f32, 0usize);
    for i in 0..log_prob.len() {
        let log_ratio = log_prob[i] - old_log_prob[i];
        let ratio = log_ratio.exp();
        let unclipped = -advantages[i] * ratio;
        let bounded = ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef);
        let clip_part = -advantages[i] * bounded;
        loss += unclipped.max(clip_part);
        let inside = ratio > 1.0 - clip_coef && ratio < 1.0 + clip_coef;
        d_log_prob[i] = match unclipped >= clip_part || inside {
            true => -advantages[i] * ratio / n,
            false => 0.0,
        };
        approx_kl += (ratio - 1.0) - log_ratio;
        clipped += usize::from((ratio - 1.0).abs() > clip_coef);
    }
    Surrogate {
        loss: loss / n,
        approx_kl: approx_kl / n,
        clip_frac: clipped as f32 / n,
    }
}

/// `L_value` of the rows (clipped around `old_values` with `clip`) and its gradient
/// `∂L_value/∂V` into `d_values`.
///
/// All slices: one value per row.
pub fn value_loss_rows(
    values: &[f32],
    old_values: &[f32],
    returns: &[f32],
    clip: Option<f32>,
    d_values: &mut [f32],
) -> f32 {
    let n = values.len() as f32;
    let mut total = 0.0f32;
    for i in 0..values.len() {
        let error = values[i] - returns[i];
        let (squared, d) = match clip {
            None => (error * error, error),
            Some(eps) => {
                let step = values[i] - old_values[i];
                let clipped_error = old_values[i] + step.clamp(-eps, eps) - returns[i];
                let within = step > -eps && step < eps;
                match error * error >= clipped_error * clipped_error || within {
                    true => ((error * error).max(clipped_error * clipped_error), error),
                    false => (clipped_error * clipped_error, 0.0),
                }
            }
        };
        total += squared;
        d_values[i] = d / n;
    }
    total / n * 0.5
}

/// A categorical head on one row of `logits`: `(log π(action), H)`.
pub fn categorical_row(logits: &[f32], action: usize) -> (f32, f32) {
    let log_z = log_sum_exp(logits);
    let entropy = -logits
        .iter()
        .map(|&z| {
            let log_p = z - log_z;
            log_p.exp() * log_p
        })
        .sum::<f32>();
    (logits[action] - log_z, entropy)
}

/// The gradient of `d_log_prob · log π(action) + d_entropy · H` with respect to `logits`, into
/// `d_logits`.
pub fn categorical_row_backward(
    logits: &[f32],
    action: usize,
    (d_log_prob, d_entropy): (f32, f32),
    d_logits: &mut [f32],
) {
    let (_, entropy) = categorical_row(logits, action);
    let log_z = log_sum_exp(logits);
    for (j, (d, &z)) in d_logits.iter_mut().zip(logits).enumerate() {
        let log_p = z - log_z;
        let p = log_p.exp();
        let d_ell = f32::from(u8::from(j == action)) - p;
        *d = d_log_prob * d_ell - d_entropy * p * (log_p + entropy);
    }
}

/// A diagonal Gaussian head on one row: `log π(action)` under `mean` and `log_std`.
pub fn gaussian_row(mean: &[f32], log_std: &[f32], action: &[f32]) -> f32 {
    let mut log_prob = 0.0;
    for d in 0..mean.len() {
        let z = (action[d] - mean[d]) * (-log_std[d]).exp();
        log_prob += z * z * -0.5 - (log_std[d] + HALF_LOG_TWO_PI);
    }
    log_prob
}

/// The Gaussian head's entropy (every row's): `Σ_d σ̃ᵈ + ½ + ½ log 2π`.
pub fn gaussian_entropy_row(log_std: &[f32]) -> f32 {
    log_std.iter().map(|s| s + (0.5 + HALF_LOG_TWO_PI)).sum()
}

/// The gradient of `d_log_prob · log π(action)` with respect to `mean` (into `d_mean`) and to
/// `log_std` (added into `d_log_std`, which collects it over the rows).
pub fn gaussian_row_backward(
    mean: &[f32],
    log_std: &[f32],
    action: &[f32],
    d_log_prob: f32,
    d_mean: &mut [f32],
    d_log_std: &mut [f32],
) {
    for d in 0..mean.len() {
        let inv_std = (-log_std[d]).exp();
        let z = (action[d] - mean[d]) * inv_std;
        d_mean[d] = d_log_prob * z * inv_std;
        d_log_std[d] += d_log_prob * (z * z - 1.0);
    }
}

/// `log Σ exp(z)`, from the largest value.
fn log_sum_exp(z: &[f32]) -> f32 {
    let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    max + z.iter().map(|&v| (v - max).exp()).sum::<f32>().ln()
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{Int, Tensor, TensorData};
    use proptest::prelude::*;
    use rein_sampler::{categorical_entropy, categorical_log_prob, gaussian_entropy, gaussian_log_prob};

    use super::*;
    use crate::{PpoLossConfig, PpoLossValues, ppo_loss};

    type A = Autodiff<Flex>;

    fn t1(v: &[f32]) -> Tensor<A, 1> {
        Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), &Default::default())
    }

    fn t2(v: &[f32], cols: usize) -> Tensor<A, 2> {
        Tensor::from_data(TensorData::new(v.to_vec(), [v.len() / cols, cols]), &Default::default())
    }

    fn host<const D: usize>(t: Tensor<Flex, D>) -> Vec<f32> {
        t.into_data().to_vec().unwrap()
    }

    /// Within 1e-5 absolute and relative: a log-std gradient is an f32 mean over up to 39 rows
    /// of terms `(z² − 1)·∂ℓ` of order 1–10 that largely cancel, and its rounding in burn's order
    /// and ours reaches a few 1e-6 (3.2e-6 on a 20-row case proptest found).
    fn close(what: &str, ours: &[f32], burn: &[f32]) -> Result<(), TestCaseError> {
        prop_assert_eq!(ours.len(), burn.len());
        for (i, (a, b)) in ours.iter().zip(burn).enumerate() {
            prop_assert!((a - b).abs() <= 1e-5 + 1e-5 * b.abs(), "{what}[{i}]: {a} vs burn's {b}");
        }
        Ok(())
    }

    /// Per row: (advantage, old log-prob shift, old value, return).
    type Row = (f32, f32, f32, f32);

    /// A minibatch's rows, and the loss's coefficients (ε, clip the value loss, c_ent, c_v).
    fn rows() -> impl Strategy<Value = (Vec<Row>, f32, bool, f32, f32)> {
        (
            prop::collection::vec((-3.0f32..3.0, -0.6f32..0.6, -2.0f32..2.0, -2.0f32..2.0), 1..40),
            0.05f32..0.4,
            any::<bool>(),
            0.0f32..0.1,
            0.1f32..1.0,
        )
    }

    /// The loss parts burn computes, and the per-row values it computed them from.
    fn burn_loss(
        log_prob: Tensor<A, 1>,
        entropy: Tensor<A, 1>,
        values: Tensor<A, 1>,
        rows: &[Row],
        config: &PpoLossConfig,
        log_prob_now: &[f32],
    ) -> (crate::PpoLoss<A>, PpoLossValues) {
        let field = |f: fn(&Row) -> f32| rows.iter().map(f).collect::<Vec<f32>>();
        let old: Vec<f32> = log_prob_now.iter().zip(field(|r| r.1)).map(|(l, s)| l + s).collect();
        let loss = ppo_loss(
            log_prob,
            t1(&old),
            t1(&field(|r| r.0)),
            values,
            t1(&field(|r| r.2)),
            t1(&field(|r| r.3)),
            entropy,
            config,
        );
        let parts = loss.values();
        (loss, parts)
    }

    /// The loss by hand from the heads' per-row `ℓ`, `H` and the values: its parts, `∂L/∂ℓ`,
    /// `∂L/∂V`.
    fn by_hand(
        log_prob: &[f32],
        entropy: f32,
        values: &[f32],
        rows: &[Row],
        config: &PpoLossConfig,
    ) -> (PpoLossValues, Vec<f32>, Vec<f32>) {
        let n = rows.len();
        let old: Vec<f32> = log_prob.iter().zip(rows).map(|(l, r)| l + r.1).collect();
        let adv: Vec<f32> = rows.iter().map(|r| r.0).collect();
        let old_values: Vec<f32> = rows.iter().map(|r| r.2).collect();
        let returns: Vec<f32> = rows.iter().map(|r| r.3).collect();
        let (mut d_log_prob, mut d_values) = (vec![0.0; n], vec![0.0; n]);
        let surrogate = clipped_surrogate_rows(log_prob, &old, &adv, config.clip_coef, &mut d_log_prob);
        let clip = config.clip_vloss.then_some(config.clip_coef);
        let value = value_loss_rows(values, &old_values, &returns, clip, &mut d_values);
        d_values.iter_mut().for_each(|d| *d *= config.vf_coef);
        (
            PpoLossValues::from_parts(surrogate, value, entropy, config),
            d_log_prob,
            d_values,
        )
    }

    fn parts_close(ours: &PpoLossValues, burn: &PpoLossValues) -> Result<(), TestCaseError> {
        let pairs = [
            ("loss", ours.loss, burn.loss),
            ("policy", ours.policy, burn.policy),
            ("value", ours.value, burn.value),
            ("entropy", ours.entropy, burn.entropy),
            ("approx_kl", ours.approx_kl, burn.approx_kl),
            ("clip_frac", ours.clip_frac, burn.clip_frac),
        ];
        for (what, a, b) in pairs {
            close(what, &[a], &[b])?;
        }
        Ok(())
    }

    proptest! {
        /// A categorical actor's loss and gradients (logits, values) equal burn's autodiff through
        /// `categorical_log_prob`, `categorical_entropy` and `ppo_loss`.
        #[test]
        fn categorical_equals_burns_autodiff(
            (rows, clip_coef, clip_vloss, ent_coef, vf_coef) in rows(),
            actions in 2usize..5,
            seed in any::<u64>(),
        ) {
            let n = rows.len();
            let mut rng = rein_core::SeededRng::new(seed);
            let logits: Vec<f32> = (0..n * actions).map(|_| rng.normal() as f32).collect();
            let taken: Vec<usize> = (0..n).map(|_| (rng.uniform() * actions as f64) as usize % actions).collect();
            let values: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
            let config = PpoLossConfig { clip_coef, clip_vloss, ent_coef, vf_coef };

            let mut log_prob = vec![0.0; n];
            let mut entropy = vec![0.0; n];
            for i in 0..n {
                (log_prob[i], entropy[i]) = categorical_row(&logits[i * actions..(i + 1) * actions], taken[i]);
            }
            let mean_entropy = entropy.iter().sum::<f32>() / n as f32;
            let (ours, d_log_prob, d_values) = by_hand(&log_prob, mean_entropy, &values, &rows, &config);
            let mut d_logits = vec![0.0; n * actions];
            for i in 0..n {
                let at = i * actions..(i + 1) * actions;
                let upstream = (d_log_prob[i], -ent_coef / n as f32);
                categorical_row_backward(&logits[at.clone()], taken[i], upstream, &mut d_logits[at]);
            }

            let logits_t = t2(&logits, actions).require_grad();
            let values_t = t1(&values).require_grad();
            let taken_t = Tensor::<A, 1, Int>::from_data(
                TensorData::new(taken.iter().map(|&a| a as i64).collect::<Vec<_>>(), [n]),
                &Default::default(),
            );
            let burn_log_prob = categorical_log_prob(logits_t.clone(), taken_t);
            close("log π", &log_prob, &host(burn_log_prob.clone().inner()))?;
            let burn_entropy = categorical_entropy(logits_t.clone());
            close("H", &entropy, &host(burn_entropy.clone().inner()))?;
            let (loss, burns) = burn_loss(burn_log_prob, burn_entropy, values_t.clone(), &rows, &config, &log_prob);
            parts_close(&ours, &burns)?;
            let grads = loss.loss.backward();
            close("∂L/∂z", &d_logits, &host(logits_t.grad(&grads).unwrap()))?;
            close("∂L/∂V", &d_values, &host(values_t.grad(&grads).unwrap()))?;
        }

        /// A Gaussian actor's loss and gradients (means, log-std, values) equal burn's autodiff
        /// through `gaussian_log_prob`, `gaussian_entropy` and `ppo_loss`.
        #[test]
        fn gaussian_equals_burns_autodiff(
            (rows, clip_coef, clip_vloss, ent_coef, vf_coef) in rows(),
            dims in 1usize..4,
            seed in any::<u64>(),
        ) {
            let n = rows.len();
            let mut rng = rein_core::SeededRng::new(seed);
            let mean: Vec<f32> = (0..n * dims).map(|_| rng.normal() as f32).collect();
            let log_std: Vec<f32> = (0..dims).map(|_| rng.normal() as f32 * 0.5).collect();
            let action: Vec<f32> = (0..n * dims).map(|_| rng.normal() as f32 * 1.5).collect();
            let values: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
            let config = PpoLossConfig { clip_coef, clip_vloss, ent_coef, vf_coef };

            let log_prob: Vec<f32> = (0..n)
                .map(|i| gaussian_row(&mean[i * dims..(i + 1) * dims], &log_std, &action[i * dims..(i + 1) * dims]))
                .collect();
            let entropy = gaussian_entropy_row(&log_std);
            let (ours, d_log_prob, d_values) = by_hand(&log_prob, entropy, &values, &rows, &config);
            let mut d_mean = vec![0.0; n * dims];
            let mut d_log_std = vec![-ent_coef; dims];
            for (i, &d) in d_log_prob.iter().enumerate() {
                let at = i * dims..(i + 1) * dims;
                let (m, a) = (&mean[at.clone()], &action[at.clone()]);
                gaussian_row_backward(m, &log_std, a, d, &mut d_mean[at], &mut d_log_std);
            }

            let mean_t = t2(&mean, dims).require_grad();
            let log_std_t = t1(&log_std).require_grad();
            let values_t = t1(&values).require_grad();
            let burn_log_prob = gaussian_log_prob(mean_t.clone(), log_std_t.clone(), t2(&action, dims));
            close("log π", &log_prob, &host(burn_log_prob.clone().inner()))?;
            let burn_entropy = gaussian_entropy(log_std_t.clone());
            let (loss, burns) = burn_loss(burn_log_prob, burn_entropy, values_t.clone(), &rows, &config, &log_prob);
            parts_close(&ours, &burns)?;
            let grads = loss.loss.backward();
            close("∂L/∂μ", &d_mean, &host(mean_t.grad(&grads).unwrap()))?;
            close("∂L/∂σ̃", &d_log_std, &host(log_std_t.grad(&grads).unwrap()))?;
            close("∂L/∂V", &d_values, &host(values_t.grad(&grads).unwrap()))?;
        }
    }

    #[test]
    fn a_clipped_ratio_passes_no_gradient() {
        // Â > 0 and r = e^0.5 > 1.2: the clipped term is the larger (−1.2 Â > −r Â), so ℓ gets
        // no gradient; Â < 0 with the same r: the unclipped term is the larger and it does.
        let mut d = [0.0f32; 2];
        let s = clipped_surrogate_rows(&[0.5, 0.5], &[0.0, 0.0], &[1.0, -1.0], 0.2, &mut d);
        assert_eq!(d[0], 0.0);
        assert!((d[1] - 0.5f32.exp() / 2.0).abs() < 1e-6, "{}", d[1]);
        assert_eq!(s.clip_frac, 1.0);
        assert!((s.loss - (-1.2 + 0.5f32.exp()) / 2.0).abs() < 1e-6, "{}", s.loss);
    }
}
