//! PRIME's implicit process reward model (Cui et al. 2025, "Process Reinforcement through
//! Implicit Rewards"; Yuan et al. 2024, "Free Process Rewards without Process Labels"; verl's
//! `recipe/prime`, `prime_core_algos.py` and `prime_dp_rm.py`): a causal LM `π_φ` trained only
//! on outcome labels, whose log-ratio to a frozen reference on each token is a reward for that
//! token.
//!
//! With `q_t = log π_φ(y_t | y_<t) − log π_ref(y_t | y_<t)` on a completion's tokens, the model
//! is trained with the cross entropy of the whole completion's implicit reward against its
//! outcome `acc ∈ [0, 1]` ([`implicit_prm_loss`], verl's `compute_ce_dpo_loss_rm`):
//!
//! ```text
//! L = mean_i BCE(σ(β Σ_t q_it), acc_i)
//! ```
//!
//! and its token rewards for the policy are ([`implicit_token_rewards`], verl's
//! `_forward_micro_batch` with `lambda`, `prime_use_gt` and `prime_granularity = "token"`):
//!
//! ```text
//! r_t = β q_t                                       (λ = 0)
//! r_t = Σ_{t' ≥ t} λ^{t'−t} β q_t'                  (λ > 0; with the outcome, the last token's
//!                                                    β q is replaced by acc − Σ_{t<T} β q_t)
//! ```
//!
//! kept on every token but the last (the outcome's), then scaled by the batch's largest absolute
//! return ([`batch_normalized`], `prime_norm = "batch_norm"`):
//! `r ← r / (max_{i,t} |Σ_{t' ≥ t} r_it'| + 1e-6)`. They are a source of
//! [`crate::process_advantages`].
//!
//! Completions are rows of `width` tokens, each with its length (its tokens first).

use burn::tensor::Tensor;
use burn::tensor::TensorData;
use burn::tensor::activation::log_sigmoid;
use burn::tensor::backend::Backend;

/// The implicit PRM's loss (see the module docs) from each completion's summed log-ratio
/// `Σ_t q_t` and its outcome in `[0, 1]`. `log σ` is clamped at −100, as torch's
/// `binary_cross_entropy` clamps its logarithms.
///
/// # Shapes
/// - `log_ratio_sums`: `[rows]`, `outcomes`: `rows` → `[1]`
pub fn implicit_prm_loss<B: Backend>(log_ratio_sums: Tensor<B, 1>, outcomes: &[f32], beta: f32) -> Tensor<B, 1> {
    let [rows] = log_ratio_sums.dims();
    assert_eq!(
        rows,
        outcomes.len(),
        "implicit_prm_loss: {rows} sums for {} outcomes",
        outcomes.len()
    );
    let device = log_ratio_sums.device();
    let acc = Tensor::<B, 1>::from_data(TensorData::new(outcomes.to_vec(), [rows]), &device);
    let logits = log_ratio_sums.mul_scalar(beta);
    let log_p = log_sigmoid(logits.clone()).clamp_min(-100.0);
    let log_not_p = log_sigmoid(logits.neg()).clamp_min(-100.0);
    let nll = acc.clone() * log_p + acc.neg().add_scalar(1.0) * log_not_p;
    nll.mean().neg()
}

/// The implicit PRM's token rewards (see the module docs), `[rows, width]`: `log_ratios` `q`
/// laid out so, each row's first `lengths[i]` tokens its completion's; `outcomes` replace the
/// last token's `β q` when given (PRIME's `prime_use_gt`, read only with `lambda > 0`).
pub fn implicit_token_rewards(
    log_ratios: &[f32],
    lengths: &[usize],
    width: usize,
    beta: f32,
    lambda: f32,
    outcomes: Option<&[f32]>,
) -> Vec<f32> {
    assert_eq!(
        log_ratios.len(),
        lengths.len() * width,
        "implicit_token_rewards: [rows, width]"
    );
    let mut out = vec![0.0f32; log_ratios.len()];
    for (i, (row, &len)) in log_ratios.chunks(width).zip(lengths).enumerate() {
        let len = len.min(width);
        let mut r: Vec<f32> = row[..len].iter().map(|&q| beta * q).collect();
        if lambda != 0.0 {
            if let (Some(acc), Some(last)) = (outcomes, len.checked_sub(1)) {
                r[last] = acc[i] - r[..last].iter().sum::<f32>();
            }
            let mut running = 0.0f32;
            for t in (0..len).rev() {
                running = r[t] + lambda * running;
                r[t] = running;
            }
        }
        // Every token but the last: the outcome's.
        let kept = len.saturating_sub(1);
        out[i * width..i * width + kept].copy_from_slice(&r[..kept]);
    }
    out
}

/// Token rewards scaled by the batch's largest absolute return, `max |Σ_{t' ≥ t} r_t'|`, plus
/// 1e-6 (PRIME's `prime_norm = "batch_norm"`).
pub fn batch_normalized(rewards: &[f32], width: usize) -> Vec<f32> {
    let mut largest = 0.0f32;
    for row in rewards.chunks(width) {
        let mut running = 0.0f32;
        for &r in row.iter().rev() {
            running += r;
            largest = largest.max(running.abs());
        }
    }
    let scale = largest + 1e-6;
    rewards.iter().map(|&r| r / scale).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    type T = burn::backend::Flex;

    #[test]
    fn the_loss_is_the_cross_entropy_of_the_scaled_sum() {
        let sums = Tensor::<T, 1>::from_data(TensorData::new(vec![2.0f32, -1.0], [2]), &Default::default());
        let loss = f64::from(implicit_prm_loss(sums, &[1.0, 0.0], 0.5).into_scalar());
        let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
        let want = -((sigmoid(1.0)).ln() + (1.0 - sigmoid(-0.5)).ln()) / 2.0;
        assert!((loss - want).abs() < 1e-6, "{loss} vs {want}");
    }

    #[test]
    fn token_rewards_skip_the_last_token_and_the_padding() {
        let q = [1.0, 2.0, 3.0, 9.0, 4.0, 5.0, 9.0, 9.0];
        let r = implicit_token_rewards(&q, &[3, 2], 4, 0.5, 0.0, None);
        assert_eq!(r, [0.5, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0]);
        // With λ = 1 and the outcome: returns whose first token carries the outcome.
        let r = implicit_token_rewards(&q, &[3, 2], 4, 0.5, 1.0, Some(&[1.0, 0.0]));
        assert_eq!(r, [1.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        let normalised = batch_normalized(&[1.0, -3.0, 0.5, 0.5], 2);
        let scale = 3.0 + 1e-6;
        assert_eq!(normalised, [1.0 / scale, -3.0 / scale, 0.5 / scale, 0.5 / scale]);
    }
}
