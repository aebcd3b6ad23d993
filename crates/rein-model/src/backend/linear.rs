//! Linear layers and matrix products: `x · W + b` as one `gemm` call with the bias folded in (on
//! both cores from a smaller size than burn-flex's matmul uses them), products of weights kept as
//! quantised codes read in place, and whether a dense weight equals such codes (answered from
//! memory for weights already compared). The autodiff version of `fused_linear` has its own
//! backward on the same kernels.

use std::sync::{Arc, Mutex};

use burn::backend::Flex;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{DType, FloatDType, Tensor, TensorMetadata, TensorPrimitive};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_autodiff::{Autodiff, NodeId};
use burn_flex::FlexTensor;
use rein_core::{ModelDtype, SamplerPrecision};
use rein_kernels::{Init, PackedMatrix, matmul, matmul_packed, matmul_packed_q8};

use super::flex::{matrix, output_from_bias, tensor};
use super::{ReinBackend, float, generic_ops};

/// Linear layers, dense or on quantised weights, and matrix products.
pub trait LinearKernels: burn::tensor::backend::Backend {
    /// A linear layer, `x · W + b`.
    ///
    /// # Shapes
    /// - `x`: `[rows, in]`, `weight`: `[in, out]`, `bias`: `[out]` → `[rows, out]`
    fn fused_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        linear_ops::<Self>(x, weight, bias)
    }

    /// A matrix product `a · b` (views of transposes welcome).
    ///
    /// # Shapes
    /// - `a`: `[rows, inner]`, `b`: `[inner, cols]` → `[rows, cols]`
    fn matmul(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(a, b)
    }

    /// Whether [`LinearKernels::packed_linear`] reads packed weights directly (and so is worth using
    /// for inference); the default unpacks them first.
    fn reads_packed_weights() -> bool {
        false
    }

    /// A linear layer whose weight is kept packed, `x · [W₁ W₂ …] + b`: the parts' columns side
    /// by side. At [`SamplerPrecision::Exact`], the same numbers as
    /// [`LinearKernels::fused_linear`] on the unpacked weight; at [`SamplerPrecision::Q8`], `x`
    /// quantised as [`rein_kernels::matmul_packed_q8`] does where the backend reads packed
    /// weights (the default unpacks them and is exact at either precision).
    ///
    /// # Shapes
    /// - `x`: `[rows, in]`, each part `[in, outᵢ]`, `bias`: `[Σ outᵢ]` → `[rows, Σ outᵢ]`
    fn packed_linear(
        x: FloatTensor<Self>,
        parts: &[&PackedMatrix],
        bias: Option<FloatTensor<Self>>,
        _precision: SamplerPrecision,
    ) -> FloatTensor<Self> {
        packed_linear_ops::<Self>(x, parts, bias)
    }

    /// Whether `weight` (`[in, out]`) holds exactly the values of `packed`. Flex remembers the
    /// weights it found equal and answers again without comparing while they are unchanged.
    fn equals_packed(weight: FloatTensor<Self>, packed: &Arc<PackedMatrix>) -> bool {
        equals_packed_ops::<Self>(weight, packed)
    }
}

/// `layer` on `[rows, in]`, through [`LinearKernels::fused_linear`].
pub(crate) fn linear<B: ReinBackend>(layer: &burn::nn::Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    linear_in(layer, x, ModelDtype::F32)
}

/// A linear layer whose product is in `dtype`: its weight rounded to `dtype` for this product
/// ([`held_in`]; an `f32` weight still gets `f32` gradients, through the cast), then [`affine`],
/// which rounds the input and bias to the weight's dtype.
pub(crate) fn linear_in<B: ReinBackend>(
    layer: &burn::nn::Linear<B>,
    x: Tensor<B, 2>,
    dtype: ModelDtype,
) -> Tensor<B, 2> {
    let bias = layer.bias.as_ref().map(|b| b.val());
    affine(x, held_in(layer.weight.val(), dtype), bias)
}

