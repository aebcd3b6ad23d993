//! On-policy distillation: the student samples, the teacher scores the sampled tokens, and each
//! token's advantage gains the negative per-token reverse KL (Agarwal et al. 2024, "On-Policy
//! Distillation of Language Models"; Thinking Machines 2025, "On-Policy Distillation"):
//!
//! ```text
//! A_t ← A_t + c · (log π_T(y_t | x, y_<t) − log π_θ(y_t | x, y_<t)),    y ~ π_θ
//! ```
//!
//! With the policy-gradient loss, `E_y[(log π_θ − log π_T)(y_t) ∇ log π_θ(y_t)]` is the gradient
//! of `KL(π_θ ‖ π_T)` at each position (the score function has mean zero), so the student moves
//! toward the teacher on the states it visits itself. `c` weighs this term against the
//! reward's advantage (the task's verifier, or nothing when its weight is 0).

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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
    }
}
