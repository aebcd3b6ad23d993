//! The gates of gated MLPs (SwiGLU, GeGLU) on CubeCL backends: one launch forward and one
//! backward, one unit per element, reading `gate` and `up` through their strides (the halves of a fused
//! gate-and-up product are read in place). The formulas are `backend/glu.rs`'s.

use burn::tensor::TensorMetadata;
use burn::tensor::ops::FloatTensor;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::calculate_cube_count_elemwise;
use cubecl::prelude::*;
use rein_gguf::GateActivation;

use super::{count_launch, empty_like};
use crate::backend::GluKernels;
use crate::backend::glu::{GELU_CUBIC, SQRT_2_OVER_PI};

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> GluKernels for CubeBackend<R, F, I, BT> {
    fn glu(gate: FloatTensor<Self>, up: FloatTensor<Self>, activation: GateActivation) -> FloatTensor<Self> {
        let out = empty_like(&gate, gate.shape());
        if out.shape().num_elements() == 0 {
            return out;
        }
        let (cubes, cube_dim) = elementwise(&out);
        let dtype = gate.dtype;
        count_launch();
        glu_kernel::launch::<R>(
            &out.client.clone(),
            cubes,
            cube_dim,
            gate.into_tensor_arg(),
            up.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            activation == GateActivation::GeluTanh,
            dtype.into(),
        );
        out
    }

    fn glu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        activation: GateActivation,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (d_gate, d_up) = (empty_like(&gate, gate.shape()), empty_like(&gate, gate.shape()));
        if d_gate.shape().num_elements() == 0 {
            return (d_gate, d_up);
        }
        let (cubes, cube_dim) = elementwise(&d_gate);
        let dtype = gate.dtype;
        count_launch();
        glu_backward_kernel::launch::<R>(
            &d_gate.client.clone(),
            cubes,
            cube_dim,
            gate.into_tensor_arg(),
            up.into_tensor_arg(),
            grad.into_tensor_arg(),
            d_gate.clone().into_tensor_arg(),
            d_up.clone().into_tensor_arg(),
            activation == GateActivation::GeluTanh,
            dtype.into(),
        );
        (d_gate, d_up)
    }
}

/// `act(g)` and `act'(g)`, in f32.
#[cube]
fn activate(g: f32, #[comptime] gelu: bool) -> (f32, f32) {
    if comptime!(gelu) {
        let u = (g + GELU_CUBIC * g * g * g) * SQRT_2_OVER_PI;
        let e = f32::exp(-2.0f32 * f32::abs(u));
        let denominator = 1.0f32 + e;
        // ½ (1 + tanh u): 1/(1 + e) for u ≥ 0, e/(1 + e) below.
        let half_one_plus = select(u >= 0.0f32, 1.0f32, e) / denominator;
        let sech2 = 4.0f32 * e / (denominator * denominator);
        let du = SQRT_2_OVER_PI * (1.0f32 + 3.0f32 * GELU_CUBIC * g * g);
        (g * half_one_plus, half_one_plus + 0.5f32 * g * sech2 * du)
    } else {
        let sigmoid = 1.0f32 / (1.0f32 + f32::exp(-g));
        (g * sigmoid, sigmoid * (1.0f32 + g * (1.0f32 - sigmoid)))
    }
}

/// `out = act(gate) ⊙ up`, `[rows, width]`, `gate` and `up` read through their strides.
#[cube(launch)]
fn glu_kernel<F: Float>(
    gate: &Tensor<F>,
    up: &Tensor<F>,
    out: &mut Tensor<F>,
    #[comptime] gelu: bool,
    #[define(F)] _dtype: StorageType,
) {
    let at = ABSOLUTE_POS;
    if at >= out.len() {
        terminate!();
    }
    let width = out.shape(1);
    let (row, column) = (at / width, at % width);
    let g = f32::cast_from(gate[row * gate.stride(0) + column * gate.stride(1)]);
    let u = f32::cast_from(up[row * up.stride(0) + column * up.stride(1)]);
    let (activated, _) = activate(g, gelu);
    out[at] = F::cast_from(activated * u);
}

/// `∂gate = ∂y ⊙ up ⊙ act'(gate)` and `∂up = ∂y ⊙ act(gate)`, inputs read through their
/// strides.
#[cube(launch)]
fn glu_backward_kernel<F: Float>(
    gate: &Tensor<F>,
    up: &Tensor<F>,
    grad: &Tensor<F>,
    d_gate: &mut Tensor<F>,
    d_up: &mut Tensor<F>,
    #[comptime] gelu: bool,
    #[define(F)] _dtype: StorageType,
) {
    let at = ABSOLUTE_POS;
    if at >= d_gate.len() {
        terminate!();
    }
    let width = d_gate.shape(1);
    let (row, column) = (at / width, at % width);
    let g = f32::cast_from(gate[row * gate.stride(0) + column * gate.stride(1)]);
    let u = f32::cast_from(up[row * up.stride(0) + column * up.stride(1)]);
    let dy = f32::cast_from(grad[row * grad.stride(0) + column * grad.stride(1)]);
    let (activated, slope) = activate(g, gelu);
    d_gate[at] = F::cast_from(dy * u * slope);
    d_up[at] = F::cast_from(dy * activated);
}

/// One unit per element of `like`, in cubes of [`super::ROW_UNITS`].
fn elementwise<R: CubeRuntime>(like: &CubeTensor<R>) -> (CubeCount, CubeDim) {
    let cube_dim = CubeDim::new_1d(super::ROW_UNITS);
    let count = calculate_cube_count_elemwise(&like.client, like.shape().num_elements(), cube_dim);
    (count, cube_dim)
}
