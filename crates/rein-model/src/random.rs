//! Random initial weights, drawn from the caller's own [`SeededRng`].
//!
//! burn's initialisers draw from one generator per backend that every thread of the process
//! shares: two runs in one process (a sweep, a server beside a trainer, parallel tests) would
//! advance each other's stream. Every random weight rein makes comes from here instead, from a
//! generator the run owns and seeds, so a run's weights depend on its seed alone.

use burn::tensor::{Tensor, TensorData};
use rein_core::SeededRng;

use crate::ReinBackend;

/// A `[rows, cols]` tensor of `N(0, std²)` draws, row by row.
pub fn normal<B: ReinBackend>(
    rng: &mut SeededRng,
    [rows, cols]: [usize; 2],
    std: f64,
    device: &B::Device,
) -> Tensor<B, 2> {
    let values = (0..rows * cols).map(|_| (rng.normal() * std) as f32).collect();
    Tensor::from_data(TensorData::new(values, [rows, cols]), device)
}

/// A `[rows, cols]` tensor of `U(−bound, bound)` draws, row by row.
pub fn uniform<B: ReinBackend>(
    rng: &mut SeededRng,
    [rows, cols]: [usize; 2],
    bound: f64,
    device: &B::Device,
) -> Tensor<B, 2> {
    let values = (0..rows * cols)
        .map(|_| ((2.0 * rng.uniform() - 1.0) * bound) as f32)
        .collect();
    Tensor::from_data(TensorData::new(values, [rows, cols]), device)
}

/// A linear layer's weight `[input, output]` (burn's layout: `y = x·W`) initialised as
/// PyTorch's `nn.init.orthogonal_` initialises the `[output, input]` weight `Wᵀ` (Saxe et al.
/// 2013): draw `G ~ N(0, 1)` of shape `[output, input]` (transposed when it is wide), take its
/// QR decomposition `G = QR`, flip the signs of `Q`'s columns so that `R`'s diagonal is
/// positive (which makes `Q` uniformly distributed), and scale by `gain`. The rows or the
/// columns of the result, whichever are fewer, are orthogonal with norm `gain`.
pub fn orthogonal<B: ReinBackend>(
    rng: &mut SeededRng,
    [input, output]: [usize; 2],
    gain: f64,
    device: &B::Device,
) -> Tensor<B, 2> {
    let weight = orthogonal_values(rng, input, output, gain);
    Tensor::from_data(TensorData::new(weight, [input, output]), device)
}

/// [`orthogonal`]'s values, `[input, output]` row-major.
fn orthogonal_values(rng: &mut SeededRng, input: usize, output: usize, gain: f64) -> Vec<f32> {
    // PyTorch's view: `g` is `[output, input]`; QR runs on the tall orientation.
    let g: Vec<f64> = (0..output * input).map(|_| rng.normal()).collect();
    let (tall, rows, cols) = if output >= input {
        (g, output, input)
    } else {
        (transpose(&g, output, input), input, output)
    };
    let q = thin_q(tall, rows, cols); // `[rows, cols]`, orthonormal columns
    // Back to `[output, input]`, then to burn's `[input, output]`.
    let torch_layout = if output >= input { q } else { transpose(&q, rows, cols) };
    transpose(&torch_layout, output, input)
        .into_iter()
        .map(|x| (x * gain) as f32)
        .collect()
}

fn transpose(a: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut t = vec![0.0; a.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = a[r * cols + c];
        }
    }
    t
}

/// The `Q` of `a = QR` (`a` is `[rows, cols]` row-major, `rows ≥ cols`) with `R`'s diagonal
/// made positive: Householder reflections in `f64`, in one fixed order.
fn thin_q(mut a: Vec<f64>, rows: usize, cols: usize) -> Vec<f64> {
    let mut reflectors: Vec<Vec<f64>> = Vec::with_capacity(cols);
    let mut diagonal_signs = Vec::with_capacity(cols);
    for k in 0..cols {
        // v = x − α e₁ with α = −sign(x₀)‖x‖, normalised; R[k][k] = α.
        let mut v: Vec<f64> = (k..rows).map(|r| a[r * cols + k]).collect();
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let alpha = if v[0] >= 0.0 { -norm } else { norm };
        v[0] -= alpha;
        let v_norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if v_norm > 0.0 {
            v.iter_mut().for_each(|x| *x /= v_norm);
        }
        // A[k.., k..] ← (I − 2vvᵀ) A[k.., k..]
        for c in k..cols {
            let dot: f64 = (k..rows).map(|r| v[r - k] * a[r * cols + c]).sum();
            for r in k..rows {
                a[r * cols + c] -= 2.0 * v[r - k] * dot;
            }
        }
        diagonal_signs.push(if alpha < 0.0 { -1.0 } else { 1.0 });
        reflectors.push(v);
    }
    // Q = H₀ H₁ … H_{cols−1} applied to the first `cols` columns of the identity.
    let mut q = vec![0.0; rows * cols];
    for i in 0..cols {
        q[i * cols + i] = 1.0;
    }
    for (k, v) in reflectors.iter().enumerate().rev() {
        for c in 0..cols {
            let dot: f64 = (k..rows).map(|r| v[r - k] * q[r * cols + c]).sum();
            for r in k..rows {
                q[r * cols + c] -= 2.0 * v[r - k] * dot;
            }
        }
    }
    for r in 0..rows {
        for (c, sign) in diagonal_signs.iter().enumerate() {
            q[r * cols + c] *= sign;
        }
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `MᵀM` or `MMᵀ` (whichever is smaller) of `[rows, cols]` `m`.
    fn gram(m: &[f32], rows: usize, cols: usize) -> Vec<f64> {
        let (n, dot): (usize, Box<dyn Fn(usize, usize) -> f64>) = if rows >= cols {
            (
                cols,
                Box::new(|i, j| (0..rows).map(|r| m[r * cols + i] as f64 * m[r * cols + j] as f64).sum()),
            )
        } else {
            (
                rows,
                Box::new(|i, j| (0..cols).map(|c| m[i * cols + c] as f64 * m[j * cols + c] as f64).sum()),
            )
        };
        (0..n * n).map(|k| dot(k / n, k % n)).collect()
    }

    #[test]
    fn orthogonal_weights_are_orthogonal_with_the_gain_in_every_shape() {
        for (input, output) in [(16, 16), (4, 64), (64, 2), (64, 1), (7, 3), (1, 5)] {
            let w = orthogonal_values(&mut SeededRng::new(3), input, output, 2f64.sqrt());
            let n = input.min(output);
            for (k, g) in gram(&w, input, output).into_iter().enumerate() {
                let expected = if k / n == k % n { 2.0 } else { 0.0 };
                assert!((g - expected).abs() < 1e-5, "{input}×{output}: gram[{k}] = {g}");
            }
        }
    }

    #[test]
    fn orthogonal_weights_depend_on_the_generator_alone() {
        let draw = |seed| orthogonal_values(&mut SeededRng::new(seed), 8, 4, 1.0);
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }

    #[test]
    fn q_is_the_positive_diagonal_factor() {
        // [[3, 1], [4, 2]]: Q's first column is the first column normalised (R₀₀ = 5 > 0).
        let q = thin_q(vec![3.0, 1.0, 4.0, 2.0], 2, 2);
        assert!((q[0] - 0.6).abs() < 1e-12 && (q[2] - 0.8).abs() < 1e-12, "{q:?}");
        // R₁₁ = q₁ · a₁ > 0.
        assert!(q[1] * 1.0 + q[3] * 2.0 > 0.0, "{q:?}");
    }
}