/// `tensor` as a `dtype` model holds it for a product: itself for [`ModelDtype::F32`] (no op is
/// added), rounded to bf16 for [`ModelDtype::Bf16`].
pub fn held_in<B: burn::tensor::backend::Backend, const D: usize>(
    tensor: Tensor<B, D>,
    dtype: ModelDtype,
) -> Tensor<B, D> {
    match dtype {
        ModelDtype::F32 => tensor,
        ModelDtype::Bf16 => tensor.cast(FloatDType::BF16),
    }
}

/// `x · W + b` on `[rows, in]` with `W` `[in, out]` (a transposed view is fine), through
/// [`LinearKernels::fused_linear`], in the weight's dtype: a weight held in bf16 multiplies an
/// input (and bias) rounded to bf16, and the product comes back in the input's dtype. Gradients
/// flow through the casts, each in its tensor's dtype.
pub fn affine<B: ReinBackend>(x: Tensor<B, 2>, weight: Tensor<B, 2>, bias: Option<Tensor<B, 1>>) -> Tensor<B, 2> {
    let (dtype, input) = (weight.dtype(), x.dtype());
    if input != dtype {
        let to = FloatDType::from(dtype);
        let y = affine(x.cast(to), weight, bias.map(|b| b.cast(to)));
        return y.cast(FloatDType::from(input));
    }
    let y = B::fused_linear(
        x.into_primitive().tensor(),
        weight.into_primitive().tensor(),
        bias.map(|b| b.into_primitive().tensor()),
    );
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// [`LinearKernels::fused_linear`] in burn ops, the product through [`LinearKernels::matmul`].
pub(crate) fn linear_ops<B: LinearKernels>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
) -> FloatTensor<B> {
    let y = float::<B, 2>(B::matmul(x, weight));
    match bias {
        Some(bias) => (y + float::<B, 1>(bias).unsqueeze::<2>()).into_primitive().tensor(),
        None => y.into_primitive().tensor(),
    }
}

/// [`LinearKernels::packed_linear`] by unpacking the weight: [`LinearKernels::fused_linear`] on its dense copy.
pub(crate) fn packed_linear_ops<B: LinearKernels>(
    x: FloatTensor<B>,
    parts: &[&PackedMatrix],
    bias: Option<FloatTensor<B>>,
) -> FloatTensor<B> {
    let device = B::float_device(&x);
    let input = parts.first().map_or(0, |p| p.shape()[0]);
    let columns: usize = parts.iter().map(|p| p.shape()[1]).sum();
    let mut weight = vec![0.0f32; input * columns];
    let mut at = 0;
    for part in parts {
        let (values, width) = (part.to_dense(), part.shape()[1]);
        for (dst, src) in weight.chunks_exact_mut(columns).zip(values.chunks_exact(width)) {
            dst[at..at + width].copy_from_slice(src);
        }
        at += width;
    }
    let weight = Tensor::<B, 2>::from_data(burn::tensor::TensorData::new(weight, [input, columns]), &device);
    B::fused_linear(x, weight.into_primitive().tensor(), bias)
}

/// [`LinearKernels::equals_packed`] through the weight's data.
pub(crate) fn equals_packed_ops<B: burn::tensor::backend::Backend>(
    weight: FloatTensor<B>,
    packed: &PackedMatrix,
) -> bool {
    let weight = float::<B, 2>(weight);
    weight.dims() == packed.shape()
        && weight
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .is_ok_and(|values| packed.equals(&values))
}

