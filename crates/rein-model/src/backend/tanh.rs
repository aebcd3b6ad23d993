//! `tanh`, and its backward from its output. burn-flex computes `tanh` with libm's scalar `tanhf`
//! and burn's autodiff recomputes it in the backward pass; with 64-wide PPO networks that was over
//! half of each update. On Flex it is one vectorised pass of a rational function, and its autodiff
//! version keeps the output for a one-pass backward `g · (1 − y²)`.

use burn::backend::Flex;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind, unary};

use super::{ReinBackend, generic_ops};

/// `tanh` with a backward from its output.
pub trait TanhKernels: burn::tensor::backend::Backend {
    /// Element-wise `tanh`.
    fn tanh(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_tanh(x)
    }

    /// `grad · (1 − output²)`, the gradient of `tanh` from its output.
    fn tanh_backward(output: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        tanh_backward_ops::<Self>(output, grad)
    }
}

/// `grad · (1 − output²)` in burn ops: [`TanhKernels::tanh_backward`]'s default.
pub(super) fn tanh_backward_ops<B: burn::tensor::backend::Backend>(
    output: FloatTensor<B>,
    grad: FloatTensor<B>,
) -> FloatTensor<B> {
    let one_minus_sq = B::float_add_scalar(B::float_neg(B::float_powi_scalar(output, 2.into())), 1f32.into());
    B::float_mul(grad, one_minus_sq)
}

impl TanhKernels for Flex {
    fn tanh(x: FloatTensor<Self>) -> FloatTensor<Self> {
        if generic_ops() {
            return Self::float_tanh(x);
        }
        burn_flex::ops::unary::unary_op(x, tanh_f32, f64::tanh)
    }

    fn tanh_backward(output: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        if generic_ops() {
            return tanh_backward_ops::<Self>(output, grad);
        }
        burn_flex::ops::binary::binary_op(output, grad, |y, g| g * (1.0 - y * y), |y, g| g * (1.0 - y * y), None)
    }
}

/// `tanh` for `f32` as a rational function of `x` (Eigen's `generic_fast_tanh_float`): only
/// multiplications, additions and one division, so loops over it vectorise.
#[inline(always)]
pub(crate) fn tanh_f32(x: f32) -> f32 {
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

impl<B: ReinBackend, C: CheckpointStrategy> TanhKernels for Autodiff<B, C> {
    fn tanh(x: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Tanh;

        impl<B: ReinBackend> Backward<B, 1> for Tanh {
            /// The forward output.
            type State = FloatTensor<B>;

            fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
                let output = ops.state;
                unary::<B, _>(ops.parents, ops.node, grads, |grad| B::tanh_backward(output, grad));
            }
        }

        match Tanh.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let output = B::tanh(x.primitive);
                prep.finish(output.clone(), output)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::tanh(x.primitive)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rational_tanh_matches_libm() {
        let mut worst = 0.0f32;
        for i in -100_000..=100_000 {
            let x = i as f32 / 5_000.0; // [-20, 20]
            worst = worst.max((tanh_f32(x) - x.tanh()).abs());
        }
        assert!(worst < 5e-7, "max error {worst}");
        assert_eq!(tanh_f32(0.0), 0.0);
        assert!(tanh_f32(f32::INFINITY) <= 1.0 && tanh_f32(f32::NEG_INFINITY) >= -1.0);
    }
}
