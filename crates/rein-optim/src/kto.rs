//! Kahneman–Tversky optimisation: learning from completions labelled desirable or undesirable
//! one at a time, with no pairs (Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect
//! Theoretic Optimization"), in the form of TRL's `KTOTrainer`.
//!
//! The implicit reward of a completion is, as in DPO, `r = log π_θ(y|x) − log π_ref(y|x)`
//! (summed over its tokens). KTO values it against a reference point `z₀`, the policy's KL
//! divergence from the reference, estimated on the batch's *mismatched* pairs `(x_i, y'_i)`
//! (each prompt with another example's completion), held fixed (no gradient) and clamped at 0:
//!
//! ```text
//! z₀ = max(0, mean_i (log π_θ(y'_i|x_i) − log π_ref(y'_i|x_i)))
//!
//! desirable y:    L = λ_D (1 − σ(β (r − z₀)))          (eq. 7)
//! undesirable y:  L = λ_U (1 − σ(β (z₀ − r)))
//! ```
//!
//! `λ_D` and `λ_U` (`desirable_weight`, `undesirable_weight`) balance data with unequal shares of
//! the two labels; the paper's eq. 8 asks for `λ_D n_D / (λ_U n_U)` in `[1, 4/3]`. The loss is the
//! mean over the batch's examples, both labels together.
//!
//! **APO-zero, unpaired** (D'Oosterlinck et al. 2024, "Anchored Preference Optimization", eq. 7
//! without pairs; TRL's `loss_type = "apo_zero_unpaired"`) drops the reference point: desirable
//! completions `1 − σ(β r)`, undesirable ones `σ(β r)`, so the first are pushed above the
//! reference's likelihood and the second below it.
//!
//! Both are `λ (1 − σ(β s (r − z₀)))` with `s = +1` for a desirable completion and `−1` for an
//! undesirable one, and `z₀ = 0` for APO-zero: that is how [`kto_loss`] computes them.

use burn::tensor::activation::sigmoid;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
pub use rein_core::KtoLossKind;

/// The settings of [`kto_loss`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KtoConfig {
    /// Which loss.
    pub kind: KtoLossKind,
    /// `β`: the strength of the pull toward the reference.
    pub beta: f32,
    /// `λ_D`, the weight of a desirable completion's loss.
    pub desirable_weight: f32,
    /// `λ_U`, the weight of an undesirable completion's loss.
    pub undesirable_weight: f32,
}

/// What [`kto_loss`] computed besides the loss.
#[derive(Debug, Clone)]
pub struct KtoLoss<B: Backend> {
    /// The mean over the examples.
    pub loss: Tensor<B, 1>,
    /// `β r` per example: its implicit reward (no gradient).
    pub rewards: Tensor<B, 1>,
    /// The reference point `z₀` the loss used (0 for APO-zero).
    pub kl: f32,
}

/// KTO's reference point `z₀`: the mean of the mismatched completions' log-ratios, clamped at 0
/// (see the module docs). `policy` and `reference` are each mismatched completion's summed
/// log-probability under the policy and under the reference.
pub fn kto_reference_point(policy: &[f32], reference: &[f32]) -> f32 {
    assert_eq!(
        policy.len(),
        reference.len(),
        "one reference log-probability per completion"
    );
    if policy.is_empty() {
        return 0.0;
    }
    let sum: f64 = (policy.iter().zip(reference)).map(|(p, r)| f64::from(p - r)).sum();
    ((sum / policy.len() as f64) as f32).max(0.0)
}

