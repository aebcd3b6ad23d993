//! The gates of gated MLPs — SwiGLU's `silu(gate) ⊙ up` and GeGLU's `gelu_tanh(gate) ⊙ up` —
//! and their backward: one pass on Flex (reading the halves of a fused gate-and-up product in
//! place), and an autodiff version with its own backward.
//!
//! ```text
//! silu(g)      = g · σ(g)                                   silu'(g)      = σ(g) (1 + g (1 − σ(g)))
//! gelu_tanh(g) = ½ g (1 + tanh(u)),  u = √(2/π) (g + 0.044715 g³)
//! gelu_tanh'(g) = ½ (1 + tanh(u)) + ½ g (1 − tanh²(u)) √(2/π) (1 + 3 · 0.044715 g²)
//! ```
//!
//! `1 + tanh(u)` and `1 − tanh²(u)` are computed from `e = exp(−2|u|)` — `2/(1 + e)` (or
//! `2e/(1 + e)` for `u < 0`) and `4e/(1 + e)²` — not from `tanh(u)` itself: near saturation an
//! `f32` `tanh` has lost the digits both need (at `u = 6`, `1 − tanh²` from a correctly rounded
//! `tanh` is 0.08 % off, from a 2-ulp one 1 %).

use burn::backend::Flex;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use rein_kernels::team;

use rein_gguf::GateActivation;

use super::flex::{
    BLOCK, PARALLEL_ELEMENTS, dims, exp_f32, f32s, for_blocks, nested, rows_of, shape_2d, tensor, with_avx2,
};
use super::{ReinBackend, float, generic_ops, register_inputs};

/// `√(2/π)`, in GELU's tanh approximation.
pub(super) const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic term's coefficient in GELU's tanh approximation.
pub(super) const GELU_CUBIC: f32 = 0.044_715;

/// The gates of gated MLPs with their backward.
pub trait GluKernels: burn::tensor::backend::Backend {
    /// The gate `act(gate) ⊙ up`, element-wise.
    ///
    /// # Shapes
    /// - `gate`, `up`: `[rows, width]` → `[rows, width]`
    fn glu(gate: FloatTensor<Self>, up: FloatTensor<Self>, activation: GateActivation) -> FloatTensor<Self> {
        glu_ops::<Self>(gate, up, activation)
    }

    /// The gradients of [`GluKernels::glu`] given the output's, `(∂gate, ∂up)`:
    /// `∂up = ∂y ⊙ act(gate)`, `∂gate = ∂y ⊙ up ⊙ act'(gate)` (the module's doc gives `act'`).
    ///
    /// # Shapes
    /// - `gate`, `up`, `grad`: `[rows, width]` → two `[rows, width]`
    fn glu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        activation: GateActivation,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        glu_backward_ops::<Self>(gate, up, grad, activation)
    }
}

/// `gelu_tanh(g) = ½ g (1 + tanh(u))` in burn ops, with `½ (1 + tanh(u))` and
/// `1 − tanh²(u)` (see the module's doc).
fn gelu_tanh_ops<B: burn::tensor::backend::Backend>(gate: Tensor<B, 2>) -> [Tensor<B, 2>; 3] {
    let cubic = gate.clone().powi_scalar(3).mul_scalar(GELU_CUBIC);
    let u = (gate.clone() + cubic).mul_scalar(SQRT_2_OVER_PI);
    let e = u.clone().abs().mul_scalar(-2.0).exp();
    let denominator = e.clone().add_scalar(1.0);
    // ½ (1 + tanh u): 1/(1 + e) for u ≥ 0, e/(1 + e) below.
    let positive = u.greater_equal_elem(0.0);
    let half_one_plus = e.clone().mask_fill(positive, 1.0) / denominator.clone();
    let sech2 = e.mul_scalar(4.0) / denominator.powi_scalar(2);
    [gate * half_one_plus.clone(), half_one_plus, sech2]
}

