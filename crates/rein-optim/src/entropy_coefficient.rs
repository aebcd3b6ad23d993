//! The adaptive entropy coefficient of Skywork-OR1 (He et al. 2025, "Skywork Open Reasoner 1
//! Technical Report", §3.2.2; TRL's `use_adaptive_entropy`): an entropy bonus that switches on
//! only once the policy's entropy has fallen to a target, and grows while it stays there.
//!
//! ```text
//! applied_t = c_t  if H_{t−1} ≤ H_target  else 0          (H_0 = ∞: no bonus before a measurement)
//! loss_t    = policy loss − applied_t · H_t
//! c_{t+1}   = min(c_t + δ, c_max)  if H_t ≤ H_target
//!             max(c_t − δ, c_min)  otherwise
//! ```
//!
//! `t` counts optimizer updates; `H_t` is update t's mean entropy per completion token, and
//! `c_0` the recipe's `entropy_coef`.

use rein_core::AdaptiveEntropy;
use serde::{Deserialize, Serialize};

/// The controller's state, carried from update to update (and in checkpoints).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EntropyCoefficient {
    /// c_t.
    pub coef: f64,
    /// H_{t−1}; `None` before the first update.
    pub last_entropy: Option<f64>,
}

impl EntropyCoefficient {
    /// c_0 = `initial`, nothing measured yet.
    pub fn new(initial: f64) -> Self {
        Self {
            coef: initial,
            last_entropy: None,
        }
    }

    /// The coefficient this update's loss applies.
    pub fn applied(&self, control: &AdaptiveEntropy) -> f64 {
        match self.last_entropy {
            Some(h) if h <= control.target => self.coef,
            _ => 0.0,
        }
    }

    /// After an update whose mean token entropy was `entropy`: the next coefficient.
    pub fn observe(&mut self, entropy: f64, control: &AdaptiveEntropy) {
        self.coef = match entropy <= control.target {
            true => (self.coef + control.delta).min(control.max),
            false => (self.coef - control.delta).max(control.min),
        };
        self.last_entropy = Some(entropy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bonus_waits_for_a_low_entropy_and_stays_within_bounds() {
        let control = AdaptiveEntropy {
            target: 1.0,
            delta: 0.5,
            min: 0.0,
            max: 1.0,
        };
        let mut c = EntropyCoefficient::new(0.25);
        assert_eq!(c.applied(&control), 0.0, "nothing measured yet");
        c.observe(2.0, &control);
        assert_eq!(
            (c.coef, c.applied(&control)),
            (0.0, 0.0),
            "high entropy: down to the minimum, off"
        );
        for _ in 0..4 {
            c.observe(0.5, &control);
        }
        assert_eq!(
            (c.coef, c.applied(&control)),
            (1.0, 1.0),
            "low entropy: up to the maximum, on"
        );
    }
}