/// The KTO-family loss of a batch of labelled completions (see the module docs).
///
/// # Shapes
/// - `policy`: `[examples]`, the policy's log-probability of each completion, summed over its
///   tokens (the gradient flows through these)
/// - `reference`: `[examples]`, the reference's
/// - `desirable`: one label per example
/// - `kl`: the reference point from [`kto_reference_point`] (ignored by APO-zero)
pub fn kto_loss<B: Backend>(
    policy: Tensor<B, 1>,
    reference: Tensor<B, 1>,
    desirable: &[bool],
    kl: f32,
    config: &KtoConfig,
) -> KtoLoss<B> {
    let device = policy.device();
    let n = desirable.len();
    assert_eq!(policy.dims()[0], n, "one label per completion");
    let kl = match config.kind {
        KtoLossKind::Kto => kl,
        KtoLossKind::ApoZeroUnpaired => 0.0,
    };
    let column = |f: &dyn Fn(bool) -> f32| {
        let values: Vec<f32> = desirable.iter().map(|&d| f(d)).collect();
        Tensor::<B, 1>::from_data(TensorData::new(values, [n]), &device)
    };
    let sign = column(&|d| if d { 1.0 } else { -1.0 });
    let weight = column(&|d| match d {
        true => config.desirable_weight,
        false => config.undesirable_weight,
    });
    let beta = f64::from(config.beta);
    let log_ratio = policy - reference;
    let z = (log_ratio.clone().sub_scalar(kl) * sign).mul_scalar(beta);
    let per_example = sigmoid(z).neg().add_scalar(1.0) * weight;
    KtoLoss {
        loss: per_example.mean(),
        rewards: log_ratio.detach().mul_scalar(beta),
        kl,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pair_testing::{scalar, t};
    use proptest::prelude::*;

    fn sigmoid(x: f64) -> f64 {
        1.0 / (1.0 + (-x).exp())
    }

    fn config(kind: KtoLossKind) -> KtoConfig {
        KtoConfig {
            kind,
            beta: 0.3,
            desirable_weight: 1.5,
            undesirable_weight: 0.7,
        }
    }

    /// Each loss of a desirable and an undesirable completion written out in f64, against the
    /// tensor version.
    #[test]
    fn each_loss_matches_its_equation() {
        let (p, r) = ([-3.0f64, -5.0], [-3.5f64, -4.0]);
        let kl = 0.4f64;
        let (beta, wd, wu) = (0.3, 1.5, 0.7);
        let (r0, r1) = (p[0] - r[0], p[1] - r[1]);
        let expected = [
            (
                KtoLossKind::Kto,
                (wd * (1.0 - sigmoid(beta * (r0 - kl))) + wu * (1.0 - sigmoid(beta * (kl - r1)))) / 2.0,
            ),
            (
                KtoLossKind::ApoZeroUnpaired,
                (wd * (1.0 - sigmoid(beta * r0)) + wu * sigmoid(beta * r1)) / 2.0,
            ),
        ];
        for (kind, want) in expected {
            let policy = t(&[p[0] as f32, p[1] as f32]);
            let reference = t(&[r[0] as f32, r[1] as f32]);
            let out = kto_loss(policy, reference, &[true, false], kl as f32, &config(kind));
            assert!((scalar(out.loss) - want).abs() < 1e-6, "{kind:?}");
            let rewards = out.rewards.into_data().to_vec::<f32>().unwrap();
            assert!((f64::from(rewards[0]) - beta * r0).abs() < 1e-6);
            assert!((f64::from(rewards[1]) - beta * r1).abs() < 1e-6);
        }
    }

    /// The reference point is the mean mismatched log-ratio, never below 0.
    #[test]
    fn the_reference_point_is_the_clamped_mean_log_ratio() {
        assert!((kto_reference_point(&[-2.0, -4.0], &[-3.0, -4.5]) - 0.75).abs() < 1e-7);
        assert_eq!(kto_reference_point(&[-5.0, -4.0], &[-3.0, -4.5]), 0.0);
        assert_eq!(kto_reference_point(&[], &[]), 0.0);
    }

    proptest! {
        /// A desirable completion's loss falls as its log-ratio grows, an undesirable one's
        /// rises; a higher reference point raises the desirable loss and lowers the undesirable
        /// one (KTO only: APO-zero ignores it).
        #[test]
        fn losses_move_with_the_log_ratio_and_the_reference_point(
            p in -20.0f32..0.0, r in -20.0f32..0.0, kl in 0.0f32..3.0, step in 0.01f32..5.0,
        ) {
            for kind in [KtoLossKind::Kto, KtoLossKind::ApoZeroUnpaired] {
                let loss = |policy: f32, label: bool, kl: f32| {
                    scalar(kto_loss(t(&[policy]), t(&[r]), &[label], kl, &config(kind)).loss)
                };
                prop_assert!(loss(p + step, true, kl) <= loss(p, true, kl) + 1e-6);
                prop_assert!(loss(p + step, false, kl) >= loss(p, false, kl) - 1e-6);
                let (d0, d1) = (loss(p, true, kl), loss(p, true, kl + step));
                let (u0, u1) = (loss(p, false, kl), loss(p, false, kl + step));
                match kind {
                    KtoLossKind::Kto => {
                        prop_assert!(d1 >= d0 - 1e-6 && u1 <= u0 + 1e-6);
                    }
                    KtoLossKind::ApoZeroUnpaired => prop_assert!(d0 == d1 && u0 == u1),
                }
            }
        }
    }
}
