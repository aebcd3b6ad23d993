//! Row kernels on Flex: softmax moments, RMSNorm, RoPE's rotation, SwiGLU, dot products and the
//! exponential and tanh they use, each one pass over a row, in one fixed order on every ISA.

#![allow(clippy::wildcard_imports)]

use super::*;

/// What a row's log-probabilities and entropy under `softmax(u)`, `u = scale·z`, are computed
/// from: `m = maxⱼ uⱼ`, `S = Σⱼ exp(uⱼ − m)` and `T = Σⱼ exp(uⱼ − m) · (uⱼ − m)` (shifted by
/// `m`, so the entropy does not lose digits subtracting two numbers near `m`).
pub(super) struct SoftmaxMoments {
    pub(super) max: f32,
    pub(super) total: f32,
    pub(super) weighted: f32,
}

impl SoftmaxMoments {
    /// `log Σⱼ exp(uⱼ) = m + ln S`: `log pⱼ = uⱼ − m − ln S`.
    pub(super) fn log_normaliser(&self) -> f32 {
        self.max + self.total.ln()
    }

    /// `H = −Σⱼ pⱼ log pⱼ = ln S − T/S`.
    pub(super) fn entropy(&self) -> f32 {
        self.total.ln() - self.weighted / self.total
    }
}

#[inline(always)]
pub(super) fn softmax_moments_kernel(row: &[f32], scale: f32) -> SoftmaxMoments {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &z| m.max(scale * z));
    let (mut total, mut weighted) = ([0.0f32; 8], [0.0f32; 8]);
    let (body, tail) = row.split_at(row.len() / 8 * 8);
    for chunk in body.chunks_exact(8) {
        for i in 0..8 {
            let shifted = scale * chunk[i] - max;
            let e = exp_f32(shifted);
            total[i] += e;
            weighted[i] += e * shifted;
        }
    }
    let (mut total_tail, mut weighted_tail) = (0.0f32, 0.0f32);
    for &z in tail {
        let shifted = scale * z - max;
        let e = exp_f32(shifted);
        total_tail += e;
        weighted_tail += e * shifted;
    }
    SoftmaxMoments {
        max,
        total: total.iter().sum::<f32>() + total_tail,
        weighted: weighted.iter().sum::<f32>() + weighted_tail,
    }
}

/// `out ← −scale · pⱼ · (g_lp + g_H · (log pⱼ + H))`, the gradient of `g_lp·log pₜ + g_H·H`
/// with respect to `z` except the chosen token's `+scale·g_lp`. With
/// `log pⱼ + H = (uⱼ − m) − T/S` that is `−scale · pⱼ · (c + g_H·(uⱼ − m))`, `c = g_lp − g_H·T/S`.
#[inline(always)]
pub(super) fn log_prob_entropy_gradient_kernel(out: &mut [f32], row: &[f32], scale: f32, g_lp: f32, g_h: f32) {
    let moments = softmax_moments_kernel(row, scale);
    let c = g_lp - g_h * moments.weighted / moments.total;
    let factor = -scale / moments.total;
    for (o, &z) in out.iter_mut().zip(row) {
        let shifted = scale * z - moments.max;
        *o = factor * exp_f32(shifted) * (c + g_h * shifted);
    }
}

