//! Learning-rate schedules.

/// Linear annealing from `start` to `end` over `updates` updates (CleanRL's `anneal_lr`:
/// `lr = (1 − (update − 1) / updates) · lr₀` with `end = 0`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearSchedule {
    /// The first update's value.
    pub start: f64,
    /// The value the schedule would reach after the last update.
    pub end: f64,
    /// Number of updates.
    pub updates: usize,
}

impl LinearSchedule {
    /// A constant schedule.
    pub fn constant(value: f64) -> Self {
        Self {
            start: value,
            end: value,
            updates: 1,
        }
    }

    /// The value at `update` (1-based).
    pub fn at(&self, update: usize) -> f64 {
        let done = (update.saturating_sub(1) as f64 / self.updates.max(1) as f64).min(1.0);
        self.start + (self.end - self.start) * done
    }
}

/// Linear warm-up to `lr` over `warmup` steps, then linear decay to 10% of it at `steps` (the
/// schedule of rein's SFT, DPO and reward-model training), at `step` (1-based).
pub fn warmup_then_decay(lr: f64, warmup: usize, steps: usize, step: usize) -> f64 {
    let warmup = warmup.max(1);
    if step <= warmup {
        return lr * step as f64 / warmup as f64;
    }
    let progress = (step - warmup) as f64 / (steps.saturating_sub(warmup)).max(1) as f64;
    lr * (1.0 - 0.9 * progress.min(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_cleanrl_anneal() {
        let s = LinearSchedule {
            start: 2.5e-4,
            end: 0.0,
            updates: 4,
        };
        let lrs: Vec<f64> = (1..=4).map(|u| s.at(u)).collect();
        assert_eq!(lrs, vec![2.5e-4, 1.875e-4, 1.25e-4, 0.625e-4]);
        assert_eq!(LinearSchedule::constant(1e-3).at(100), 1e-3);
    }

    #[test]
    fn warms_up_then_decays_to_a_tenth() {
        assert_eq!(warmup_then_decay(1.0, 10, 110, 5), 0.5);
        assert_eq!(warmup_then_decay(1.0, 10, 110, 10), 1.0);
        assert!((warmup_then_decay(1.0, 10, 110, 110) - 0.1).abs() < 1e-12);
        assert!((warmup_then_decay(1.0, 10, 110, 500) - 0.1).abs() < 1e-12);
    }
}