/// [`GluKernels::glu`] in burn ops.
pub(super) fn glu_ops<B: burn::tensor::backend::Backend>(
    gate: FloatTensor<B>,
    up: FloatTensor<B>,
    activation: GateActivation,
) -> FloatTensor<B> {
    let gate = float::<B, 2>(gate);
    let activated = match activation {
        GateActivation::Silu => burn::tensor::activation::silu(gate),
        GateActivation::GeluTanh => {
            let [activated, _, _] = gelu_tanh_ops(gate);
            activated
        }
    };
    (activated * float::<B, 2>(up)).into_primitive().tensor()
}

/// [`GluKernels::glu_backward`] in burn ops.
pub(super) fn glu_backward_ops<B: burn::tensor::backend::Backend>(
    gate: FloatTensor<B>,
    up: FloatTensor<B>,
    grad: FloatTensor<B>,
    activation: GateActivation,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (gate, up, grad) = (float::<B, 2>(gate), float::<B, 2>(up), float::<B, 2>(grad));
    let (activated, slope) = match activation {
        GateActivation::Silu => {
            let sigmoid = burn::tensor::activation::sigmoid(gate.clone());
            let slope = sigmoid.clone() * (gate.clone() * (sigmoid.clone().neg().add_scalar(1.0))).add_scalar(1.0);
            (gate * sigmoid, slope)
        }
        GateActivation::GeluTanh => {
            let [activated, half_one_plus, sech2] = gelu_tanh_ops(gate.clone());
            let du = gate
                .clone()
                .powi_scalar(2)
                .mul_scalar(3.0 * GELU_CUBIC)
                .add_scalar(1.0)
                .mul_scalar(SQRT_2_OVER_PI);
            let slope = half_one_plus + gate.mul_scalar(0.5) * sech2 * du;
            (activated, slope)
        }
    };
    let d_up = grad.clone() * activated;
    let d_gate = grad * up * slope;
    (d_gate.into_primitive().tensor(), d_up.into_primitive().tensor())
}

impl GluKernels for Flex {
    fn glu(gate: FloatTensor<Self>, up: FloatTensor<Self>, activation: GateActivation) -> FloatTensor<Self> {
        if gate.dtype() != DType::F32 || up.dtype() != DType::F32 || generic_ops() {
            return glu_ops::<Self>(gate, up, activation);
        }
        let in_place = |up: &mut [f32], gate: &[f32]| match activation {
            GateActivation::Silu => swiglu_in_place(up, gate),
            GateActivation::GeluTanh => geglu_in_place(up, gate),
        };
        if let (Some(gate_rows), Some(up_rows)) = (rows_of(&gate), rows_of(&up))
            && !up.is_contiguous()
        {
            // Views of one gate-and-up product (fused projections): read in place, not copied.
            let [rows, width] = shape_2d(&up);
            let mut out = vec![0.0f32; rows * width];
            for (r, out) in out.chunks_exact_mut(width).enumerate() {
                out.copy_from_slice(up_rows(r));
                in_place(out, gate_rows(r));
            }
            return tensor(out, &[rows, width]);
        }
        let gate = gate.to_contiguous();
        // Written over `up` (usually a fresh, unshared projection, so no copy).
        let mut up = up.to_contiguous();
        let n = up.layout().num_elements();
        let gate = f32s(&gate);
        for_blocks(&mut up.storage_mut::<f32>()[..n], BLOCK, |i, up| {
            in_place(up, &gate[i * BLOCK..][..up.len()])
        });
        up
    }