/// `out ← x ⊙ cos + rotate_half(x) ⊙ sin`, `rotate_half([a, c]) = [−c, a]`.
#[inline(always)]
pub(super) fn rotate_half(out: &mut [f32], x: &[f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    let (first, second) = x.split_at(half);
    let (out_first, out_second) = out.split_at_mut(half);
    for i in 0..half {
        let (a, c) = (first[i], second[i]);
        out_first[i] = a * cos[i] + -c * sin[i];
        out_second[i] = c * cos[i + half] + a * sin[i + half];
    }
}

/// `y ← y + a·x`.
#[inline(always)]
pub(super) fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// `out ← Σⱼ weights[j] · value(j)` over rows of `D` values, accumulated in registers.
#[inline(always)]
pub(super) fn weighted_sum<'v, const D: usize>(weights: &[f32], value: impl Fn(usize) -> &'v [f32], out: &mut [f32]) {
    let mut acc = [0.0f32; D];
    for (j, &w) in weights.iter().enumerate() {
        // As an array, so the loop unrolls into `D / 8` vector registers.
        let value: &[f32; D] = value(j).first_chunk().expect("rows of D values");
        for (a, &x) in acc.iter_mut().zip(value) {
            *a += w * x;
        }
    }
    out.copy_from_slice(&acc);
}

/// `Σ xᵢ` with independent partial sums, so the loop vectorises.
#[inline(always)]
pub(super) fn sum(x: &[f32]) -> f32 {
    const LANES: usize = 8;
    let mut partial = [0.0f32; LANES];
    let (body, tail) = x.split_at(x.len() / LANES * LANES);
    for chunk in body.chunks_exact(LANES) {
        for i in 0..LANES {
            partial[i] += chunk[i];
        }
    }
    partial.iter().sum::<f32>() + tail.iter().sum::<f32>()
}

/// `out ← weight ⊙ x / sqrt(mean(x²) + eps)`, row by row (rows as long as `weight`).
#[inline(always)]
pub(super) fn rms_norm_kernel(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    let hidden = weight.len();
    for (out, row) in out.chunks_exact_mut(hidden).zip(x.chunks_exact(hidden)) {
        let inv_rms = 1.0 / (dot(row, row) / hidden as f32 + eps).sqrt();
        for ((o, &x), &w) in out.iter_mut().zip(row).zip(weight) {
            *o = w * (x * inv_rms);
        }
    }
}

with_avx2!(fn rms_norm_backward_x(d_x: &mut [f32], x: &[f32], weight: &[f32], grad: &[f32], eps: f32) => rms_norm_backward_x_kernel);
with_avx2!(fn rms_norm_backward_weight(d_weight: &mut [f32], x: &[f32], grad: &[f32], eps: f32) => rms_norm_backward_weight_kernel);

/// `∂x = r (g − x r · mean(g ⊙ x r))` row by row, `g = ∂y ⊙ w`, with `r` as the forward
/// computes it.
#[inline(always)]
pub(super) fn rms_norm_backward_x_kernel(d_x: &mut [f32], x: &[f32], weight: &[f32], grad: &[f32], eps: f32) {
    let hidden = weight.len();
    let rows = d_x
        .chunks_exact_mut(hidden)
        .zip(x.chunks_exact(hidden))
        .zip(grad.chunks_exact(hidden));
    for ((d_x, x), dy) in rows {
        let inv_rms = 1.0 / (dot(x, x) / hidden as f32 + eps).sqrt();
        let mut projection = 0.0f32;
        for i in 0..hidden {
            projection += dy[i] * weight[i] * (x[i] * inv_rms);
        }
        let projection = projection / hidden as f32;
        for i in 0..hidden {
            d_x[i] = inv_rms * (dy[i] * weight[i] - x[i] * inv_rms * projection);
        }
    }
}

/// `∂w += ∂y ⊙ x r`, rows in order.
#[inline(always)]
pub(super) fn rms_norm_backward_weight_kernel(d_weight: &mut [f32], x: &[f32], grad: &[f32], eps: f32) {
    let hidden = d_weight.len();
    for (x, dy) in x.chunks_exact(hidden).zip(grad.chunks_exact(hidden)) {
        let inv_rms = 1.0 / (dot(x, x) / hidden as f32 + eps).sqrt();
        for i in 0..hidden {
            d_weight[i] += dy[i] * (x[i] * inv_rms);
        }
    }
}

