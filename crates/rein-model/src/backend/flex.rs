//! What rein's kernels on burn-flex, the CPU backend, share: viewing tensors as slices and
//! matrices, splitting work across threads (in a fixed order, so no result depends on the
//! split), the AVX2 copies of the row kernels, and the row arithmetic (`exp`, dot products).
//!
//! Every kernel computes in `f32` and falls back to the burn-op default for other dtypes.

use burn::backend::Flex;
use burn::tensor::{DType, TensorData};
use burn_flex::FlexTensor;
use rein_kernels::team;
use rein_kernels::{Init, Isa, MatRef};

use super::{ReinBackend, generic_ops};

impl ReinBackend for Flex {
    /// One shard per thread once each gets 8 rows or more: every op of a decoding step then
    /// runs on all cores without waiting on the others, where splitting each small op costs
    /// more in synchronisation than it saves (SmolLM2 at batch 16 on a 2-core Xeon: 277
    /// tokens/s as one shard, 304 as two of 8 rows).
    fn decode_shards(rows: usize) -> usize {
        if nested() || generic_ops() {
            1
        } else {
            rayon::current_num_threads().min(rows / 8).max(1)
        }
    }
}

/// Multiply-adds below which a kernel stays on one thread.
pub(super) const PARALLEL_WORK: usize = 1 << 16;

/// Elements below which an element-wise kernel stays on one thread.
pub(super) const PARALLEL_ELEMENTS: usize = 1 << 15;

/// Elements per task of an element-wise kernel split across threads: fixed, so the split never
/// depends on the thread count (and no result on the split: each element is computed alone).
pub(super) const BLOCK: usize = 1 << 13;

/// Whole rows of `width` per task of a row-wise kernel (about [`BLOCK`] elements).
pub(super) fn rows_per_block(width: usize) -> usize {
    (BLOCK / width.max(1)).max(1)
}

/// `f(i, block i of out)` over consecutive blocks of `block` elements, on all threads when
/// `out` is large enough and this thread is not already one of several parallel tasks.
pub(super) fn for_blocks(out: &mut [f32], block: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if out.len() >= PARALLEL_ELEMENTS && !nested() {
        team::for_each(out.chunks_mut(block).enumerate().collect(), |(i, out)| f(i, out));
    } else {
        out.chunks_mut(block).enumerate().for_each(|(i, out)| f(i, out));
    }
}

/// `f(r, row r of out)` for each row of `out` (`out_width` wide), on all threads when the rows'
/// work (`work_per_row` elements each) is large enough and this thread is not already one of
/// several parallel tasks. Each row is computed alone, so the split never changes a result.
pub(super) fn for_rows(out: &mut [f32], out_width: usize, work_per_row: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let width = out_width.max(1);
    let rows = out.len() / width;
    if rows * work_per_row >= PARALLEL_ELEMENTS && !nested() {
        // Tasks of whole rows, about `BLOCK` elements of work each.
        let per_task = (BLOCK / work_per_row.max(1)).max(1);
        team::for_each(out.chunks_mut(width * per_task).enumerate().collect(), |(t, out)| {
            for (r, out) in out.chunks_mut(width).enumerate() {
                f(t * per_task + r, out);
            }
        });
    } else {
        out.chunks_mut(width).enumerate().for_each(|(r, out)| f(r, out));
    }
}

/// Whether to run the AVX2 copies of the kernels below. The crate is built for baseline x86-64,
/// whose loops vectorise 4 floats wide (SSE2); the copies compiled for AVX2 run 8 wide. Both give
/// the same results bit for bit: vectorising never reorders floating-point operations, it only
/// changes how many run at once (and neither copy fuses multiply-adds).
#[inline(always)]
pub(super) fn has_avx2() -> bool {
    Isa::active() >= Isa::Avx2
}

/// Calls `$body` (an `#[inline(always)]` function) through a copy compiled for AVX2 where the
/// CPU has it.
macro_rules! with_avx2 {
    (fn $name:ident($($arg:ident: $ty:ty),*) => $body:ident) => {
        with_avx2!(fn $name($($arg: $ty),*) -> () => $body);
    };
    (fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty => $body:ident) => {
        pub(super) fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2")]
            fn avx2($($arg: $ty),*) -> $ret {
                $body($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            if $crate::backend::flex::has_avx2() {
                // SAFETY: the CPU has AVX2, checked just above.
                return unsafe { avx2($($arg),*) };
            }
            $body($($arg),*)
        }
    };
}

pub(super) use with_avx2;

/// Whether this thread already runs one of several parallel tasks (a decoding shard), so a
/// kernel splitting its work further would only add synchronisation.
pub(super) fn nested() -> bool {
    team::threads() < 2
}

pub(super) fn dims(x: &FlexTensor) -> Vec<usize> {
    let shape = x.layout().shape();
    (0..shape.num_dims()).map(|i| shape[i]).collect()
}

pub(super) fn shape_2d(x: &FlexTensor) -> [usize; 2] {
    let shape = x.layout().shape();
    [shape[0], shape[1]]
}

/// A linear layer's `[rows, outputs]` output before its product: the bias in every row (the
/// product then accumulates), or zeros.
pub(super) fn output_from_bias(bias: Option<&FlexTensor>, rows: usize, outputs: usize) -> (Vec<f32>, Init) {
    match bias {
        Some(bias) => (f32s(&bias.to_contiguous()).repeat(rows), Init::Accumulate),
        None => (vec![0.0f32; rows * outputs], Init::Zero),
    }
}

/// The elements of a contiguous `f32` tensor.
pub(super) fn f32s(x: &FlexTensor) -> &[f32] {
    &x.storage::<f32>()[..x.layout().num_elements()]
}

pub(super) fn tensor(values: Vec<f32>, shape: &[usize]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape.to_vec()))
}

