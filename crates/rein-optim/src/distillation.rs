//! On-policy distillation: the student samples, the teacher scores the sampled tokens, and the
//! student moves toward the teacher on the states it visits itself (Agarwal et al. 2024,
//! "On-Policy Distillation of Language Models"; Thinking Machines 2025, "On-Policy
//! Distillation"). Two estimators of the same per-position reverse KL:
//!
//! **Sampled** ([`add_teacher_advantages`], Tinker, verl, slime): each token's advantage gains the
//! negative per-token reverse KL of the token drawn,
//!
//! ```text
//! A_t ← A_t + c · (log π_T(y_t | x, y_<t) − log π_θ(y_t | x, y_<t)),    y ~ π_θ
//! ```
//!
//! With the policy-gradient loss, `E_y[(log π_θ − log π_T)(y_t) ∇ log π_θ(y_t)]` is the gradient
//! of `KL(π_θ ‖ π_T)` at each position (the score function has mean zero), so the student moves
//! toward the teacher on the states it visits itself. `c` weighs this term against the
//! reward's advantage (the task's verifier, or nothing when its weight is 0).
//!
//! **Full** ([`full_reverse_kl`], GKD's generalised JSD at β = 1, TRL's `DistillationTrainer`):
//! the KL summed over the whole vocabulary at each sampled position, differentiated directly,
//!
//! ```text
//! L = c · (1/|T|) Σ_{t∈T} Σ_v π_θ(v | x, y_<t) (log π_θ(v | x, y_<t) − log π_T(v | x, y_<t))
//! ```
//!
//! one exact term per position instead of a one-sample estimate, at the cost of the
//! vocabulary-wide logits of both models at every completion position.

use burn::tensor::Tensor;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;

/// Adds `coef · (teacher − student)` to each token's advantage where `mask` is set, all
/// `[rows × width]` row-major; `student` is the log-probability the sampler drew each token with.
/// Returns the mean over those tokens of `student − teacher`, the sampled estimate of the
/// reverse KL (0 when no token counts).
pub fn add_teacher_advantages(
    advantages: &mut [f32],
    teacher: &[f32],
    student: &[f32],
    mask: &[f32],
    coef: f32,
) -> f64 {
    assert!(
        advantages.len() == teacher.len() && teacher.len() == student.len() && student.len() == mask.len(),
        "advantages, teacher and student log-probabilities and mask must be the same length"
    );
    let (mut kl, mut tokens) = (0.0_f64, 0.0_f64);
    for (((a, &t), &s), &m) in advantages.iter_mut().zip(teacher).zip(student).zip(mask) {
        if m > 0.0 {
            *a += coef * (t - s);
            kl += f64::from(s - t);
            tokens += 1.0;
        }
    }
    if tokens > 0.0 { kl / tokens } else { 0.0 }
}

