//! RMSNorm, as transformers computes it, and its backward: one pass over each row on Flex
//! instead of five burn ops, and an autodiff version with its own one-pass backward.

use burn::backend::Flex;
use burn::tensor::DType;
use burn::tensor::ops::FloatTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

use super::flex::{dims, dot, f32s, for_blocks, rows_per_block, tensor, with_avx2};
use super::{ReinBackend, float, generic_ops, register_inputs};

/// RMSNorm with its backward.
pub trait NormKernels: burn::tensor::backend::Backend {
    /// RMSNorm of each row, as transformers computes it: `w ⊙ x / sqrt(mean(x²) + ε)`.
    ///
    /// # Shapes
    /// - `x`: `[rows, hidden]`, `weight`: `[hidden]` → `[rows, hidden]`
    fn rms_norm(x: FloatTensor<Self>, weight: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        rms_norm_ops::<Self>(x, weight, eps)
    }

    /// The gradients of [`NormKernels::rms_norm`] given the output's, `(∂x, ∂w)`: with
    /// `r = 1/sqrt(mean(x²) + ε)` per row and `x̂ = x r`, `∂w = Σ_rows ∂y ⊙ x̂` and
    /// `∂x = r (g − x̂ mean(g ⊙ x̂))` where `g = ∂y ⊙ w`.
    ///
    /// # Shapes
    /// - `x`, `grad`: `[rows, hidden]`, `weight`: `[hidden]` → `[rows, hidden]` and `[hidden]`
    fn rms_norm_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        rms_norm_backward_ops::<Self>(x, weight, grad, eps)
    }
}

/// [`NormKernels::rms_norm`] in burn ops.
pub(super) fn rms_norm_ops<B: burn::tensor::backend::Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    eps: f64,
) -> FloatTensor<B> {
    let x = float::<B, 2>(x);
    let rms = x.clone().powi_scalar(2).mean_dim(1).add_scalar(eps).sqrt();
    ((x / rms) * float::<B, 1>(weight).unsqueeze::<2>())
        .into_primitive()
        .tensor()
}

/// [`NormKernels::rms_norm_backward`] in burn ops.
pub(super) fn rms_norm_backward_ops<B: burn::tensor::backend::Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    grad: FloatTensor<B>,
    eps: f64,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (x, weight, grad) = (float::<B, 2>(x), float::<B, 1>(weight), float::<B, 2>(grad));
    let r = x.clone().powi_scalar(2).mean_dim(1).add_scalar(eps).sqrt().recip();
    let normed = x * r.clone();
    let d_weight = (grad.clone() * normed.clone()).sum_dim(0).squeeze_dim::<1>(0);
    let g = grad * weight.unsqueeze::<2>();
    let projection = (g.clone() * normed.clone()).mean_dim(1);
    let d_x = (g - normed * projection) * r;
    (d_x.into_primitive().tensor(), d_weight.into_primitive().tensor())
}

impl NormKernels for Flex {
    fn rms_norm(x: FloatTensor<Self>, weight: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        if x.dtype() != DType::F32 || weight.dtype() != DType::F32 || generic_ops() {
            return rms_norm_ops::<Self>(x, weight, eps);
        }
        let shape = dims(&x);
        let (x, weight) = (x.to_contiguous(), weight.to_contiguous());
        let (x, weight) = (f32s(&x), f32s(&weight));
        let mut out = vec![0.0f32; x.len()];
        let block = rows_per_block(weight.len()) * weight.len();
        for_blocks(&mut out, block, |i, out| {
            rms_norm_rows(out, &x[i * block..][..out.len()], weight, eps as f32)
        });
        tensor(out, &shape)
    }

