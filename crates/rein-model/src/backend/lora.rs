//! A LoRA layer `x·W + b + (s·x·A)·B` as one op whose update is accumulated into the base
//! product's output, forward and backward: the composed ops allocated, scaled and added a
//! `[rows, out]` update per adapted layer, about 4% of a SmolLM2 LoRA GRPO step here.

use burn::backend::Flex;
use burn::tensor::DType;
use burn::tensor::TensorMetadata;
use burn::tensor::ops::FloatTensor;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_autodiff::{Autodiff, NodeId};
use rein_kernels::{Init, MatRef, matmul};

use super::flex::{matrix, output_from_bias, tensor};
use super::{LinearKernels, ReinBackend, generic_ops, register_inputs};

/// A linear layer with a LoRA update, and its backward.
pub trait LoraKernels: LinearKernels {
    /// A linear layer with a LoRA update, `y = x·W + b + (s·x·A)·B`, and the adapter's scaled
    /// projection `s·x·A` (which its gradients need). On Flex the update is accumulated into
    /// the base product's output: no `[rows, out]` temporaries for the update, its scale or
    /// the sum.
    ///
    /// # Shapes
    /// - `x`: `[rows, in]`, `weight`: `[in, out]`, `bias`: `[out]`, `a`: `[in, r]`,
    ///   `b`: `[r, out]` → (`[rows, out]`, `[rows, r]`)
    fn lora_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        lora_linear_ops::<Self>(x, weight, bias, a, b, scale)
    }

    /// The gradients of [`LoraKernels::lora_linear`] with respect to `x`, `A` and `B`, given the
    /// output's and the forward's `down = s·x·A`: with `e = s·∂y·Bᵀ`,
    /// `∂x = ∂y·Wᵀ + e·Aᵀ`, `∂A = xᵀ·e`, `∂B = downᵀ·∂y`.
    ///
    /// # Shapes
    /// - as [`LoraKernels::lora_linear`]'s, `down`: `[rows, r]`, `grad`: `[rows, out]` →
    ///   (`[rows, in]`, `[in, r]`, `[r, out]`)
    #[allow(clippy::too_many_arguments)]
    fn lora_linear_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        down: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        lora_linear_backward_ops::<Self>(x, weight, a, b, down, grad, scale)
    }
}

/// [`LoraKernels::lora_linear`] in burn ops.
pub(super) fn lora_linear_ops<B: LinearKernels>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    a: FloatTensor<B>,
    b: FloatTensor<B>,
    scale: f32,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let down = B::float_mul_scalar(B::matmul(x.clone(), a), scale.into());
    let update = B::matmul(down.clone(), b);
    (B::float_add(B::fused_linear(x, weight, bias), update), down)
}

/// [`LoraKernels::lora_linear_backward`] in burn ops.
pub(super) fn lora_linear_backward_ops<B: LinearKernels>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    a: FloatTensor<B>,
    b: FloatTensor<B>,
    down: FloatTensor<B>,
    grad: FloatTensor<B>,
    scale: f32,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let e = B::float_mul_scalar(B::matmul(grad.clone(), B::float_transpose(b)), scale.into());
    let d_x = B::float_add(
        B::matmul(grad.clone(), B::float_transpose(weight)),
        B::matmul(e.clone(), B::float_transpose(a)),
    );
    let d_a = B::matmul(B::float_transpose(x), e);
    let d_b = B::matmul(B::float_transpose(down), grad);
    (d_x, d_a, d_b)
}