/// `KL(π_θ ‖ π_T)` at each row: `Σ_v π_θ(v)(log π_θ(v) − log π_T(v))` with `π = softmax(logits)`
/// (scale the logits by `1/temperature` first, as TRL does for both models). Gradients flow
/// through `student_logits` only; detach the teacher's.
///
/// # Shapes
/// - `student_logits`, `teacher_logits`: `[rows, vocab]` → `[rows]`
pub fn full_reverse_kl<B: Backend>(student_logits: Tensor<B, 2>, teacher_logits: Tensor<B, 2>) -> Tensor<B, 1> {
    let student = log_softmax(student_logits, 1);
    let teacher = log_softmax(teacher_logits, 1);
    let rows = student.dims()[0];
    (student.clone().exp() * (student - teacher)).sum_dim(1).reshape([rows])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type T = burn::backend::Flex;

    fn logits(values: &[f32], vocab: usize) -> Tensor<T, 2> {
        Tensor::from_data(
            burn::tensor::TensorData::new(values.to_vec(), [values.len() / vocab, vocab]),
            &Default::default(),
        )
    }

    #[test]
    fn the_full_kl_is_the_sum_over_the_vocabulary() {
        let (s, t) = ([1.0f32, 0.0, -1.0], [0.0f32, 0.5, 0.0]);
        let soft = |x: &[f32]| {
            let z: f64 = x.iter().map(|&v| f64::from(v).exp()).sum();
            x.iter().map(|&v| f64::from(v).exp() / z).collect::<Vec<f64>>()
        };
        let (ps, pt) = (soft(&s), soft(&t));
        let expected: f64 = ps.iter().zip(&pt).map(|(p, q)| p * (p / q).ln()).sum();
        let kl: Vec<f32> = full_reverse_kl(logits(&s, 3), logits(&t, 3))
            .into_data()
            .to_vec()
            .unwrap();
        assert!((f64::from(kl[0]) - expected).abs() < 1e-6, "{} vs {expected}", kl[0]);
    }

    #[test]
    fn each_counted_token_gains_the_log_ratio() {
        let mut advantages = vec![1.0, 1.0, 1.0];
        let kl = add_teacher_advantages(
            &mut advantages,
            &[-1.0, -2.0, -3.0],
            &[-1.5, -1.0, -9.0],
            &[1.0, 1.0, 0.0],
            2.0,
        );
        assert_eq!(advantages, [2.0, -1.0, 1.0]);
        assert!((kl - (-0.5 + 1.0) / 2.0).abs() < 1e-12);
    }

    proptest! {
        #[test]
        fn a_student_equal_to_its_teacher_keeps_its_advantages_and_has_no_kl(
            values in prop::collection::vec((-5.0f32..5.0, -10.0f32..0.0, prop::bool::ANY), 0..40),
            coef in 0.0f32..4.0,
        ) {
            let advantages: Vec<f32> = values.iter().map(|v| v.0).collect();
            let lp: Vec<f32> = values.iter().map(|v| v.1).collect();
            let mask: Vec<f32> = values.iter().map(|v| f32::from(u8::from(v.2))).collect();
            let mut after = advantages.clone();
            prop_assert_eq!(add_teacher_advantages(&mut after, &lp, &lp, &mask, coef), 0.0);
            prop_assert_eq!(after, advantages);
        }

        #[test]
        fn the_term_is_linear_in_its_coefficient_and_skips_masked_tokens(
            values in prop::collection::vec((-10.0f32..0.0, -10.0f32..0.0, prop::bool::ANY), 1..40),
            coef in 0.0f32..4.0,
        ) {
            let teacher: Vec<f32> = values.iter().map(|v| v.0).collect();
            let student: Vec<f32> = values.iter().map(|v| v.1).collect();
            let mask: Vec<f32> = values.iter().map(|v| f32::from(u8::from(v.2))).collect();
            let mut one = vec![0.0; values.len()];
            let mut scaled = vec![0.0; values.len()];
            add_teacher_advantages(&mut one, &teacher, &student, &mask, 1.0);
            add_teacher_advantages(&mut scaled, &teacher, &student, &mask, coef);
            for ((o, s), m) in one.iter().zip(&scaled).zip(&mask) {
                prop_assert!((o * coef - s).abs() <= 1e-4 * (1.0 + o.abs() * coef));
                if *m == 0.0 {
                    prop_assert_eq!(*s, 0.0);
                }
            }
        }

        #[test]
        fn the_full_kl_is_zero_for_the_teacher_itself_and_positive_otherwise(
            values in prop::collection::vec((-6.0f32..6.0, -6.0f32..6.0), 2..24),
            shift in -3.0f32..3.0,
        ) {
            let student: Vec<f32> = values.iter().map(|v| v.0).collect();
            let teacher: Vec<f32> = values.iter().map(|v| v.1).collect();
            let vocab = values.len();
            // A shift of every logit leaves the distribution, and so the KL, unchanged.
            let shifted: Vec<f32> = student.iter().map(|v| v + shift).collect();
            let same: Vec<f32> = full_reverse_kl(logits(&student, vocab), logits(&shifted, vocab)).into_data().to_vec().unwrap();
            prop_assert!(same[0].abs() < 1e-5, "{}", same[0]);
            let kl: Vec<f32> = full_reverse_kl(logits(&student, vocab), logits(&teacher, vocab)).into_data().to_vec().unwrap();
            prop_assert!(kl[0] > -1e-5, "{}", kl[0]);
        }
    }
}
