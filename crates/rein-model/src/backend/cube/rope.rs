//! Rotary position embedding on CubeCL backends: one launch, one unit per element, reading `x`,
//! the positions and the tables through their strides. Its backward (`backend/rope.rs`) is the
//! same kernel with `−sin`.

use burn::tensor::TensorMetadata;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::calculate_cube_count_elemwise;
use cubecl::prelude::*;

use super::{count_launch, empty_like};
use crate::backend::RopeKernels;

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> RopeKernels for CubeBackend<R, F, I, BT> {
    fn rope(
        x: FloatTensor<Self>,
        positions: IntTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let out = empty_like(&x, x.shape());
        let elements = out.shape().num_elements();
        if elements == 0 {
            return out;
        }
        let cube_dim = CubeDim::new_1d(super::ROW_UNITS);
        let client = out.client.clone();
        let dtypes = [x.dtype.into(), positions.dtype.into()];
        count_launch();
        rope_kernel::launch::<R>(
            &client,
            calculate_cube_count_elemwise(&client, elements, cube_dim),
            cube_dim,
            x.into_tensor_arg(),
            positions.into_tensor_arg(),
            cos.into_tensor_arg(),
            sin.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            dtypes,
        );
        out
    }
}

/// `out[b, h, s, d] = x[b, h, s, d] cos[p, d] + rotate_half(x)[b, h, s, d] sin[p, d]` with
/// `p = positions[b, s]` and `rotate_half([a, b]) = [−b, a]`; `out` is contiguous.
#[cube(launch)]
fn rope_kernel<F: Float, I: Numeric>(
    x: &Tensor<F>,
    positions: &Tensor<I>,
    cos: &Tensor<F>,
    sin: &Tensor<F>,
    out: &mut Tensor<F>,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let at = ABSOLUTE_POS;
    if at >= out.len() {
        terminate!();
    }
    let (heads, seq, dim) = (out.shape(1), out.shape(2), out.shape(3));
    let d = at % dim;
    let s = (at / dim) % seq;
    let h = (at / (dim * seq)) % heads;
    let b = at / (dim * seq * heads);
    let half = dim / 2;
    let row = b * x.stride(0) + h * x.stride(1) + s * x.stride(2);
    let value = f32::cast_from(x[row + d * x.stride(3)]);
    // rotate_half: the element half a row away, negated in the first half.
    let sign = select(d < half, -1.0f32, 1.0f32);
    let partner = sign * f32::cast_from(x[row + ((d + half) % dim) * x.stride(3)]);
    let p = u32::cast_from(positions[b * positions.stride(0) + s * positions.stride(1)]) as usize;
    let c = f32::cast_from(cos[p * cos.stride(0) + d * cos.stride(1)]);
    let sn = f32::cast_from(sin[p * sin.stride(0) + d * sin.stride(1)]);
    out[at] = F::cast_from(value * c + partner * sn);
}
