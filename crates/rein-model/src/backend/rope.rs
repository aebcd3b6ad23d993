//! Rotary position embedding in the "rotate half" layout: one pass on Flex reading the input
//! through its strides (a transposed view of a projection) and writing the output in the same
//! layout, and an autodiff version whose backward is the rotation by `−θ`.

use burn::backend::Flex;
use burn::tensor::ops::{FloatTensor, FloatTensorOps, IntTensor};
use burn::tensor::{DType, Int, Tensor};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind, unary};

use super::flex::{Rows, dims, f32s, for_blocks, indices, readable, tensor};
use super::{ReinBackend, float, generic_ops};

/// Rotary position embedding.
pub trait RopeKernels: burn::tensor::backend::Backend {
    /// Rotary embedding in the "rotate half" layout: `x · cos[p] + rotate_half(x) · sin[p]` with
    /// `rotate_half([a, b]) = [−b, a]` and `p` each token's position.
    ///
    /// # Shapes
    /// - `x`: `[batch, heads, seq, head_dim]`, `positions`: `[batch, seq]`,
    ///   `cos`, `sin`: `[max_len, head_dim]` → like `x`
    fn rope(
        x: FloatTensor<Self>,
        positions: IntTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        rope_ops::<Self>(x, positions, cos, sin)
    }
}

/// [`RopeKernels::rope`] in burn ops.
pub(super) fn rope_ops<B: burn::tensor::backend::Backend>(
    x: FloatTensor<B>,
    positions: IntTensor<B>,
    cos: FloatTensor<B>,
    sin: FloatTensor<B>,
) -> FloatTensor<B> {
    let x = float::<B, 4>(x);
    let [batch, _, seq, dim] = x.dims();
    let half = dim / 2;
    let flat = Tensor::<B, 2, Int>::from_primitive(positions).reshape([batch * seq]);
    let cos = float::<B, 2>(cos).select(0, flat.clone()).reshape([batch, 1, seq, dim]);
    let sin = float::<B, 2>(sin).select(0, flat).reshape([batch, 1, seq, dim]);
    let first = x.clone().narrow(3, 0, half);
    let second = x.clone().narrow(3, half, half);
    let rotated = Tensor::cat(vec![second.neg(), first], 3);
    (x * cos + rotated * sin).into_primitive().tensor()
}

impl RopeKernels for Flex {
    fn rope(
        x: FloatTensor<Self>,
        positions: IntTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let index = indices(&positions);
        let (Some(positions), DType::F32, DType::F32, DType::F32, false) =
            (index, x.dtype(), cos.dtype(), sin.dtype(), generic_ops())
        else {
            return rope_ops::<Self>(x, positions, cos, sin);
        };
        let shape = dims(&x);
        let [batch, heads, seq, dim] = [shape[0], shape[1], shape[2], shape[3]];
        let (cos, sin) = (cos.to_contiguous(), sin.to_contiguous());
        let (cos, sin) = (f32s(&cos), f32s(&sin));
        // `x` is usually a transposed view of a projection: read it through its strides.
        let x = readable(x);
        let rows = Rows::of(&x);
        // The output in the input's layout: a transposed view of `[batch, seq, heads, dim]`
        // (a projection, as the model passes it) gives one, so that the gradient flowing back
        // through the backward pass (this kernel again) reaches the projection without a copy.
        let seq_major = rows.strides[2] > rows.strides[1];
        let mut out = vec![0.0f32; batch * heads * seq * dim];
        // One task per sequence: its block of the output is contiguous in either layout.
        for_blocks(&mut out, heads * seq * dim, |b, out| {
            for h in 0..heads {
                for s in 0..seq {
                    let at = if seq_major {
                        (s * heads + h) * dim
                    } else {
                        (h * seq + s) * dim
                    };
                    let p = positions[b * seq + s];
                    let (cos, sin) = (&cos[p * dim..(p + 1) * dim], &sin[p * dim..(p + 1) * dim]);
                    rotate_half(&mut out[at..at + dim], rows.row(b, h, s), cos, sin);
                }
            }
        });
        if seq_major {
            Self::float_swap_dims(tensor(out, &[batch, seq, heads, dim]), 1, 2)
        } else {
            tensor(out, &shape)
        }
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

impl<B: ReinBackend, C: CheckpointStrategy> RopeKernels for Autodiff<B, C> {
    /// Rotary embedding with its own backward on the inner backend's kernel. RoPE rotates
    /// each pair `(xᵢ, xᵢ₊ₕ)` by the angle `θ` of its position; with the tables' two halves
    /// equal (how [`crate::lm::Rope`] builds them) the transpose of that rotation is the
    /// rotation by `−θ`: `∂x = rope(∂y, cos, −sin)`.
    fn rope(
        x: FloatTensor<Self>,
        positions: IntTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Rope;

        impl<B: ReinBackend> Backward<B, 1> for Rope {
            /// Positions, cos and sin tables.
            type State = (IntTensor<B>, FloatTensor<B>, FloatTensor<B>);

            fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
                let (positions, cos, sin) = ops.state;
                unary::<B, _>(ops.parents, ops.node, grads, |grad| {
                    B::rope(grad, positions, cos, B::float_neg(sin))
                });
            }
        }

        let (cos, sin) = (cos.primitive, sin.primitive);
        match Rope.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let state = (positions.clone(), cos.clone(), sin.clone());
                prep.finish(state, B::rope(x.primitive, positions, cos, sin))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::rope(x.primitive, positions, cos, sin)),
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Distribution, Int, Tensor, TensorData, TensorPrimitive};

