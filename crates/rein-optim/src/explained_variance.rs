//! How much of the returns' variance a critic explains, the diagnostic PPO logs (CleanRL's
//! `explained_var`, Stable-Baselines3's `explained_variance`):
//!
//! ```text
//! 1 − Var[R − V] / Var[R]
//! ```
//!
//! 1 is perfect, 0 no better than a constant, negative worse; undefined when the returns do not
//! vary.

/// `1 − Var[R − V] / Var[R]` of `values` V against `returns` R (population variances, in
/// `f64`); `None` when the returns do not vary.
pub fn explained_variance(values: &[f32], returns: &[f32]) -> Option<f64> {
    let var = |xs: &mut dyn Iterator<Item = f64>| {
        let v: Vec<f64> = xs.collect();
        let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len().max(1) as f64
    };
    let var_returns = var(&mut returns.iter().map(|&r| f64::from(r)));
    (var_returns > 0.0).then(|| 1.0 - var(&mut returns.iter().zip(values).map(|(r, v)| f64::from(r - v))) / var_returns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explained_variance_by_hand() {
        assert_eq!(explained_variance(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0]), Some(1.0));
        assert_eq!(explained_variance(&[0.0; 3], &[1.0, 2.0, 3.0]), Some(0.0));
        assert!(explained_variance(&[3.0, 2.0, 1.0], &[1.0, 2.0, 3.0]).unwrap() < 0.0);
        assert_eq!(explained_variance(&[1.0, 5.0], &[2.0, 2.0]), None);
    }
}
