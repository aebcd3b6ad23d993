//! Running statistics for observation normalisation and reward scaling, as Gymnasium's
//! `NormalizeObservation` and `NormalizeReward` wrappers compute them.

use serde::{Deserialize, Serialize};

/// Running mean and variance per feature, merged batch by batch (Chan et al.'s parallel
/// algorithm, as in Gymnasium's `RunningMeanStd`, starting from count 1e-4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunningMeanStd {
    /// Mean per feature.
    pub mean: Vec<f64>,
    /// Population variance per feature.
    pub var: Vec<f64>,
    /// Number of samples seen (plus the initial 1e-4).
    pub count: f64,
}

impl RunningMeanStd {
    /// Statistics for `dim` features: mean 0, variance 1.
    pub fn new(dim: usize) -> Self {
        Self {
            mean: vec![0.0; dim],
            var: vec![1.0; dim],
            count: 1e-4,
        }
    }

    /// Merges a batch of rows (`batch.len()` a multiple of the feature count).
    pub fn update(&mut self, batch: &[f32]) {
        let dim = self.mean.len();
        let n = batch.len() / dim.max(1);
        if n == 0 {
            return;
        }
        for d in 0..dim {
            let column = || batch.iter().skip(d).step_by(dim).map(|&x| f64::from(x));
            let batch_mean = column().sum::<f64>() / n as f64;
            let batch_var = column().map(|x| (x - batch_mean).powi(2)).sum::<f64>() / n as f64;
            let delta = batch_mean - self.mean[d];
            let total = self.count + n as f64;
            self.mean[d] += delta * n as f64 / total;
            let m2 = self.var[d] * self.count + batch_var * n as f64 + delta * delta * self.count * n as f64 / total;
            self.var[d] = m2 / total;
        }
        self.count += n as f64;
    }

    /// `clamp((x − mean) / sqrt(var + 1e-8), −clip, clip)` for each row of `batch`, in place.
    pub fn normalize(&self, batch: &mut [f32], clip: f32) {
        let dim = self.mean.len().max(1);
        for row in batch.chunks_mut(dim) {
            for (d, x) in row.iter_mut().enumerate() {
                let z = (f64::from(*x) - self.mean[d]) / (self.var[d] + 1e-8).sqrt();
                *x = (z as f32).clamp(-clip, clip);
            }
        }
    }
}

/// Scales rewards by the standard deviation of a running discounted return (Gymnasium's
/// `NormalizeReward`): `G ← γ G (1 − terminated) + r`, `r̃ = clamp(r / sqrt(Var[G] + 1e-8), ±clip)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewardScaler {
    returns: Vec<f64>,
    stats: RunningMeanStd,
    gamma: f64,
}

impl RewardScaler {
    /// A scaler for `num_envs` environments with discount `gamma`.
    pub fn new(num_envs: usize, gamma: f64) -> Self {
        Self {
            returns: vec![0.0; num_envs],
            stats: RunningMeanStd::new(1),
            gamma,
        }
    }

    /// Scales one step's rewards (one per env) in place.
    pub fn scale(&mut self, rewards: &mut [f32], terminated: &[bool], clip: f32) {
        for ((g, &r), &term) in self.returns.iter_mut().zip(rewards.iter()).zip(terminated) {
            *g = *g * self.gamma * if term { 0.0 } else { 1.0 } + f64::from(r);
        }
        let returns: Vec<f32> = self.returns.iter().map(|&g| g as f32).collect();
        self.stats.update(&returns);
        let scale = 1.0 / (self.stats.var[0] + 1e-8).sqrt();
        for r in rewards {
            *r = ((f64::from(*r) * scale) as f32).clamp(-clip, clip);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn batched_updates_equal_one_pass_statistics(
            rows in prop::collection::vec(prop::collection::vec(-100.0f32..100.0, 3), 2..60),
            split in 1usize..59,
        ) {
            let flat: Vec<f32> = rows.iter().flatten().copied().collect();
            let split = split.min(rows.len() - 1) * 3;
            let mut in_two = RunningMeanStd::new(3);
            in_two.update(&flat[..split]);
            in_two.update(&flat[split..]);
            let mut in_one = RunningMeanStd::new(3);
            in_one.update(&flat);
            for d in 0..3 {
                prop_assert!((in_two.mean[d] - in_one.mean[d]).abs() <= 1e-9 * (1.0 + in_one.mean[d].abs()));
                prop_assert!((in_two.var[d] - in_one.var[d]).abs() <= 1e-9 * (1.0 + in_one.var[d]));
            }
            prop_assert!((in_two.count - in_one.count).abs() < 1e-9);
        }
    }

    #[test]
    fn many_samples_give_the_sample_statistics() {
        let batch: Vec<f32> = (0..10_000).map(|i| ((i * 37) % 101) as f32 - 20.0).collect();
        let mut stats = RunningMeanStd::new(1);
        for chunk in batch.chunks(64) {
            stats.update(chunk);
        }
        let n = batch.len() as f64;
        let mean = batch.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = batch.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>() / n;
        assert!((stats.mean[0] - mean).abs() < 1e-3 && (stats.var[0] - var).abs() < 1e-2 * var);
    }

    #[test]
    fn normalised_observations_have_zero_mean_and_unit_variance() {
        let batch: Vec<f32> = (0..1000).map(|i| (i % 10) as f32 * 3.0 + 5.0).collect();
        let mut stats = RunningMeanStd::new(1);
        stats.update(&batch);
        let mut z = batch.clone();
        stats.normalize(&mut z, 10.0);
        let mean = z.iter().sum::<f32>() / z.len() as f32;
        let var = z.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / z.len() as f32;
        assert!(mean.abs() < 1e-3 && (var - 1.0).abs() < 1e-3, "{mean} {var}");
        let mut far = vec![1e6];
        stats.normalize(&mut far, 10.0);
        assert_eq!(far, vec![10.0]);
    }

    #[test]
    fn reward_scaling_divides_by_the_return_spread_and_resets_on_termination() {
        let mut scaler = RewardScaler::new(1, 0.0);
        let mut r = vec![2.0];
        scaler.scale(&mut r, &[false], 10.0);
        assert!(r[0].is_finite() && r[0] > 0.0);
        // With γ = 0 the return is the reward itself, so scaled rewards settle at r / std(r).
        for i in 0..2000 {
            let mut r = vec![if i % 2 == 0 { 1.0 } else { -1.0 }];
            scaler.scale(&mut r, &[i % 5 == 0], 10.0);
        }
        let mut r = vec![1.0];
        scaler.scale(&mut r, &[false], 10.0);
        assert!((r[0] - 1.0).abs() < 0.05, "{}", r[0]);
    }
}