impl LinearKernels for Flex {
    fn fused_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        let bias_f32 = bias.as_ref().is_none_or(|b| b.dtype() == DType::F32);
        let (Some(x_view), Some(w_view), true, false) = (matrix(&x), matrix(&weight), bias_f32, generic_ops()) else {
            return linear_ops::<Self>(x, weight, bias);
        };
        let ([rows, _], outputs) = (x_view.shape(), w_view.shape()[1]);
        let (mut out, init) = output_from_bias(bias.as_ref(), rows, outputs);
        matmul(&mut out, outputs, x_view, w_view, init);
        tensor(out, &[rows, outputs])
    }

    fn matmul(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        let (Some(a_view), Some(b_view), false) = (matrix(&a), matrix(&b), generic_ops()) else {
            return Self::float_matmul(a, b);
        };
        let ([rows, _], cols) = (a_view.shape(), b_view.shape()[1]);
        let mut out = vec![0.0f32; rows * cols];
        matmul(&mut out, cols, a_view, b_view, Init::Zero);
        tensor(out, &[rows, cols])
    }

    fn reads_packed_weights() -> bool {
        !generic_ops()
    }

    fn packed_linear(
        x: FloatTensor<Self>,
        parts: &[&PackedMatrix],
        bias: Option<FloatTensor<Self>>,
        precision: SamplerPrecision,
    ) -> FloatTensor<Self> {
        let bias_f32 = bias.as_ref().is_none_or(|b| b.dtype() == DType::F32);
        let (Some(x_view), true, false) = (matrix(&x), bias_f32, generic_ops()) else {
            return packed_linear_ops::<Self>(x, parts, bias);
        };
        let rows = x_view.shape()[0];
        let outputs: usize = parts.iter().map(|p| p.shape()[1]).sum();
        let (mut out, init) = output_from_bias(bias.as_ref(), rows, outputs);
        let mut at = 0;
        let product = match precision {
            SamplerPrecision::Exact => matmul_packed,
            SamplerPrecision::Q8 => matmul_packed_q8,
        };
        for part in parts {
            product(&mut out[at..], outputs, x_view, part, init);
            at += part.shape()[1];
        }
        tensor(out, &[rows, outputs])
    }

    fn equals_packed(weight: FloatTensor<Self>, packed: &Arc<PackedMatrix>) -> bool {
        let Some(view) = matrix(&weight).filter(|_| !generic_ops()) else {
            return equals_packed_ops::<Self>(weight, packed);
        };
        if VerifiedWeights::remembers(&weight, packed) {
            return true;
        }
        let equal = packed.equals_view(view);
        VerifiedWeights::record(weight, packed, equal);
        equal
    }
}

/// The weights [`LinearKernels::equals_packed`] found equal to a packed matrix, with it: a generation
/// asks about every weight of the model (~0.5 s for SmolLM2-135M), and a LoRA run's base
/// weights never change. Each entry keeps a clone of the weight, so its storage can be neither
/// freed and reused nor written in place (burn-flex copies shared storage before writing):
/// while a weight has the same storage and layout, it has the same values. Entries whose packed
/// matrix only this list still holds (its model is gone) are dropped.
pub(super) struct VerifiedWeights;

static VERIFIED: Mutex<Vec<(Arc<PackedMatrix>, FlexTensor)>> = Mutex::new(Vec::new());

impl VerifiedWeights {
    fn same_storage(a: &FlexTensor, b: &FlexTensor) -> bool {
        a.dtype() == b.dtype()
            && a.layout() == b.layout()
            && std::ptr::eq(a.storage::<f32>().as_ptr(), b.storage::<f32>().as_ptr())
    }

    fn remembers(weight: &FlexTensor, packed: &Arc<PackedMatrix>) -> bool {
        let verified = VERIFIED.lock().unwrap_or_else(|e| e.into_inner());
        verified
            .iter()
            .any(|(p, w)| Arc::ptr_eq(p, packed) && Self::same_storage(w, weight))
    }

    fn record(weight: FlexTensor, packed: &Arc<PackedMatrix>, equal: bool) {
        let mut verified = VERIFIED.lock().unwrap_or_else(|e| e.into_inner());
        verified.retain(|(p, _)| !Arc::ptr_eq(p, packed) && Arc::strong_count(p) > 1);
        if equal {
            verified.push((packed.clone(), weight));
        }
    }
}

impl<B: ReinBackend, C: CheckpointStrategy> LinearKernels for Autodiff<B, C> {
    /// `y = x·W + b` with its own backward on the inner backend's kernels:
    /// `∂x = ∂y·Wᵀ`, `∂W = xᵀ·∂y`, `∂b = Σ_rows ∂y`.
    fn fused_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Linear;