    fn rms_norm_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let f32s_only = [&x, &weight, &grad].iter().all(|t| t.dtype() == DType::F32);
        if !f32s_only || generic_ops() {
            return rms_norm_backward_ops::<Self>(x, weight, grad, eps);
        }
        let shape = dims(&x);
        let (x, weight, grad) = (x.to_contiguous(), weight.to_contiguous(), grad.to_contiguous());
        let (xs, w, dy) = (f32s(&x), f32s(&weight), f32s(&grad));
        let mut d_x = vec![0.0f32; xs.len()];
        let block = rows_per_block(w.len()) * w.len();
        for_blocks(&mut d_x, block, |i, d_x| {
            let at = i * block..i * block + d_x.len();
            rms_norm_backward_x(d_x, &xs[at.clone()], w, &dy[at], eps as f32)
        });
        // `∂w` sums over rows: one pass in row order, so its bits never depend on the split.
        let mut d_weight = vec![0.0f32; w.len()];
        rms_norm_backward_weight(&mut d_weight, xs, dy, eps as f32);
        (tensor(d_x, &shape), tensor(d_weight, &[w.len()]))
    }
}

with_avx2!(fn rms_norm_rows(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) => rms_norm_kernel);

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

impl<B: ReinBackend, C: CheckpointStrategy> NormKernels for Autodiff<B, C> {
    /// RMSNorm with its own backward ([`NormKernels::rms_norm_backward`], one pass on Flex).
    fn rms_norm(x: FloatTensor<Self>, weight: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct RmsNorm;

        impl<B: ReinBackend> Backward<B, 2> for RmsNorm {
            /// `x`, `w` and ε.
            type State = (FloatTensor<B>, FloatTensor<B>, f64);

            fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
                let (x, weight, eps) = ops.state;
                let grad = grads.consume::<B>(&ops.node);
                let inputs = ops.parents.map(|node| node.map(|n| n.id));
                let (d_x, d_weight) = B::rms_norm_backward(x, weight, grad, eps);
                register_inputs::<B, 2>(inputs, grads, [d_x, d_weight]);
            }
        }

        match RmsNorm
            .prepare::<C>([x.node.clone(), weight.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let state = (x.primitive.clone(), weight.primitive.clone(), eps);
                prep.finish(state, B::rms_norm(x.primitive, weight.primitive, eps))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::rms_norm(x.primitive, weight.primitive, eps)),
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Distribution, Tensor, TensorPrimitive};

    use super::*;
    use crate::backend::testing::{A, assert_close, assert_tensors_close, random, raw};

    #[test]
    fn rms_norm_backward_equals_burns_autodiff_of_the_ops() {
        // The second shape is large enough to be split across threads (a ragged last block).
        for [rows, hidden] in [[9, 40], [300, 130]] {
            rms_norm_case(rows, hidden);
        }
    }

    fn rms_norm_case(rows: usize, hidden: usize) {
        let device = Default::default();
        let random = |shape: [usize; 2], seed| {
            <A as burn::tensor::backend::Backend>::seed(&device, seed);
            Tensor::<A, 2>::random(shape, Distribution::Normal(0.5, 2.0), &device)
        };
        let (x, weights) = (random([rows, hidden], 1).require_grad(), random([rows, hidden], 3));
        let w = random([1, hidden], 2).reshape([hidden]).require_grad();
        let run = |kernel: bool| {
            let _graph = crate::one_graph();
            let (xp, wp) = (x.clone().into_primitive().tensor(), w.clone().into_primitive().tensor());
            let y = if kernel {
                A::rms_norm(xp, wp, 1e-6)
            } else {
                super::rms_norm_ops::<A>(xp, wp, 1e-6)
            };
            let y = Tensor::<A, 2>::from_primitive(TensorPrimitive::Float(y));
            let grads = (y.clone() * weights.clone()).sum().backward();
            [
                y.into_data().to_vec::<f32>().unwrap(),
                x.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap(),
                w.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap(),
            ]
        };
        let (kernel, ops) = (run(true), run(false));
        for (what, (a, b)) in ["values", "∂x", "∂w"].iter().zip(kernel.iter().zip(&ops)) {
            assert_close(what, a, b, 1e-4);
        }
    }

    #[test]
    fn rms_norm_matches_burn_ops() {
        let (x, w) = (random([5, 24], 1), random([24], 2));
        assert_tensors_close(
            Flex::rms_norm(raw(&x), raw(&w), 1e-6),
            rms_norm_ops::<Flex>(raw(&x), raw(&w), 1e-6),
        );
    }
}
