//! Direct preference optimisation and its variants, learning from pairs of completions to one
//! prompt, `y_w` preferred to `y_l`.
//!
//! **Direct preference optimisation** ([`dpo_loss`]; Rafailov et al. 2023, "Direct Preference
//! Optimization: Your Language Model is Secretly a Reward Model"). The policy's implicit reward of
//! a completion is `β · log π_θ(y | x) / π_ref(y | x)`; with the log-ratio margin
//!
//! ```text
//! h = (log π_θ(y_w|x) − log π_ref(y_w|x)) − (log π_θ(y_l|x) − log π_ref(y_l|x))
//! ```
//!
//! (each `log π(y|x)` summed over the completion's tokens), the losses of TRL's `DPOTrainer`:
//!
//! ```text
//! sigmoid (DPO, eq. 7):          − log σ(β h)
//! hinge (SLiC, Zhao et al. 2023):   max(0, 1 − β h)
//! ipo (Azar et al. 2023, eq. 17):   (h̄ − 1/(2β))²        h̄: each log-ratio divided by its token count
//! robust (Chowdhury et al. 2024): (−(1−ε) log σ(β h) + ε log σ(−β h)) / (1 − 2ε)
//! ```
//!
//! `ε` is the label smoothing: the assumed share of pairs whose preference is flipped. Each
//! loss is averaged over the pairs. With a weight `w > 0` the loss gains the chosen
//! completions' negative log-likelihood per token (RPO, Pang et al. 2024, "Iterative Reasoning
//! Preference Optimization", eq. 1; TRL's `loss_type = ["sigmoid", "sft"]` with weights `[1, w]`),
//! which keeps DPO from lowering the likelihood of the preferred answers along with the others:
//!
//! ```text
//! L += w · (−Σ_i log π_θ(y_w,i | x_i) / Σ_i |y_w,i|)
//! ```

use burn::tensor::Tensor;
use burn::tensor::activation::log_sigmoid;
use burn::tensor::backend::Backend;
pub use rein_core::DpoLossKind;

/// The settings of [`dpo_loss`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DpoConfig {
    /// Which loss.
    pub kind: DpoLossKind,
    /// `β`: the strength of the pull toward the reference (IPO's `τ`).
    pub beta: f32,
    /// `ε`, the robust loss's assumed share of flipped labels (other losses ignore it).
    pub label_smoothing: f32,
    /// `w`, the weight of the chosen completions' negative log-likelihood (RPO); 0 for none.
    pub sft_weight: f32,
}

/// What [`dpo_loss`] computed besides the loss.
#[derive(Debug, Clone)]
pub struct DpoLoss<B: Backend> {
    /// The mean over the pairs.
    pub loss: Tensor<B, 1>,
    /// `β · (log π_θ(y_w) − log π_ref(y_w))` per pair: the implicit reward of the chosen completion.
    pub chosen_rewards: Tensor<B, 1>,
    /// The same for the rejected completion.
    pub rejected_rewards: Tensor<B, 1>,
}

