//! Difficulty-aware advantage reweighting (GRPO-LEAD, Zhang & Zuo 2025, §3.3). A group whose
//! completions are correct at the rate ρ (its prompt's empirical accuracy) has its advantages
//! scaled by a logistic weight of its difficulty:
//!
//! ```text
//! w(ρ)  = low + (high − low) / (1 + exp(k · (ρ − ρ₀)))
//! Ã_i   = A_i · w(ρ)        if A_i > 0   (a correct answer: worth most on a hard prompt)
//! Ã_i   = A_i · w(1 − ρ)    if A_i < 0   (a wrong answer: costs most on an easy prompt)
//! ```
//!
//! With the defaults (low 0.4, high 1.5, ρ₀ 0.75, k 10) a correct answer to a prompt solved a
//! quarter of the time weighs 1.49, one to a prompt solved every time 0.48.

use rein_core::DifficultyWeight;

/// `w(ρ)`.
pub fn difficulty_weight(accuracy: f64, w: &DifficultyWeight) -> f64 {
    let (low, high) = (f64::from(w.low), f64::from(w.high));
    low + (high - low) / (1.0 + (f64::from(w.steepness) * (accuracy - f64::from(w.center))).exp())
}

/// Scales one completion's advantages (its tokens') as its group's accuracy `accuracy` says.
pub fn reweight_by_difficulty(advantages: &mut [f32], accuracy: f64, w: &DifficultyWeight) {
    let (for_correct, for_wrong) = (difficulty_weight(accuracy, w), difficulty_weight(1.0 - accuracy, w));
    for a in advantages.iter_mut() {
        let scale = if *a > 0.0 { for_correct } else { for_wrong };
        *a = (f64::from(*a) * scale) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group_normalized;
    use proptest::prelude::*;
    use rein_core::StdScaling;

    /// A group of four with three correct answers (ρ = 0.75, reward 1 or 0), by hand:
    /// A = (r − 0.75) / (std + 1e-4), std = 0.5 → A = 0.49990 for the correct ones and −1.49970
    /// for the wrong one; w(0.75) = (0.4 + 1.5) / 2 = 0.95, and
    /// w(0.25) = 0.4 + 1.1 / (1 + e^−5) = 0.4 + 1.1 / 1.0067379 = 1.4926379.
    #[test]
    fn a_group_by_hand() {
        let w = DifficultyWeight::default();
        assert!((difficulty_weight(0.75, &w) - 0.95).abs() < 1e-8);
        assert!((difficulty_weight(0.25, &w) - 1.492_637_86).abs() < 1e-8);
        let mut advantages = group_normalized(&[1.0, 1.0, 1.0, 0.0], 4, StdScaling::Group);
        let expected = [
            0.25 / 0.5001 * 0.95,
            0.25 / 0.5001 * 0.95,
            0.25 / 0.5001 * 0.95,
            -0.75 / 0.5001 * 1.492_637_86,
        ];
        for a in advantages.iter_mut() {
            reweight_by_difficulty(std::slice::from_mut(a), 0.75, &w);
        }
        for (a, e) in advantages.iter().zip(expected) {
            assert!((f64::from(*a) - e).abs() < 1e-5, "{a} vs {e}");
        }
    }

    proptest! {
        /// Weights stay within [low, high] and fall as accuracy rises; signs and zeros survive.
        #[test]
        fn weights_are_bounded_monotone_and_keep_signs(
            low in 0.1f32..1.0, extra in 0.0f32..2.0, center in 0.0f32..1.0, steepness in 0.1f32..20.0,
            rho in 0.0f64..1.0, step in 0.0f64..0.5,
            advantages in prop::collection::vec(-3.0f32..3.0, 1..16),
        ) {
            let w = DifficultyWeight { low, high: low + extra, center, steepness };
            let (a, b) = (difficulty_weight(rho, &w), difficulty_weight((rho + step).min(1.0), &w));
            prop_assert!(a >= f64::from(low) - 1e-9 && a <= f64::from(low + extra) + 1e-9);
            prop_assert!(b <= a + 1e-12);
            let mut scaled = advantages.clone();
            reweight_by_difficulty(&mut scaled, rho, &w);
            for (x, y) in advantages.iter().zip(&scaled) {
                prop_assert_eq!(x.signum() * f32::from(*x != 0.0), y.signum() * f32::from(*y != 0.0));
            }
        }
    }
}
