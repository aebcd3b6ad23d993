//! RMSNorm on CubeCL backends: one cube per row forward; backward, one cube per row for `∂x`
//! and, for `∂w`, one unit per column and block of rows, then one per column over the blocks:
//! every sum in a fixed order, so `∂w` has the same bits on every run.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::{empty_device_contiguous_dtype, zeros_client};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::calculate_cube_count_elemwise;
use cubecl::prelude::*;

use super::{ROW_UNITS, count_launch, cube_reduce, empty_like};
use crate::backend::NormKernels;

/// Rows per block of the `∂w` kernel: each unit sums this many rows of its column.
const ROWS_PER_BLOCK: usize = 64;

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> NormKernels for CubeBackend<R, F, I, BT> {
    fn rms_norm(x: FloatTensor<Self>, weight: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        rms_norm(x, weight, eps)
    }

    fn rms_norm_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        rms_norm_backward(x, weight, grad, eps)
    }
}

/// `1/sqrt(mean(x²) + ε)` of the `hidden` values of `x` from `base`, the cube's units each
/// summing every `CUBE_DIM_X`-th square.
#[cube]
fn row_inv_rms<F: Float>(x: &Tensor<F>, base: usize, hidden: usize, eps: f32, shared: &mut SharedMemory<f32>) -> f32 {
    let (unit, units) = (UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let mut squares = 0.0f32;
    let mut i = unit;
    while i < hidden {
        let v = f32::cast_from(x[base + i]);
        squares += v * v;
        i += units;
    }
    1.0f32 / f32::sqrt(cube_reduce(squares, shared, false) / f32::cast_from(hidden) + eps)
}

/// `out = w ⊙ x / sqrt(mean(x²) + ε)` for the row of this cube.
#[cube(launch)]
fn rms_norm_kernel<F: Float>(
    x: &Tensor<F>,
    weight: &Tensor<F>,
    out: &mut Tensor<F>,
    rows: u32,
    hidden: u32,
    eps: f32,
    #[define(F)] _dtype: StorageType,
) {
    let row = CUBE_POS;
    if row >= rows as usize {
        terminate!();
    }
    let (hidden, unit, units) = (hidden as usize, UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let base = row * hidden;
    let mut shared = SharedMemory::<f32>::new(ROW_UNITS as usize);
    let inv_rms = row_inv_rms::<F>(x, base, hidden, eps, &mut shared);
    let mut i = unit;
    while i < hidden {
        out[base + i] = F::cast_from(f32::cast_from(weight[i]) * (f32::cast_from(x[base + i]) * inv_rms));
        i += units;
    }
}

/// `∂x = r (g − x̂ mean(g ⊙ x̂))` for the row of this cube, `g = ∂y ⊙ w`, `x̂ = x r`; and the
/// row's `r = 1/sqrt(mean(x²) + ε)` into `inv_rms`, for the `∂w` kernel.
#[cube(launch)]
fn rms_norm_backward_x_kernel<F: Float>(
    x: &Tensor<F>,
    weight: &Tensor<F>,
    grad: &Tensor<F>,
    d_x: &mut Tensor<F>,
    inv_rms: &mut Tensor<f32>,
    rows: u32,
    hidden: u32,
    eps: f32,
    #[define(F)] _dtype: StorageType,
) {
    let row = CUBE_POS;
    if row >= rows as usize {
        terminate!();
    }
    let (hidden, unit, units) = (hidden as usize, UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let base = row * hidden;
    let mut shared = SharedMemory::<f32>::new(ROW_UNITS as usize);
    let r = row_inv_rms::<F>(x, base, hidden, eps, &mut shared);
    let mut gx = 0.0f32;
    let mut i = unit;
    while i < hidden {
        gx += f32::cast_from(grad[base + i]) * f32::cast_from(weight[i]) * f32::cast_from(x[base + i]);
        i += units;
    }
    // mean(g ⊙ x̂) = r Σ g x / hidden
    let projection = r * cube_reduce(gx, &mut shared, false) / f32::cast_from(hidden);
    let mut i = unit;
    while i < hidden {
        let g = f32::cast_from(grad[base + i]) * f32::cast_from(weight[i]);
        let normed = f32::cast_from(x[base + i]) * r;
        d_x[base + i] = F::cast_from(r * (g - normed * projection));
        i += units;
    }
    if unit == 0 {
        inv_rms[row] = r;
    }
}

/// `partial[b, j] = Σ ∂y[r, j] x[r, j] inv_rms[r]` over the rows `r` of block `b`, in order.
#[cube(launch)]
fn rms_norm_backward_weight_kernel<F: Float>(
    x: &Tensor<F>,
    grad: &Tensor<F>,
    inv_rms: &Tensor<f32>,
    partial: &mut Tensor<f32>,
    rows: u32,
    hidden: u32,
    #[define(F)] _dtype: StorageType,
) {
    let (rows, hidden) = (rows as usize, hidden as usize);
    let blocks = rows.div_ceil(ROWS_PER_BLOCK);
    let at = ABSOLUTE_POS;
    if at >= blocks * hidden {
        terminate!();
    }
    let (block, column) = (at / hidden, at % hidden);
    let first = block * ROWS_PER_BLOCK;
    let mut end = first + ROWS_PER_BLOCK;
    if end > rows {
        end = rows;
    }
    let mut sum = 0.0f32;
    let mut row = first;
    while row < end {
        let i = row * hidden + column;
        sum += f32::cast_from(grad[i]) * (f32::cast_from(x[i]) * inv_rms[row]);
        row += 1;
    }
    partial[at] = sum;
}

/// `d_weight[j] = Σ_b partial[b, j]`, blocks in order.
#[cube(launch)]
fn sum_blocks_kernel<F: Float>(
    partial: &Tensor<f32>,
    d_weight: &mut Tensor<F>,
    blocks: u32,
    hidden: u32,
    #[define(F)] _dtype: StorageType,
) {
    let (blocks, hidden) = (blocks as usize, hidden as usize);
    let column = ABSOLUTE_POS;
    if column >= hidden {
        terminate!();
    }
    let mut sum = 0.0f32;
    let mut block = 0usize;
    while block < blocks {
        sum += partial[block * hidden + column];
        block += 1;
    }
    d_weight[column] = F::cast_from(sum);
}

/// [`NormKernels::rms_norm`] in one launch.
pub(crate) fn rms_norm<R: CubeRuntime>(x: CubeTensor<R>, weight: CubeTensor<R>, eps: f64) -> CubeTensor<R> {
    let (x, weight) = (into_contiguous(x), into_contiguous(weight));
    let [rows, hidden] = dims2(&x);
    let out = empty_like(&x, x.shape());
    if rows == 0 || hidden == 0 {
        return out;
    }
    let client = x.client.clone();
    let dtype = x.dtype;
    count_launch();
    rms_norm_kernel::launch::<R>(
        &client,
        row_cubes(&client, rows),
        CubeDim::new_1d(super::ROW_UNITS),
        x.into_tensor_arg(),
        weight.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        rows as u32,
        hidden as u32,
        eps as f32,
        dtype.into(),
    );
    out
}

/// [`NormKernels::rms_norm_backward`] in three launches.
pub(crate) fn rms_norm_backward<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    grad: CubeTensor<R>,
    eps: f64,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let (x, weight, grad) = (into_contiguous(x), into_contiguous(weight), into_contiguous(grad));
    let [rows, hidden] = dims2(&x);
    let client = x.client.clone();
    let dtype = x.dtype;
    let d_x = empty_like(&x, x.shape());
    if rows == 0 || hidden == 0 {
        let d_weight = zeros_client(client, x.device.clone(), Shape::new([hidden]), dtype);
        return (d_x, d_weight);
    }
    let f32_tensor = |shape: Shape| empty_device_contiguous_dtype(client.clone(), x.device.clone(), shape, DType::F32);
    let inv_rms = f32_tensor(Shape::new([rows]));
    count_launch();
    rms_norm_backward_x_kernel::launch::<R>(
        &client,
        row_cubes(&client, rows),
        CubeDim::new_1d(super::ROW_UNITS),
        x.clone().into_tensor_arg(),
        weight.clone().into_tensor_arg(),
        grad.clone().into_tensor_arg(),
        d_x.clone().into_tensor_arg(),
        inv_rms.clone().into_tensor_arg(),
        rows as u32,
        hidden as u32,
        eps as f32,
        dtype.into(),
    );
    let blocks = rows.div_ceil(ROWS_PER_BLOCK);
    let partial = f32_tensor(Shape::new([blocks, hidden]));
    let cube_dim = CubeDim::new_1d(super::ROW_UNITS);
    count_launch();
    rms_norm_backward_weight_kernel::launch::<R>(
        &client,
        calculate_cube_count_elemwise(&client, blocks * hidden, cube_dim),
        cube_dim,
        x.into_tensor_arg(),
        grad.into_tensor_arg(),
        inv_rms.into_tensor_arg(),
        partial.clone().into_tensor_arg(),
        rows as u32,
        hidden as u32,
        dtype.into(),
    );
    let d_weight = empty_like(&weight, Shape::new([hidden]));
    count_launch();
    sum_blocks_kernel::launch::<R>(
        &client,
        calculate_cube_count_elemwise(&client, hidden, cube_dim),
        cube_dim,
        partial.into_tensor_arg(),
        d_weight.clone().into_tensor_arg(),
        blocks as u32,
        hidden as u32,
        dtype.into(),
    );
    (d_x, d_weight)
}

fn dims2<R: CubeRuntime>(x: &CubeTensor<R>) -> [usize; 2] {
    let shape = x.shape();
    [shape[0], shape[1]]
}

/// One cube per row, `rows` in all, over as many dimensions as the device needs.
fn row_cubes<R: CubeRuntime>(client: &ComputeClient<R>, rows: usize) -> CubeCount {
    let cube_dim = CubeDim::new_1d(1);
    calculate_cube_count_elemwise(client, rows, cube_dim)
}