/// The DPO-family loss of a batch of pairs (see the module docs).
///
/// # Shapes
/// - `chosen`, `rejected`: `[pairs]`, the policy's log-probabilities of each completion, summed
///   over its tokens (the gradient flows through these)
/// - `reference_chosen`, `reference_rejected`: `[pairs]`, the reference's
/// - `chosen_tokens`, `rejected_tokens`: `[pairs]`, each completion's token count (IPO)
pub fn dpo_loss<B: Backend>(
    chosen: Tensor<B, 1>,
    rejected: Tensor<B, 1>,
    reference_chosen: Tensor<B, 1>,
    reference_rejected: Tensor<B, 1>,
    [chosen_tokens, rejected_tokens]: [Tensor<B, 1>; 2],
    config: &DpoConfig,
) -> DpoLoss<B> {
    let beta = f64::from(config.beta);
    let (chosen_sum, chosen_count) = (chosen.clone().sum(), chosen_tokens.clone().sum());
    let chosen_ratio = chosen - reference_chosen;
    let rejected_ratio = rejected - reference_rejected;
    let margin = chosen_ratio.clone() - rejected_ratio.clone();
    let per_pair = match config.kind {
        DpoLossKind::Sigmoid => log_sigmoid(margin.mul_scalar(beta)).neg(),
        DpoLossKind::Hinge => margin.mul_scalar(-beta).add_scalar(1.0).clamp_min(0.0),
        DpoLossKind::Ipo => {
            let mean_margin = chosen_ratio.clone() / chosen_tokens.clamp_min(1.0)
                - rejected_ratio.clone() / rejected_tokens.clamp_min(1.0);
            mean_margin.sub_scalar(1.0 / (2.0 * beta)).powi_scalar(2)
        }
        DpoLossKind::Robust => {
            let eps = f64::from(config.label_smoothing);
            let clean = log_sigmoid(margin.clone().mul_scalar(beta)).mul_scalar(-(1.0 - eps));
            let flipped = log_sigmoid(margin.mul_scalar(-beta)).mul_scalar(-eps);
            (clean - flipped).div_scalar(1.0 - 2.0 * eps)
        }
    };
    let mut loss = per_pair.mean();
    if config.sft_weight != 0.0 {
        let nll = chosen_sum.neg() / chosen_count;
        loss = loss + nll.mul_scalar(f64::from(config.sft_weight));
    }
    DpoLoss {
        loss,
        chosen_rewards: chosen_ratio.detach().mul_scalar(beta),
        rejected_rewards: rejected_ratio.detach().mul_scalar(beta),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pair_testing::{log_sigmoid, scalar, t};
    use proptest::prelude::*;

    /// Each loss of one pair written out in f64, against the tensor version.
    #[test]
    fn each_loss_matches_its_equation() {
        let (c, r, rc, rr, nc, nr) = (-3.0, -5.0, -3.5, -4.0, 3.0, 5.0);
        let h: f64 = (c - rc) - (r - rr);
        let beta = 0.3;
        let eps = 0.2;
        let expected = [
            (DpoLossKind::Sigmoid, -log_sigmoid(beta * h)),
            (DpoLossKind::Hinge, (1.0 - beta * h).max(0.0)),
            (
                DpoLossKind::Ipo,
                ((c - rc) / nc - (r - rr) / nr - 1.0 / (2.0 * beta)).powi(2),
            ),
            (
                DpoLossKind::Robust,
                (-(1.0 - eps) * log_sigmoid(beta * h) + eps * log_sigmoid(-beta * h)) / (1.0 - 2.0 * eps),
            ),
        ];
        for (kind, want) in expected {
            let config = DpoConfig {
                kind,
                beta: beta as f32,
                label_smoothing: eps as f32,
                sft_weight: 0.0,
            };
            let out = dpo_loss(
                t(&[c as f32]),
                t(&[r as f32]),
                t(&[rc as f32]),
                t(&[rr as f32]),
                [t(&[nc as f32]), t(&[nr as f32])],
                &config,
            );
            assert!((scalar(out.loss) - want).abs() < 1e-6, "{kind:?}");
            assert!((scalar(out.chosen_rewards) - beta * (c - rc)).abs() < 1e-6);
            assert!((scalar(out.rejected_rewards) - beta * (r - rr)).abs() < 1e-6);
        }
    }

    /// RPO adds the chosen completions' negative log-likelihood per token.
    #[test]
    fn the_sft_weight_adds_the_chosen_tokens_mean_negative_log_likelihood() {
        let config = |sft_weight| DpoConfig {
            kind: DpoLossKind::Sigmoid,
            beta: 0.5,
            label_smoothing: 0.0,
            sft_weight,
        };
        let loss = |w| {
            let out = dpo_loss(
                t(&[-6.0, -2.0]),
                t(&[-5.0, -4.0]),
                t(&[-5.0, -3.0]),
                t(&[-5.0, -5.0]),
                [t(&[3.0, 1.0]), t(&[2.0, 2.0])],
                &config(w),
            );
            scalar(out.loss)
        };
        assert!((loss(0.5) - loss(0.0) - 0.5 * 8.0 / 4.0).abs() < 1e-6);
    }

    proptest! {
        /// The sigmoid, hinge and robust losses fall as the chosen completion gains probability
        /// over the rejected one (the robust loss's slope is `−β((1−ε)(1−σ) + εσ)/(1−2ε) < 0`);
        /// with no smoothing the robust loss is DPO's.
        #[test]
        fn losses_fall_as_the_margin_grows(
            c in -20.0f32..0.0, r in -20.0f32..0.0, rc in -20.0f32..0.0, rr in -20.0f32..0.0,
            step in 0.01f32..5.0, beta in 0.01f32..2.0, eps in 0.0f32..0.45,
        ) {
            for kind in [DpoLossKind::Sigmoid, DpoLossKind::Hinge, DpoLossKind::Robust, DpoLossKind::Ipo] {
                let config = DpoConfig { kind, beta, label_smoothing: eps, sft_weight: 0.0 };
                let loss = |chosen: f32| {
                    scalar(dpo_loss(t(&[chosen]), t(&[r]), t(&[rc]), t(&[rr]), [t(&[1.0]), t(&[1.0])], &config).loss)
                };
                let (before, after) = (loss(c), loss(c + step));
                match kind {
                    // IPO pulls the margin toward 1/(2β) from either side.
                    DpoLossKind::Ipo => {
                        let h = f64::from((c - rc) - (r - rr));
                        if h + f64::from(step) <= 1.0 / (2.0 * f64::from(beta)) {
                            prop_assert!(after <= before + 1e-4, "{kind:?}: {before} → {after}");
                        }
                    }
                    _ => prop_assert!(after <= before + 1e-5, "{kind:?}: {before} → {after}"),
                }
            }
            let dpo = DpoConfig { kind: DpoLossKind::Sigmoid, beta, label_smoothing: 0.0, sft_weight: 0.0 };
            let robust = DpoConfig { kind: DpoLossKind::Robust, ..dpo };
            let of = |config: &DpoConfig| {
                scalar(dpo_loss(t(&[c]), t(&[r]), t(&[rc]), t(&[rr]), [t(&[1.0]), t(&[1.0])], config).loss)
            };
            prop_assert!((of(&dpo) - of(&robust)).abs() < 1e-6);
        }
    }
}