/// `Σ aᵢbᵢ` with independent partial sums, so the loop vectorises.
#[inline(always)]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut partial = [0.0f32; LANES];
    let (a_body, a_tail) = a.split_at(a.len() / LANES * LANES);
    let (b_body, b_tail) = b.split_at(a_body.len());
    for (x, y) in a_body.chunks_exact(LANES).zip(b_body.chunks_exact(LANES)) {
        for i in 0..LANES {
            partial[i] += x[i] * y[i];
        }
    }
    partial.iter().sum::<f32>() + a_tail.iter().zip(b_tail).map(|(x, y)| x * y).sum::<f32>()
}

with_avx2!(fn swiglu_in_place(up: &mut [f32], gate: &[f32]) => swiglu_rows);

with_avx2!(fn swiglu_backward_in_place(d_gate: &mut [f32], d_up: &mut [f32], gate: &[f32], up: &[f32], grad: &[f32]) => swiglu_backward_rows);

/// `∂up = ∂y ⊙ silu(g)`, `∂g = ∂y ⊙ up ⊙ σ(g) (1 + g (1 − σ(g)))`.
#[inline(always)]
pub(super) fn swiglu_backward_rows(d_gate: &mut [f32], d_up: &mut [f32], gate: &[f32], up: &[f32], grad: &[f32]) {
    for i in 0..grad.len() {
        let (g, dy) = (gate[i], grad[i]);
        let sigmoid = 1.0 / (1.0 + exp_f32(-g));
        d_up[i] = dy * g * sigmoid;
        d_gate[i] = dy * up[i] * sigmoid * (1.0 + g * (1.0 - sigmoid));
    }
}

/// `up ← silu(gate) ⊙ up`.
#[inline(always)]
pub(super) fn swiglu_rows(up: &mut [f32], gate: &[f32]) {
    for (u, &g) in up.iter_mut().zip(gate) {
        *u *= g / (1.0 + exp_f32(-g));
    }
}

/// `eˣ` for `f32` (Cephes' `expf`: `2ⁿ · p(r)` with `x = n ln 2 + r`, within 2 ulp), written
/// without branches or library calls so loops over it vectorise. Saturates below −87.3 and
/// above 88.7.
#[inline(always)]
pub(super) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    /// Adding then subtracting 1.5 · 2²³ rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.7);
    let shifted = x * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = ((((1.987_569_2e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 1.666_666_5e-1)
        * r
        + 0.5;
    let p = p * r * r + r + 1.0;
    // n + 127, the biased exponent of 2ⁿ, is in the low bits of `shifted`. Wrapping arithmetic
    // (it cannot overflow here) keeps overflow checks out of the loop, so it vectorises.
    let biased = shifted.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127);
    p * f32::from_bits(biased << 23)
}

/// `tanh` for `f32` as a rational function of `x` (Eigen's `generic_fast_tanh_float`): only
/// multiplications, additions and one division, so loops over it vectorise.
#[inline(always)]
pub(super) fn tanh_f32(x: f32) -> f32 {
    const CLAMP: f32 = 7.905_311;
    const A1: f32 = 4.893_524_6e-3;
    const A3: f32 = 6.372_619_3e-4;
    const A5: f32 = 1.485_722_4e-5;
    const A7: f32 = 5.122_297e-8;
    const A9: f32 = -8.604_672e-11;
    const A11: f32 = 2.000_188e-13;
    const A13: f32 = -2.760_768_5e-16;
    const B0: f32 = 4.893_525e-3;
    const B2: f32 = 2.268_434_6e-3;
    const B4: f32 = 1.185_347_1e-4;
    const B6: f32 = 1.198_258_4e-6;
    let x = x.clamp(-CLAMP, CLAMP);
    let x2 = x * x;
    let p = ((((((A13 * x2 + A11) * x2 + A9) * x2 + A7) * x2 + A5) * x2 + A3) * x2 + A1) * x;
    let q = ((B6 * x2 + B4) * x2 + B2) * x2 + B0;
    p / q
}
