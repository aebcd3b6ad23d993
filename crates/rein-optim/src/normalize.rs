//! Advantage normalisation: `Â = (A − mean A) / (std A + 1e-8)`, with the unbiased standard
//! deviation (`torch.std`), as CleanRL and SB3 do per minibatch.

/// Normalises `values` in place to zero mean and unit (unbiased) standard deviation. A single
/// value becomes 0.
pub fn normalize(values: &mut [f32]) {
    let n = values.len();
    if n == 0 {
        return;
    }
    let mean = values.iter().map(|&x| f64::from(x)).sum::<f64>() / n as f64;
    let var = if n > 1 {
        values.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>() / (n - 1) as f64
    } else {
        0.0
    };
    let scale = 1.0 / (var.sqrt() + 1e-8);
    for x in values {
        *x = ((f64::from(*x) - mean) * scale) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn gives_zero_mean_and_unit_variance(values in prop::collection::vec(-1e3f32..1e3, 2..200)) {
            let spread = values.iter().copied().fold(f32::NEG_INFINITY, f32::max) - values.iter().copied().fold(f32::INFINITY, f32::min);
            prop_assume!(spread > 1e-2);
            let mut v = values.clone();
            normalize(&mut v);
            let n = v.len() as f64;
            let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
            let var = v.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>() / (n - 1.0);
            prop_assert!(mean.abs() < 1e-4, "mean {mean}");
            prop_assert!((var - 1.0).abs() < 1e-3, "var {var}");
        }
    }

    #[test]
    fn constant_input_becomes_zero() {
        let mut v = vec![3.0; 5];
        normalize(&mut v);
        assert_eq!(v, vec![0.0; 5]);
        let mut one = vec![7.0];
        normalize(&mut one);
        assert_eq!(one, vec![0.0]);
    }
}