    fn glu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        activation: GateActivation,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let f32s_only = [&gate, &up, &grad].iter().all(|t| t.dtype() == DType::F32);
        if !f32s_only || generic_ops() {
            return glu_backward_ops::<Self>(gate, up, grad, activation);
        }
        let shape = dims(&grad);
        let (gate, up, grad) = (gate.to_contiguous(), up.to_contiguous(), grad.to_contiguous());
        let (g, u, dy) = (f32s(&gate), f32s(&up), f32s(&grad));
        let mut d_gate = vec![0.0f32; dy.len()];
        let mut d_up = vec![0.0f32; dy.len()];
        let block = |(i, (d_gate, d_up)): (usize, (&mut [f32], &mut [f32]))| {
            let at = i * BLOCK..i * BLOCK + d_gate.len();
            let (g, u, dy) = (&g[at.clone()], &u[at.clone()], &dy[at]);
            match activation {
                GateActivation::Silu => swiglu_backward_in_place(d_gate, d_up, g, u, dy),
                GateActivation::GeluTanh => geglu_backward_in_place(d_gate, d_up, g, u, dy),
            }
        };
        if dy.len() >= PARALLEL_ELEMENTS && !nested() {
            let blocks = d_gate.chunks_mut(BLOCK).zip(d_up.chunks_mut(BLOCK)).enumerate();
            team::for_each(blocks.collect(), block);
        } else {
            d_gate
                .chunks_mut(BLOCK)
                .zip(d_up.chunks_mut(BLOCK))
                .enumerate()
                .for_each(block);
        }
        (tensor(d_gate, &shape), tensor(d_up, &shape))
    }
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

with_avx2!(fn geglu_in_place(up: &mut [f32], gate: &[f32]) => geglu_rows);

with_avx2!(fn geglu_backward_in_place(d_gate: &mut [f32], d_up: &mut [f32], gate: &[f32], up: &[f32], grad: &[f32]) => geglu_backward_rows);

/// `(½ (1 + tanh u), 1 − tanh² u)` of GELU's `u` for the gate value `g` (see the module's doc).
#[inline(always)]
fn gelu_tanh_terms(g: f32) -> (f32, f32) {
    let u = SQRT_2_OVER_PI * (g + GELU_CUBIC * g * g * g);
    let e = exp_f32(-2.0 * u.abs());
    let denominator = 1.0 + e;
    let half_one_plus = if u >= 0.0 { 1.0 } else { e } / denominator;
    (half_one_plus, 4.0 * e / (denominator * denominator))
}

/// `up ← gelu_tanh(gate) ⊙ up`.
#[inline(always)]
pub(super) fn geglu_rows(up: &mut [f32], gate: &[f32]) {
    for (u, &g) in up.iter_mut().zip(gate) {
        *u *= g * gelu_tanh_terms(g).0;
    }
}

/// `∂up = ∂y ⊙ gelu_tanh(g)`, `∂g = ∂y ⊙ up ⊙ gelu_tanh'(g)` (the module's doc).
#[inline(always)]
pub(super) fn geglu_backward_rows(d_gate: &mut [f32], d_up: &mut [f32], gate: &[f32], up: &[f32], grad: &[f32]) {
    for i in 0..grad.len() {
        let (g, dy) = (gate[i], grad[i]);
        let (half_one_plus, sech2) = gelu_tanh_terms(g);
        let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * g * g);
        d_up[i] = dy * g * half_one_plus;
        d_gate[i] = dy * up[i] * (half_one_plus + 0.5 * g * sech2 * du);
    }
}

impl<B: ReinBackend, C: CheckpointStrategy> GluKernels for Autodiff<B, C> {
    /// The gate with its own backward ([`GluKernels::glu_backward`], one pass on Flex).
    fn glu(gate: FloatTensor<Self>, up: FloatTensor<Self>, activation: GateActivation) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Glu;

        impl<B: ReinBackend> Backward<B, 2> for Glu {
            /// `gate`, `up` and the activation.
            type State = (FloatTensor<B>, FloatTensor<B>, GateActivation);

            fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
                let (gate, up, activation) = ops.state;
                let grad = grads.consume::<B>(&ops.node);
                let inputs = ops.parents.map(|node| node.map(|n| n.id));
                let (d_gate, d_up) = B::glu_backward(gate, up, grad, activation);
                register_inputs::<B, 2>(inputs, grads, [d_gate, d_up]);
            }
        }

        match Glu
            .prepare::<C>([gate.node.clone(), up.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let state = (gate.primitive.clone(), up.primitive.clone(), activation);
                prep.finish(state, B::glu(gate.primitive, up.primitive, activation))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::glu(gate.primitive, up.primitive, activation)),
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Distribution, Tensor, TensorPrimitive};

    use super::*;
    use crate::backend::testing::{A, assert_close, assert_tensors_close, random, raw};

    const ACTIVATIONS: [GateActivation; 2] = [GateActivation::Silu, GateActivation::GeluTanh];

    #[test]
    fn glu_backward_equals_burns_autodiff_of_the_ops() {
        // The second shape is large enough to be split across threads (a ragged last block).
        for shape in [[7, 45], [300, 130]] {
            for activation in ACTIVATIONS {
                glu_case(shape, activation);
            }
        }
    }

    fn glu_case(shape: [usize; 2], activation: GateActivation) {
        let device = Default::default();
        let random = |seed| {
            <A as burn::tensor::backend::Backend>::seed(&device, seed);
            Tensor::<A, 2>::random(shape, Distribution::Normal(0.0, 3.0), &device).require_grad()
        };
        let (gate, up, weights) = (random(1), random(2), random(3));
        let run = |kernel: bool| {
            let _graph = crate::one_graph();
            let (g, u) = (
                gate.clone().into_primitive().tensor(),
                up.clone().into_primitive().tensor(),
            );
            let y = if kernel {
                A::glu(g, u, activation)
            } else {
                super::glu_ops::<A>(g, u, activation)
            };
            let y = Tensor::<A, 2>::from_primitive(TensorPrimitive::Float(y));
            let grads = (y.clone() * weights.clone()).sum().backward();
            let values = |t: Tensor<Flex, 2>| t.into_data().to_vec::<f32>().unwrap();
            [
                y.into_data().to_vec::<f32>().unwrap(),
                values(gate.grad(&grads).unwrap()),
                values(up.grad(&grads).unwrap()),
            ]
        };
        let (kernel, ops) = (run(true), run(false));
        for (what, (a, b)) in ["values", "∂gate", "∂up"].iter().zip(kernel.iter().zip(&ops)) {
            assert_close(&format!("{activation:?} {what}"), a, b, 1e-5);
        }
    }

    #[test]
    fn glu_matches_burn_ops() {
        for activation in ACTIVATIONS {
            let (gate, up) = (random([4, 9], 16).mul_scalar(8.0), random([4, 9], 17));
            assert_tensors_close(
                Flex::glu(raw(&gate), raw(&up), activation),
                glu_ops::<Flex>(raw(&gate), raw(&up), activation),
            );
            // The two halves of one fused gate-and-up product, read as views.
            let gate_up = random([5, 18], 18).mul_scalar(4.0);
            let (gate, up) = (gate_up.clone().narrow(1, 0, 9), gate_up.narrow(1, 9, 9));
            assert!(!raw(&up).is_contiguous());
            assert_tensors_close(
                Flex::glu(raw(&gate), raw(&up), activation),
                glu_ops::<Flex>(raw(&gate), raw(&up), activation),
            );
        }
    }

    /// GeGLU's GELU is transformers' `gelu_pytorch_tanh` (`torch.nn.functional.gelu(x,
    /// approximate="tanh")`): values it gives, to 1e-6.
    #[test]
    fn gelu_tanh_matches_pytorch() {
        // torch.nn.functional.gelu(torch.tensor([-3.0, -1.0, -0.25, 0.0, 0.5, 2.0, 4.0]), approximate="tanh")
        let pytorch = [
            -0.003_637_433,
            -0.158_808,
            -0.100_324_646,
            0.0,
            0.345_714,
            1.954_597_7,
            3.999_93,
        ];
        let gate = [-3.0f32, -1.0, -0.25, 0.0, 0.5, 2.0, 4.0];
        let mut up = [1.0f32; 7];
        geglu_rows(&mut up, &gate);
        for (got, want) in up.iter().zip(pytorch) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
    }
}