        /// Registers the gradients of `x` and `W` (parents 0 and 1).
        fn backward_x_w<B: ReinBackend>(
            [x_node, w_node]: [Option<NodeId>; 2],
            (x, weight): (FloatTensor<B>, FloatTensor<B>),
            grad: &FloatTensor<B>,
            grads: &mut Gradients,
        ) {
            if let Some(id) = x_node {
                grads.register::<B>(id, B::matmul(grad.clone(), B::float_transpose(weight)));
            }
            if let Some(id) = w_node {
                grads.register::<B>(id, B::matmul(B::float_transpose(x), grad.clone()));
            }
        }

        impl<B: ReinBackend> Backward<B, 2> for Linear {
            /// `x` and `W`.
            type State = (FloatTensor<B>, FloatTensor<B>);

            fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
                let grad = grads.consume::<B>(&ops.node);
                let [x, w] = ops.parents.map(|node| node.map(|n| n.id));
                backward_x_w::<B>([x, w], ops.state, &grad, grads);
            }
        }

        impl<B: ReinBackend> Backward<B, 3> for Linear {
            /// `x` and `W`.
            type State = (FloatTensor<B>, FloatTensor<B>);

            fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
                let grad = grads.consume::<B>(&ops.node);
                let [x, w, bias] = ops.parents.map(|node| node.map(|n| n.id));
                backward_x_w::<B>([x, w], ops.state, &grad, grads);
                if let Some(id) = bias {
                    let columns = grad.shape()[1];
                    let sum = B::float_sum_dim(grad, 0);
                    grads.register::<B>(id, B::float_reshape(sum, [columns].into()));
                }
            }
        }

        let forward =
            |x: &Self::FloatTensorPrimitive, w: &Self::FloatTensorPrimitive, b: Option<&Self::FloatTensorPrimitive>| {
                B::fused_linear(x.primitive.clone(), w.primitive.clone(), b.map(|b| b.primitive.clone()))
            };
        let state = (x.primitive.clone(), weight.primitive.clone());
        match bias {
            Some(bias) => match Linear
                .prepare::<C>([x.node.clone(), weight.node.clone(), bias.node.clone()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(state, forward(&x, &weight, Some(&bias))),
                OpsKind::UnTracked(prep) => prep.finish(forward(&x, &weight, Some(&bias))),
            },
            None => match Linear
                .prepare::<C>([x.node.clone(), weight.node.clone()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(state, forward(&x, &weight, None)),
                OpsKind::UnTracked(prep) => prep.finish(forward(&x, &weight, None)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::ops::FloatTensorOps;

    use super::*;
    use crate::backend::testing::{assert_tensors_close, random, raw};

    /// A weight found equal to a packed matrix is answered from memory while it is the same
    /// storage; a changed weight (a new tensor, or a write to a shared one, which burn-flex
    /// copies first) is compared again, and a different packed matrix is never taken for it.
    #[test]
    fn a_verified_weight_is_remembered_until_it_changes() {
        let (rows, cols, block) = (64usize, 40usize, 32usize);
        let codes: Vec<i8> = (0..rows * cols).map(|i| (i % 15) as i8 - 7).collect();
        let scales: Vec<f32> = (0..rows.div_ceil(block) * cols)
            .map(|i| 0.01 * (i % 7 + 1) as f32)
            .collect();
        let packed = Arc::new(PackedMatrix::new([rows, cols], block, &codes, scales.clone(), None).unwrap());
        let dense = || tensor(packed.to_dense(), &[rows, cols]);
        let weight = dense();
        assert!(Flex::equals_packed(weight.clone(), &packed));
        assert!(VerifiedWeights::remembers(&weight, &packed));
        assert!(Flex::equals_packed(weight.clone(), &packed), "answered again");
        // Equal values in other storage: compared, equal.
        assert!(Flex::equals_packed(dense(), &packed));
        // A write to the shared weight copies it: the result is another storage, compared.
        let changed = Flex::float_add_scalar(weight.clone(), 1.0.into());
        assert!(!VerifiedWeights::remembers(&changed, &packed));
        assert!(!Flex::equals_packed(changed, &packed));
        assert!(
            Flex::equals_packed(weight.clone(), &packed),
            "the original is unchanged"
        );
        // The same values under another packed matrix with other scales: not equal.
        let other = Arc::new(
            PackedMatrix::new(
                [rows, cols],
                block,
                &codes,
                scales.iter().map(|s| 2.0 * s).collect(),
                None,
            )
            .unwrap(),
        );
        assert!(!Flex::equals_packed(weight, &other));
    }

    /// A weight held in bf16 multiplies in bf16: `x`, `W` and `b` rounded to bf16, the product
    /// rounded to bf16, the bias added in bf16, the result back in f32; and an f32 weight held
    /// in bf16 gets f32 gradients, `∂W = xᵀ·∂y` of the rounded input.
    #[test]
    fn bf16_products_round_inputs_weights_and_outputs() {
        use burn::backend::Autodiff;
        use burn::tensor::TensorData;
        type A = Autodiff<Flex>;
        let round = |v: f32| half::bf16::from_f32(v).to_f32();
        let (x, w, b) = (random([5, 7], 21), random([7, 3], 22), random([3], 23));
        let values = |t: TensorData| t.to_vec::<f32>().unwrap();
        let (xs, ws, bs) = (values(x.to_data()), values(w.to_data()), values(b.to_data()));
        let want: Vec<f32> = (0..5 * 3)
            .map(|at| {
                let (i, j) = (at / 3, at % 3);
                let product: f32 = (0..7).map(|k| round(xs[i * 7 + k]) * round(ws[k * 3 + j])).sum();
                round(round(product) + round(bs[j]))
            })
            .collect();
        let device = Default::default();
        let weight = Tensor::<A, 2>::from_data(w.to_data(), &device).require_grad();
        let bias = Tensor::<A, 1>::from_data(b.to_data(), &device);
        let input = Tensor::<A, 2>::from_data(x.to_data(), &device);
        let y = affine(
            input,
            held_in(weight.clone(), ModelDtype::Bf16),
            Some(held_in(bias, ModelDtype::Bf16)),
        );
        assert_eq!(y.dtype(), DType::F32);
        let got: Vec<f32> = y.to_data().to_vec().unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= w.abs() / 128.0, "{g} vs {w}");
        }
        let exact: Vec<f32> = affine(x.clone(), w.clone(), Some(b)).to_data().to_vec().unwrap();
        assert!(
            got.iter().zip(&exact).any(|(g, e)| g != e),
            "the product was not rounded"
        );
        let grads = y.sum().backward();
        let grad = weight.grad(&grads).expect("the f32 weight has a gradient");
        assert_eq!(grad.dtype(), DType::F32);
        let grad: Vec<f32> = grad.to_data().to_vec().unwrap();
        for k in 0..7 {
            let column: f32 = (0..5).map(|i| round(xs[i * 7 + k])).sum();
            for g in &grad[k * 3..k * 3 + 3] {
                assert!((g - column).abs() <= column.abs() / 128.0 + 1e-6, "{g} vs {column}");
            }
        }
    }

    #[test]
    fn linear_matches_burn_ops_on_strided_inputs() {
        let x = random([7, 5], 11);
        let weight = random([3, 5], 12).transpose(); // [5, 3], column-major
        let bias = random([3], 13);
        for bias in [None, Some(raw(&bias))] {
            assert_tensors_close(
                Flex::fused_linear(raw(&x), raw(&weight), bias.clone()),
                linear_ops::<Flex>(raw(&x), raw(&weight), bias),
            );
        }
        let big = (random([64, 256], 14), random([256, 300], 15));
        assert_tensors_close(
            Flex::fused_linear(raw(&big.0), raw(&big.1), None),
            linear_ops::<Flex>(raw(&big.0), raw(&big.1), None),
        );
    }
}
