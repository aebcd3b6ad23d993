//! The SwiGLU gate `silu(gate) ⊙ up` and its backward: one pass on Flex (reading the halves of a
//! fused gate-and-up product in place), and an autodiff version with its own backward.

use burn::backend::Flex;
use burn::tensor::DType;
use burn::tensor::ops::FloatTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use rein_kernels::team;

use super::flex::{
    BLOCK, PARALLEL_ELEMENTS, dims, exp_f32, f32s, for_blocks, nested, rows_of, shape_2d, tensor, with_avx2,
};
use super::{ReinBackend, float, generic_ops, register_inputs};

/// The SwiGLU gate with its backward.
pub trait SwigluKernels: burn::tensor::backend::Backend {
    /// The SwiGLU gate, `silu(gate) ⊙ up`, element-wise.
    ///
    /// # Shapes
    /// - `gate`, `up`: `[rows, width]` → `[rows, width]`
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        swiglu_ops::<Self>(gate, up)
    }

    /// The gradients of [`SwigluKernels::swiglu`] given the output's, `(∂gate, ∂up)`:
    /// `∂up = ∂y ⊙ silu(gate)`, `∂gate = ∂y ⊙ up ⊙ σ(gate) ⊙ (1 + gate ⊙ (1 − σ(gate)))`.
    ///
    /// # Shapes
    /// - `gate`, `up`, `grad`: `[rows, width]` → two `[rows, width]`
    fn swiglu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        swiglu_backward_ops::<Self>(gate, up, grad)
    }
}

/// [`SwigluKernels::swiglu`] in burn ops.
pub(super) fn swiglu_ops<B: burn::tensor::backend::Backend>(
    gate: FloatTensor<B>,
    up: FloatTensor<B>,
) -> FloatTensor<B> {
    (burn::tensor::activation::silu(float::<B, 2>(gate)) * float::<B, 2>(up))
        .into_primitive()
        .tensor()
}

/// [`SwigluKernels::swiglu_backward`] in burn ops.
pub(super) fn swiglu_backward_ops<B: burn::tensor::backend::Backend>(
    gate: FloatTensor<B>,
    up: FloatTensor<B>,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (gate, up, grad) = (float::<B, 2>(gate), float::<B, 2>(up), float::<B, 2>(grad));
    let sigmoid = burn::tensor::activation::sigmoid(gate.clone());
    let d_up = grad.clone() * gate.clone() * sigmoid.clone();
    let slope = sigmoid.clone() * (gate * (sigmoid.neg().add_scalar(1.0))).add_scalar(1.0);
    let d_gate = grad * up * slope;
    (d_gate.into_primitive().tensor(), d_up.into_primitive().tensor())
}

impl SwigluKernels for Flex {
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        if gate.dtype() != DType::F32 || up.dtype() != DType::F32 || generic_ops() {
            return swiglu_ops::<Self>(gate, up);
        }
        if let (Some(gate_rows), Some(up_rows)) = (rows_of(&gate), rows_of(&up))
            && !up.is_contiguous()
        {
            // Views of one gate-and-up product (fused projections): read in place, not copied.
            let [rows, width] = shape_2d(&up);
            let mut out = vec![0.0f32; rows * width];
            for (r, out) in out.chunks_exact_mut(width).enumerate() {
                out.copy_from_slice(up_rows(r));
                swiglu_in_place(out, gate_rows(r));
            }
            return tensor(out, &[rows, width]);
        }
        let gate = gate.to_contiguous();
        // Written over `up` (usually a fresh, unshared projection, so no copy).
        let mut up = up.to_contiguous();
        let n = up.layout().num_elements();
        let gate = f32s(&gate);
        for_blocks(&mut up.storage_mut::<f32>()[..n], BLOCK, |i, up| {
            swiglu_in_place(up, &gate[i * BLOCK..][..up.len()])
        });
        up
    }

    fn swiglu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let f32s_only = [&gate, &up, &grad].iter().all(|t| t.dtype() == DType::F32);
        if !f32s_only || generic_ops() {
            return swiglu_backward_ops::<Self>(gate, up, grad);
        }
        let shape = dims(&grad);
        let (gate, up, grad) = (gate.to_contiguous(), up.to_contiguous(), grad.to_contiguous());
        let (g, u, dy) = (f32s(&gate), f32s(&up), f32s(&grad));
        let mut d_gate = vec![0.0f32; dy.len()];
        let mut d_up = vec![0.0f32; dy.len()];
        let block = |(i, (d_gate, d_up)): (usize, (&mut [f32], &mut [f32]))| {
            let at = i * BLOCK..i * BLOCK + d_gate.len();
            swiglu_backward_in_place(d_gate, d_up, &g[at.clone()], &u[at.clone()], &dy[at]);
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

impl<B: ReinBackend, C: CheckpointStrategy> SwigluKernels for Autodiff<B, C> {
    /// SwiGLU with its own backward ([`SwigluKernels::swiglu_backward`], one pass on Flex).
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Swiglu;

        impl<B: ReinBackend> Backward<B, 2> for Swiglu {
            /// `gate` and `up`.
            type State = (FloatTensor<B>, FloatTensor<B>);

            fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
                let (gate, up) = ops.state;
                let grad = grads.consume::<B>(&ops.node);
                let inputs = ops.parents.map(|node| node.map(|n| n.id));
                let (d_gate, d_up) = B::swiglu_backward(gate, up, grad);
                register_inputs::<B, 2>(inputs, grads, [d_gate, d_up]);
            }
        }

        match Swiglu
            .prepare::<C>([gate.node.clone(), up.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let state = (gate.primitive.clone(), up.primitive.clone());
                prep.finish(state, B::swiglu(gate.primitive, up.primitive))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::swiglu(gate.primitive, up.primitive)),
        }
    }
}

#[cfg(feature = "cuda")]
impl SwigluKernels for burn::backend::Cuda {}

#[cfg(test)]
mod tests {
    use burn::tensor::{Distribution, Tensor, TensorPrimitive};

    use super::*;
    use crate::backend::testing::{A, assert_close, assert_tensors_close, random, raw};

    #[test]
    fn swiglu_backward_equals_burns_autodiff_of_the_ops() {
        // The second shape is large enough to be split across threads (a ragged last block).
        for shape in [[7, 45], [300, 130]] {
            swiglu_case(shape);
        }
    }

    fn swiglu_case(shape: [usize; 2]) {
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
                A::swiglu(g, u)
            } else {
                super::swiglu_ops::<A>(g, u)
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
            assert_close(what, a, b, 1e-5);
        }
    }

    #[test]
    fn swiglu_matches_burn_ops() {
        let (gate, up) = (random([4, 9], 16).mul_scalar(8.0), random([4, 9], 17));
        assert_tensors_close(
            Flex::swiglu(raw(&gate), raw(&up)),
            swiglu_ops::<Flex>(raw(&gate), raw(&up)),
        );
        // The two halves of one fused gate-and-up product, read as views.
        let gate_up = random([5, 18], 18).mul_scalar(4.0);
        let (gate, up) = (gate_up.clone().narrow(1, 0, 9), gate_up.narrow(1, 9, 9));
        assert!(!raw(&up).is_contiguous());
        assert_tensors_close(
            Flex::swiglu(raw(&gate), raw(&up)),
            swiglu_ops::<Flex>(raw(&gate), raw(&up)),
        );
    }
}