    use super::*;
    use crate::backend::testing::{A, assert_close, assert_tensors_close, random, raw, rope_tables};

    #[test]
    fn rope_backward_equals_burns_autodiff_of_the_ops() {
        let device = Default::default();
        // The last shape is large enough to be split across threads.
        for (batch, seq, heads, dim) in [(2, 3, 4, 8), (1, 5, 2, 16), (4, 33, 8, 32)] {
            let x = Tensor::<A, 4>::random([batch, seq, heads, dim], Distribution::Normal(0.0, 1.0), &device)
                .require_grad();
            let weights = Tensor::<A, 4>::random([batch, heads, seq, dim], Distribution::Normal(0.0, 1.0), &device);
            let positions: Vec<i64> = (0..batch * seq).map(|i| (i * 3 % 11) as i64).collect();
            let positions = Tensor::<A, 2, Int>::from_data(TensorData::new(positions, [batch, seq]), &device);
            let (cos, sin) = rope_tables::<A>(11, dim);
            let raw = |t: Tensor<A, 2>| t.into_primitive().tensor();
            let run = |kernel: bool| {
                let _graph = crate::one_graph();
                // A transposed view, as the model passes it (a new graph each run).
                let view = x.clone().swap_dims(1, 2);
                let (input, p) = (view.into_primitive().tensor(), positions.clone().into_primitive());
                let y = if kernel {
                    A::rope(input, p, raw(cos.clone()), raw(sin.clone()))
                } else {
                    rope_ops::<A>(input, p, raw(cos.clone()), raw(sin.clone()))
                };
                let y = Tensor::<A, 4>::from_primitive(TensorPrimitive::Float(y));
                let grads = (y.clone() * weights.clone()).sum().backward();
                let grad = x.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap();
                (y.into_data().to_vec::<f32>().unwrap(), grad)
            };
            let ((y_kernel, g_kernel), (y_ops, g_ops)) = (run(true), run(false));
            assert_close("values", &y_kernel, &y_ops, 1e-5);
            assert_close("gradients", &g_kernel, &g_ops, 1e-5);
        }
    }

    #[test]
    fn rope_matches_burn_ops_on_a_transposed_view() {
        let device = Default::default();
        // [batch, seq, heads, dim] viewed as [batch, heads, seq, dim], as the model does.
        let x = random([2, 3, 4, 8], 3).swap_dims(1, 2);
        let (cos, sin) = (random([10, 8], 4), random([10, 8], 5));
        let positions = Tensor::<Flex, 2, Int>::from_data([[0, 1, 2], [4, 7, 9]], &device);
        assert_tensors_close(
            Flex::rope(raw(&x), positions.clone().into_primitive(), raw(&cos), raw(&sin)),
            rope_ops::<Flex>(raw(&x), positions.into_primitive(), raw(&cos), raw(&sin)),
        );
    }
}