/// A 2-D `f32` tensor as a kernel matrix view, read through its strides (`None` for other
/// dtypes, ranks or negative strides).
pub(super) fn matrix(x: &FlexTensor) -> Option<MatRef<'_>> {
    let layout = x.layout();
    if x.dtype() != DType::F32 || layout.shape().num_dims() != 2 {
        return None;
    }
    let strides = layout.strides();
    let strides = [usize::try_from(strides[0]).ok()?, usize::try_from(strides[1]).ok()?];
    let shape = [layout.shape()[0], layout.shape()[1]];
    MatRef::new(x.storage::<f32>(), layout.start_offset(), shape, strides).ok()
}

/// Row `r` of a 2-D `f32` tensor whose rows are contiguous (column stride 1), whatever its row
/// stride; `None` for other layouts.
pub(super) fn rows_of<'a>(x: &'a FlexTensor) -> Option<impl Fn(usize) -> &'a [f32]> {
    let layout = x.layout();
    let strides = layout.strides();
    if layout.shape().num_dims() != 2 || strides[1] != 1 || strides[0] < 0 {
        return None;
    }
    let (start, stride, width) = (layout.start_offset(), strides[0] as usize, layout.shape()[1]);
    let storage = x.storage::<f32>();
    Some(move |r: usize| &storage[start + r * stride..start + r * stride + width])
}

/// An integer tensor's elements as indices (`None` for dtypes other than `i32` and `i64`).
pub(super) fn indices(x: &FlexTensor) -> Option<Vec<usize>> {
    let x = x.to_contiguous();
    let n = x.layout().num_elements();
    match x.dtype() {
        DType::I32 => Some(x.storage::<i32>()[..n].iter().map(|&i| i as usize).collect()),
        DType::I64 => Some(x.storage::<i64>()[..n].iter().map(|&i| i as usize).collect()),
        _ => None,
    }
}

/// The rows along the last axis of a 4-D `f32` tensor, read in place through its strides
/// (transposed views included): row `(i, j, t)` starts at `start + i·s₀ + j·s₁ + t·s₂`.
#[derive(Clone, Copy)]
pub(super) struct Rows<'a> {
    pub(super) data: &'a [f32],
    pub(super) start: usize,
    pub(super) strides: [usize; 3],
    pub(super) width: usize,
}

impl<'a> Rows<'a> {
    /// `None` unless `x` is a 4-D `f32` tensor with contiguous rows and non-negative strides.
    pub(super) fn try_of(x: &'a FlexTensor) -> Option<Self> {
        let layout = x.layout();
        let strides = layout.strides();
        if x.dtype() != DType::F32 || layout.shape().num_dims() != 4 || strides[3] != 1 {
            return None;
        }
        let stride = |i: usize| usize::try_from(strides[i]).ok();
        Some(Self {
            data: x.storage::<f32>(),
            start: layout.start_offset(),
            strides: [stride(0)?, stride(1)?, stride(2)?],
            width: layout.shape()[3],
        })
    }

    /// The rows of a tensor that [`readable`] returned.
    pub(super) fn of(x: &'a FlexTensor) -> Self {
        Self::try_of(x).expect("a readable 4-D f32 tensor")
    }

    #[inline(always)]
    pub(super) fn row(&self, i: usize, j: usize, t: usize) -> &'a [f32] {
        let [s0, s1, s2] = self.strides;
        &self.data[self.start + i * s0 + j * s1 + t * s2..][..self.width]
    }
}

/// `x` itself when [`Rows`] can read it in place, else a contiguous copy.
pub(super) fn readable(x: FlexTensor) -> FlexTensor {
    if Rows::try_of(&x).is_some() {
        x
    } else {
        x.to_contiguous()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_matches_libm() {
        let mut worst = 0.0f32;
        for i in -87_000..=88_000 {
            let x = i as f32 / 1_000.0;
            worst = worst.max((exp_f32(x) - x.exp()).abs() / x.exp());
        }
        assert!(worst < 3e-7, "max relative error {worst}");
        let tiny = exp_f32(f32::NEG_INFINITY);
        assert!((0.0..1e-37).contains(&tiny), "exp(-∞) = {tiny}");
    }
}
