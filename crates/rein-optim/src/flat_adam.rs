//! Adam (Kingma & Ba 2015, "Adam: A Method for Stochastic Optimization",
//! <https://arxiv.org/abs/1412.6980>) over one flat buffer of parameters, for networks kept as
//! plain `f32` slices (rein-model's `FlatMlp`):
//!
//! ```text
//! m ← β₁ m + (1 − β₁) g
//! v ← β₂ v + (1 − β₂) g²
//! θ ← θ − lr · m · (√(1 − β₂ᵗ) / (1 − β₁ᵗ)) / (√v + ε √(1 − β₂ᵗ))
//! ```
//!
//! the bias-corrected step `lr · m̂ / (√v̂ + ε)` rearranged as burn's `Adam` computes it, in the
//! same operations on each element, so the two give the same parameters for the same gradients.
//! PyTorch's `optim.Adam` defaults (β = (0.9, 0.999), ε = 1e-8), which CleanRL keeps.
//!
//! One departure: a moment that falls below `f32`'s smallest normal number (1.2·10⁻³⁸) is set to
//! zero. A ReLU network's dead units get zero gradients, so their `m` decays by 0.9 a step into
//! the subnormal range after ~800 steps, where every operation on it takes an x86 CPU a
//! microcode assist about a hundred times slower: a tenth of the moments of a 64-unit SAC critic
//! were subnormal, and Adam took 14% of an update. A step computed from such a moment is below
//! 10⁻²⁹ and moves no parameter of magnitude above 10⁻²², so only those steps' bits change.

/// Adam's moments and step count for one flat parameter buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct FlatAdam {
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    /// `m`, one per parameter.
    moment_1: Vec<f32>,
    /// `v`, one per parameter.
    moment_2: Vec<f32>,
    /// `t`: steps taken.
    time: u64,
}

/// A saved state whose length is not the buffer's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an Adam state of {found} bytes for {params} parameters (needs {needed})")]
pub struct StateSizeMismatch {
    found: usize,
    params: usize,
    needed: usize,
}

impl FlatAdam {
    /// Adam with PyTorch's defaults for `len` parameters, before its first step.
    pub fn new(len: usize) -> Self {
        Self::with(len, [0.9, 0.999], 1e-8)
    }

    /// Adam with decay rates `[β₁, β₂]` and `ε` for `len` parameters, before its first step.
    pub fn with(len: usize, [beta_1, beta_2]: [f32; 2], epsilon: f32) -> Self {
        Self {
            beta_1,
            beta_2,
            epsilon,
            moment_1: vec![0.0; len],
            moment_2: vec![0.0; len],
            time: 0,
        }
    }

    /// One step: `params ← params − lr · update(grads)`.
    ///
    /// # Panics
    /// If `params` or `grads` is not the length the optimiser was made for.
    pub fn step(&mut self, lr: f64, params: &mut [f32], grads: &[f32]) {
        assert_eq!(params.len(), self.moment_1.len(), "parameters for another buffer");
        assert_eq!(grads.len(), params.len(), "one gradient per parameter");
        self.time += 1;
        let time = self.time.min(i32::MAX as u64) as i32;
        let (b1, b2) = (self.beta_1, self.beta_2);
        let bias_correction2_sqrt = (1.0 - b2.powi(time)).sqrt();
        let combined = bias_correction2_sqrt / (1.0 - b1.powi(time));
        let epsilon = self.epsilon * bias_correction2_sqrt;
        let lr = lr as f32;
        let first = self.time == 1;
        let moments = self.moment_1.iter_mut().zip(self.moment_2.iter_mut());
        for ((p, &g), (m, v)) in params.iter_mut().zip(grads).zip(moments) {
            // burn's first step starts the moments from the gradient alone (the same value as
            // from zeros, but without the `0 · β` terms' rounding of a negative zero).
            (*m, *v) = match first {
                true => (g * (1.0 - b1), (g * g) * (1.0 - b2)),
                false => (*m * b1 + g * (1.0 - b1), *v * b2 + (g * g) * (1.0 - b2)),
            };
            (*m, *v) = (normal_or_zero(*m), normal_or_zero(*v));
            let update = (*m * combined) / (v.sqrt() + epsilon);
            *p -= update * lr;
        }
    }

    /// Steps taken.
    pub fn time(&self) -> u64 {
        self.time
    }