impl LoraKernels for Flex {
    fn lora_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let bias_f32 = bias.as_ref().is_none_or(|b| b.dtype() == DType::F32);
        let (Some(x_view), Some(w_view), Some(a_view), Some(b_view), true, false) = (
            matrix(&x),
            matrix(&weight),
            matrix(&a),
            matrix(&b),
            bias_f32,
            generic_ops(),
        ) else {
            return lora_linear_ops::<Self>(x, weight, bias, a, b, scale);
        };
        let ([rows, _], outputs, rank) = (x_view.shape(), w_view.shape()[1], a_view.shape()[1]);
        let (mut out, init) = output_from_bias(bias.as_ref(), rows, outputs);
        matmul(&mut out, outputs, x_view, w_view, init);
        let mut down = vec![0.0f32; rows * rank];
        matmul(&mut down, rank, x_view, a_view, Init::Zero);
        down.iter_mut().for_each(|d| *d *= scale);
        let down_view = MatRef::row_major(&down, rows, rank).expect("rows × rank values");
        matmul(&mut out, outputs, down_view, b_view, Init::Accumulate);
        (tensor(out, &[rows, outputs]), tensor(down, &[rows, rank]))
    }

    fn lora_linear_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        down: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (Some(x_view), Some(w_view), Some(a_view), Some(b_view), Some(down_view), Some(g_view), false) = (
            matrix(&x),
            matrix(&weight),
            matrix(&a),
            matrix(&b),
            matrix(&down),
            matrix(&grad),
            generic_ops(),
        ) else {
            return lora_linear_backward_ops::<Self>(x, weight, a, b, down, grad, scale);
        };
        let ([rows, inputs], [rank, outputs]) = (x_view.shape(), b_view.shape());
        // e = s·∂y·Bᵀ
        let mut e = vec![0.0f32; rows * rank];
        matmul(&mut e, rank, g_view, b_view.t(), Init::Zero);
        e.iter_mut().for_each(|v| *v *= scale);
        let e_view = MatRef::row_major(&e, rows, rank).expect("rows × rank values");
        // ∂x = ∂y·Wᵀ + e·Aᵀ, the update accumulated into the base product.
        let mut d_x = vec![0.0f32; rows * inputs];
        matmul(&mut d_x, inputs, g_view, w_view.t(), Init::Zero);
        matmul(&mut d_x, inputs, e_view, a_view.t(), Init::Accumulate);
        let mut d_a = vec![0.0f32; inputs * rank];
        matmul(&mut d_a, rank, x_view.t(), e_view, Init::Zero);
        let mut d_b = vec![0.0f32; rank * outputs];
        matmul(&mut d_b, outputs, down_view.t(), g_view, Init::Zero);
        (
            tensor(d_x, &[rows, inputs]),
            tensor(d_a, &[inputs, rank]),
            tensor(d_b, &[rank, outputs]),
        )
    }
}

impl<B: ReinBackend, C: CheckpointStrategy> LoraKernels for Autodiff<B, C> {
    /// [`LoraKernels::lora_linear`] with its own backward ([`LoraKernels::lora_linear_backward`]; `∂W`
    /// and `∂b` only when the base layer is trained too, which LoRA's is not).
    fn lora_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        #[derive(Debug)]
        struct LoraLinear;

        /// `x`, `W`, `A`, `B`, `down = s·x·A` and `s`.
        type State<B> = (
            FloatTensor<B>,
            FloatTensor<B>,
            FloatTensor<B>,
            FloatTensor<B>,
            FloatTensor<B>,
            f32,
        );

        /// Registers the gradients of `x`, `W`, `A` and `B` (parents 0, 1, 3 and 4).
        fn backward_inputs<B: ReinBackend>(
            [x_node, w_node, a_node, b_node]: [Option<NodeId>; 4],
            (x, weight, a, b, down, scale): State<B>,
            grad: &FloatTensor<B>,
            grads: &mut Gradients,
        ) {
            if let Some(id) = w_node {
                grads.register::<B>(id, B::matmul(B::float_transpose(x.clone()), grad.clone()));
            }
            let (d_x, d_a, d_b) = B::lora_linear_backward(x, weight, a, b, down, grad.clone(), scale);
            register_inputs::<B, 3>([x_node, a_node, b_node], grads, [d_x, d_a, d_b]);
        }

        impl<B: ReinBackend> Backward<B, 4> for LoraLinear {
            type State = State<B>;

            fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
                let grad = grads.consume::<B>(&ops.node);
                let nodes = ops.parents.map(|node| node.map(|n| n.id));
                backward_inputs::<B>(nodes, ops.state, &grad, grads);
            }
        }

        impl<B: ReinBackend> Backward<B, 5> for LoraLinear {
            type State = State<B>;

            fn backward(self, ops: Ops<Self::State, 5>, grads: &mut Gradients, _: &mut Checkpointer) {
                let grad = grads.consume::<B>(&ops.node);
                let [x, w, bias, a, b] = ops.parents.map(|node| node.map(|n| n.id));
                if let Some(id) = bias {
                    let columns = grad.shape()[1];
                    let sum = B::float_sum_dim(grad.clone(), 0);
                    grads.register::<B>(id, B::float_reshape(sum, [columns].into()));
                }
                backward_inputs::<B>([x, w, a, b], ops.state, &grad, grads);
            }
        }

        let (y, down) = B::lora_linear(
            x.primitive.clone(),
            weight.primitive.clone(),
            bias.as_ref().map(|b| b.primitive.clone()),
            a.primitive.clone(),
            b.primitive.clone(),
            scale,
        );
        let state = (
            x.primitive,
            weight.primitive,
            a.primitive,
            b.primitive,
            down.clone(),
            scale,
        );
        let y = match bias {
            Some(bias) => match LoraLinear
                .prepare::<C>([x.node, weight.node, bias.node, a.node, b.node])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(state, y),
                OpsKind::UnTracked(prep) => prep.finish(y),
            },
            None => match LoraLinear
                .prepare::<C>([x.node, weight.node, a.node, b.node])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(state, y),
                OpsKind::UnTracked(prep) => prep.finish(y),
            },
        };
        (y, <Self as burn::tensor::backend::AutodiffBackend>::from_inner(down))
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::{Distribution, Tensor, TensorPrimitive};

    use super::*;
    use crate::backend::testing::{A, assert_close};

    /// `[y, ∂x, ∂W, ∂b, ∂A, ∂B]` of `Σ weights ⊙ (x·W + b + (s·x·A)·B)`, through
    /// [`LoraKernels::lora_linear`] (`kernel`) or burn's autodiff of the ops. `W` and `b` get
    /// gradients only when `train_base` (they are frozen under LoRA); absent gradients are empty.
    fn lora_linear_case([rows, inputs, outputs, rank]: [usize; 4], bias: bool, train_base: bool, seed: u64) {
        let device = Default::default();
        let random = |shape: [usize; 2], salt: u64| {
            <A as burn::tensor::backend::Backend>::seed(&device, seed * 8 + salt);
            Tensor::<A, 2>::random(shape, Distribution::Normal(0.0, 1.0), &device)
        };
        let x = random([rows, inputs], 1).require_grad();
        let weight = random([inputs, outputs], 2).set_require_grad(train_base);
        let b_vec = random([1, outputs], 3).reshape([outputs]).set_require_grad(train_base);
        let (a, b) = (
            random([inputs, rank], 4).require_grad(),
            random([rank, outputs], 5).require_grad(),
        );
        let weights = random([rows, outputs], 6);
        let scale = 0.5 + (seed % 5) as f32;
        let run = |kernel: bool| {
            let _graph = crate::one_graph();
            let raw = |t: &Tensor<A, 2>| t.clone().into_primitive().tensor();
            let bias_raw = bias.then(|| b_vec.clone().into_primitive().tensor());
            let args = (raw(&x), raw(&weight), bias_raw, raw(&a), raw(&b));
            let y = if kernel {
                A::lora_linear(args.0, args.1, args.2, args.3, args.4, scale).0
            } else {
                super::lora_linear_ops::<A>(args.0, args.1, args.2, args.3, args.4, scale).0
            };
            let y = Tensor::<A, 2>::from_primitive(TensorPrimitive::Float(y));
            let grads = (y.clone() * weights.clone()).sum().backward();
            let values =
                |t: Option<Tensor<Flex, 2>>| t.map(|t| t.into_data().to_vec::<f32>().unwrap()).unwrap_or_default();
            [
                y.into_data().to_vec::<f32>().unwrap(),
                values(x.grad(&grads)),
                values(weight.grad(&grads)),
                b_vec
                    .grad(&grads)
                    .map(|g| g.into_data().to_vec::<f32>().unwrap())
                    .unwrap_or_default(),
                values(a.grad(&grads)),
                values(b.grad(&grads)),
            ]
        };
        let (kernel, ops) = (run(true), run(false));
        assert_eq!(kernel[1].len(), rows * inputs, "∂x is missing");
        assert_eq!(kernel[4].len(), inputs * rank, "∂A is missing");
        assert_eq!(kernel[2].is_empty(), !train_base, "∂W present only when W is trained");
        for (what, (k, o)) in ["values", "∂x", "∂W", "∂b", "∂A", "∂B"]
            .iter()
            .zip(kernel.iter().zip(&ops))
        {
            assert_eq!(k.len(), o.len(), "{what}: one side has no gradient");
            assert_close(what, k, o, 1e-4);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]

        /// The LoRA linear layer's values and gradients (and the frozen base's, when it is
        /// trained) equal burn's autodiff of its ops, with and without a bias.
        #[test]
        fn lora_linear_and_its_backward_equal_burns_autodiff_of_the_ops(
            rows in 1usize..40,
            inputs in 1usize..40,
            outputs in 1usize..40,
            rank in 1usize..9,
            bias: bool,
            train_base: bool,
            seed in 0u64..1000,
        ) {
            lora_linear_case([rows, inputs, outputs, rank], bias, train_base, seed);
        }
    }
}
