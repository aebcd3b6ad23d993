//! The chosen tokens' log-probabilities and the entropies from rows of logits, on CubeCL
//! backends: one cube per row, forward and backward, each one launch where burn's ops take a
//! log-softmax, a gather, an exp, products and sums. The head's products and its chunking
//! (`backend/head.rs`) are unchanged.

use burn::tensor::TensorMetadata;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::calculate_cube_count_elemwise;
use cubecl::prelude::*;

use super::{ROW_UNITS, count_launch, cube_reduce, empty_like};
use crate::backend::HeadKernels;

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> HeadKernels for CubeBackend<R, F, I, BT> {
    fn log_prob_entropy(logits: FloatTensor<Self>, targets: IntTensor<Self>, scale: f32) -> FloatTensor<Self> {
        let [rows, _] = logits.shape().dims::<2>();
        let out = empty_like(&logits, [rows, 2].into());
        launch(logits, targets, scale, None, out.clone());
        out
    }

    fn log_prob_entropy_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        scale: f32,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let d_logits = empty_like(&logits, logits.shape());
        launch(logits, targets, scale, Some(grad), d_logits.clone());
        d_logits
    }
}

/// Forward (no `grad`): `out[row] = [log pₜ, H]`. Backward: `out[row, j] = scale · (g_lp ·
/// (1[j = t] − pⱼ) − g_H · pⱼ · (log pⱼ + H))` with `[g_lp, g_H] = grad[row]`. Here
/// `p = softmax(scale · z)`, `t = targets[row]`, and `z` is read through its strides.
#[cube(launch)]
fn log_prob_entropy_kernel<F: Float, T: Numeric>(
    logits: &Tensor<F>,
    targets: &Tensor<T>,
    grad: &Tensor<F>,
    out: &mut Tensor<F>,
    scale: f32,
    #[comptime] backward: bool,
    #[define(F, T)] _dtypes: [StorageType; 2],
) {
    let (rows, vocab) = (logits.shape(0), logits.shape(1));
    let row = CUBE_POS;
    if row >= rows {
        terminate!();
    }
    let (unit, units) = (UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let base = row * logits.stride(0);
    let step = logits.stride(1);
    let mut shared = SharedMemory::<f32>::new(ROW_UNITS as usize);

    let mut top = f32::new(-3.0e38);
    let mut j = unit;
    while j < vocab {
        let a = scale * f32::cast_from(logits[base + j * step]);
        top = select(a > top, a, top);
        j += units;
    }
    let top = cube_reduce(top, &mut shared, true);
    let mut sum = 0.0f32;
    let mut j = unit;
    while j < vocab {
        sum += f32::exp(scale * f32::cast_from(logits[base + j * step]) - top);
        j += units;
    }
    let log_sum = top + f32::ln(cube_reduce(sum, &mut shared, false));
    // H = −Σ pⱼ log pⱼ, from log pⱼ = a_j − log Σ exp(a).
    let mut entropy = 0.0f32;
    let mut j = unit;
    while j < vocab {
        let log_p = scale * f32::cast_from(logits[base + j * step]) - log_sum;
        entropy -= f32::exp(log_p) * log_p;
        j += units;
    }
    let entropy = cube_reduce(entropy, &mut shared, false);
    let target = u32::cast_from(targets[row * targets.stride(0)]) as usize;

    if comptime!(backward) {
        let g_lp = f32::cast_from(grad[row * grad.stride(0)]);
        let g_h = f32::cast_from(grad[row * grad.stride(0) + grad.stride(1)]);
        let mut j = unit;
        while j < vocab {
            let log_p = scale * f32::cast_from(logits[base + j * step]) - log_sum;
            let p = f32::exp(log_p);
            let chosen = select(j == target, 1.0f32, 0.0f32);
            out[row * vocab + j] = F::cast_from(scale * (g_lp * (chosen - p) - g_h * p * (log_p + entropy)));
            j += units;
        }
    } else if unit == 0 {
        out[row * 2] = F::cast_from(scale * f32::cast_from(logits[base + target * step]) - log_sum);
        out[row * 2 + 1] = F::cast_from(entropy);
    }
}

/// Launches [`log_prob_entropy_kernel`]: forward without `grad`, backward with it.
fn launch<R: CubeRuntime>(
    logits: CubeTensor<R>,
    targets: CubeTensor<R>,
    scale: f32,
    grad: Option<CubeTensor<R>>,
    out: CubeTensor<R>,
) {
    let rows = logits.shape()[0];
    if rows == 0 {
        return;
    }
    let client = logits.client.clone();
    let backward = grad.is_some();
    // Forward never reads `grad`: the logits stand in.
    let grad = grad.unwrap_or_else(|| logits.clone());
    let dtypes = [logits.dtype.into(), targets.dtype.into()];
    count_launch();
    log_prob_entropy_kernel::launch::<R>(
        &client,
        calculate_cube_count_elemwise(&client, rows, CubeDim::new_1d(1)),
        CubeDim::new_1d(ROW_UNITS),
        logits.into_tensor_arg(),
        targets.into_tensor_arg(),
        grad.into_tensor_arg(),
        out.into_tensor_arg(),
        scale,
        backward,
        dtypes,
    );
}