    /// The state as bytes: the step count (`u64`), then `m` and `v` (`f32`), little-endian.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(8 + 8 * self.moment_1.len());
        bytes.extend(self.time.to_le_bytes());
        for x in self.moment_1.iter().chain(&self.moment_2) {
            bytes.extend(x.to_le_bytes());
        }
        bytes
    }

    /// Reads what [`FlatAdam::to_bytes`] wrote for a buffer of the same length; on an error
    /// the state is unchanged.
    pub fn read_bytes(&mut self, bytes: &[u8]) -> Result<(), StateSizeMismatch> {
        let len = self.moment_1.len();
        let needed = 8 + 8 * len;
        if bytes.len() != needed {
            return Err(StateSizeMismatch {
                found: bytes.len(),
                params: len,
                needed,
            });
        }
        let (time, floats) = bytes.split_at(8);
        self.time = u64::from_le_bytes(time.try_into().expect("8 bytes"));
        let mut values = floats
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")));
        self.moment_1
            .iter_mut()
            .for_each(|m| *m = values.next().expect("sized above"));
        self.moment_2
            .iter_mut()
            .for_each(|v| *v = values.next().expect("sized above"));
        Ok(())
    }
}

/// `x`, or zero where `x` is subnormal (a select, so the loop stays vectorised).
#[inline(always)]
fn normal_or_zero(x: f32) -> f32 {
    if x.abs() < f32::MIN_POSITIVE { 0.0 } else { x }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::module::{Module, Param};
    use burn::optim::{AdamConfig, GradientsParams, Optimizer};
    use burn::tensor::{Tensor, TensorData};

    use super::*;

    type A = Autodiff<Flex>;

    #[derive(Module, Debug)]
    struct Weights<B: burn::tensor::backend::Backend> {
        w: Param<Tensor<B, 1>>,
    }

    /// Three steps on `Σ wᵢ²/2` (gradient `w` exactly, a new one each step): burn's Adam and
    /// this one give the same parameters, bit for bit.
    #[test]
    fn the_same_parameters_as_burns_adam() {
        let start = vec![0.5f32, -1.25, 3.0, 1e-4, -2e-3];
        let device = Default::default();
        let tensor = Tensor::<A, 1>::from_data(TensorData::new(start.clone(), [start.len()]), &device);
        let mut weights = Weights {
            w: Param::from_tensor(tensor.require_grad()),
        };
        let mut burn_adam = AdamConfig::new()
            .with_beta_1(0.9)
            .with_beta_2(0.999)
            .with_epsilon(1e-8)
            .init::<A, Weights<A>>();
        let (mut flat, mut adam) = (start.clone(), FlatAdam::new(start.len()));
        for lr in [1e-2, 3e-3, 1e-3] {
            let loss = (weights.w.val() * weights.w.val()).sum() * 0.5;
            let grads = GradientsParams::from_grads(loss.backward(), &weights);
            weights = burn_adam.step(lr, weights, grads);
            let grads = flat.clone();
            adam.step(lr, &mut flat, &grads);
            let burn: Vec<f32> = weights.w.val().into_data().to_vec().unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&flat), bits(&burn), "lr {lr}");
        }
        assert_eq!(adam.time(), 3);
    }

    /// A unit whose gradient stays zero: its first moment decays toward zero and stops at
    /// zero instead of passing through the subnormal range; the parameter does not move.
    #[test]
    fn moments_below_the_normal_range_become_zero() {
        let mut adam = FlatAdam::new(1);
        let mut param = [0.5f32];
        adam.step(1e-3, &mut param, &[1.0]);
        let after_first = param[0];
        for _ in 0..2000 {
            adam.step(1e-3, &mut param, &[0.0]);
            assert!(!adam.moment_1[0].is_subnormal() && !adam.moment_2[0].is_subnormal());
        }
        assert_eq!(adam.moment_1[0], 0.0);
        assert!(param[0] < after_first && param[0] > 0.45, "{}", param[0]);
    }

    #[test]
    fn the_state_reads_back_and_a_wrong_size_is_refused() {
        let mut adam = FlatAdam::new(3);
        let mut params = vec![1.0f32, 2.0, 3.0];
        adam.step(0.1, &mut params, &[0.5, -0.5, 2.0]);
        let bytes = adam.to_bytes();
        let mut other = FlatAdam::new(3);
        other.read_bytes(&bytes).unwrap();
        assert_eq!(other, adam);
        let mut small = FlatAdam::new(2);
        let err = small.read_bytes(&bytes).unwrap_err();
        assert_eq!(err.to_string(), "an Adam state of 32 bytes for 2 parameters (needs 24)");
        assert_eq!(small, FlatAdam::new(2));
    }
}
