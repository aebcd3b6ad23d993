//! Bradley–Terry reward models ([`bradley_terry_loss`]; Ouyang et al. 2022, eq. 1; TRL's
//! `RewardTrainer`): a scalar score `r(x, y)` of a completion `y` to a prompt `x`, trained on
//! pairs with `y_w` preferred to `y_l` so that
//!
//! ```text
//! L = −log σ(r(x, y_w) − r(x, y_l) − m) + c · (r(x, y_w) + r(x, y_l))²
//! ```
//!
//! with an optional per-pair margin `m` and the centering coefficient `c` of Eisenstein et al.
//! 2023 (rewards near zero mean), both averaged over the pairs.

use burn::tensor::Tensor;
use burn::tensor::activation::log_sigmoid;
use burn::tensor::backend::Backend;

/// The Bradley–Terry loss of a batch of pairs' scores (see the module docs): `margin` per pair
/// (zeros without one), `center_coef` the centering coefficient (0 for none).
///
/// # Shapes
/// - `chosen`, `rejected`, `margin`: `[pairs]` → `[1]`
pub fn bradley_terry_loss<B: Backend>(
    chosen: Tensor<B, 1>,
    rejected: Tensor<B, 1>,
    margin: Tensor<B, 1>,
    center_coef: f32,
) -> Tensor<B, 1> {
    let loss = log_sigmoid(chosen.clone() - rejected.clone() - margin).neg().mean();
    if center_coef == 0.0 {
        return loss;
    }
    loss + (chosen + rejected)
        .powi_scalar(2)
        .mean()
        .mul_scalar(f64::from(center_coef))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pair_testing::{log_sigmoid, scalar, t};
    use proptest::prelude::*;

    #[test]
    fn bradley_terry_is_the_negative_log_likelihood_of_the_preference() {
        let loss = bradley_terry_loss(t(&[2.0, 0.0]), t(&[1.0, 1.0]), t(&[0.5, 0.0]), 0.0);
        let want = -(log_sigmoid(0.5) + log_sigmoid(-1.0)) / 2.0;
        assert!((scalar(loss) - want).abs() < 1e-6);
        let centered = bradley_terry_loss(t(&[2.0, 0.0]), t(&[1.0, 1.0]), t(&[0.0, 0.0]), 0.01);
        let want = -(log_sigmoid(1.0) + log_sigmoid(-1.0)) / 2.0 + 0.01 * (9.0 + 1.0) / 2.0;
        assert!((scalar(centered) - want).abs() < 1e-6);
    }

    proptest! {
        /// Swapping chosen and rejected turns `−log σ(d)` into `−log σ(−d)`: the two differ by `d`.
        #[test]
        fn bradley_terry_swapped_differs_by_the_score_gap(a in -10.0f32..10.0, b in -10.0f32..10.0) {
            let forward = scalar(bradley_terry_loss(t(&[a]), t(&[b]), t(&[0.0]), 0.0));
            let swapped = scalar(bradley_terry_loss(t(&[b]), t(&[a]), t(&[0.0]), 0.0));
            prop_assert!((swapped - forward - f64::from(a - b)).abs() < 1e-4);
        }
    }
}
