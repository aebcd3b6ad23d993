//! The backends rein's modules run on: any burn backend, plus rein's fused kernels where a
//! backend has a faster path than its generic ops.
//!
//! Each kernel is a method of [`Backend`] whose default composes burn's own ops, so any backend
//! qualifies with an empty `impl` (the CUDA one does) and autodiff keeps working (the autodiff
//! backend uses the defaults, except for `tanh`). Flex overrides them in [`flex`]:
//!
//! - `tanh`: burn-flex computes it with libm's scalar `tanhf` and burn's autodiff recomputes it
//!   in the backward pass; with 64-wide PPO networks that was over half of each update. Here it
//!   is one vectorised pass, and its autodiff version keeps the output for a one-pass backward
//!   `g · (1 − y²)`.
//! - `rms_norm`, `rope`, `swiglu`, `cached_attention`, `write_cache`: one pass each instead of
//!   two to ten burn ops; attention (decoding and prefill alike) reads the key/value cache in
//!   place instead of copying its filled prefix and repeating it per query head, and writes its
//!   output in the layout the next projection reads; the cache is written in place.
//! - `fused_linear`: one `gemm` call with the bias folded in, on both cores from a smaller size than
//!   burn-flex's matmul uses them.
//!
//! These are what decoding a token spends its time on.

mod flex;

use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::TensorMetadata;
use burn::tensor::ops::{AttentionModuleOptions, BoolTensor, FloatTensor, IntTensor};
use burn::tensor::{Bool, Int, Tensor, TensorPrimitive};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn_autodiff::{Autodiff, NodeId};

/// A burn backend with rein's fused kernels. The defaults use burn's own ops, so any backend
/// qualifies with an empty `impl`.
pub trait Backend: burn::tensor::backend::Backend {
    /// Element-wise `tanh`.
    fn tanh(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_tanh(x)
    }

    /// `grad · (1 − output²)`, the gradient of `tanh` from its output.
    fn tanh_backward(output: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        tanh_backward_ops::<Self>(output, grad)
    }

    /// Into how many shards, each decoded by its own thread with its own key/value cache, to
    /// split a decoding batch of `rows` sequences. One (the default) on backends that
    /// parallelise each op themselves.
    fn decode_shards(rows: usize) -> usize {
        let _ = rows;
        1
    }

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

    /// The SwiGLU gate, `silu(gate) ⊙ up`, element-wise.
    ///
    /// # Shapes
    /// - `gate`, `up`: `[rows, width]` → `[rows, width]`
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        swiglu_ops::<Self>(gate, up)
    }

    /// RMSNorm of each row, as transformers computes it: `w ⊙ x / sqrt(mean(x²) + ε)`.
    ///
    /// # Shapes
    /// - `x`: `[rows, hidden]`, `weight`: `[hidden]` → `[rows, hidden]`
    fn rms_norm(x: FloatTensor<Self>, weight: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        rms_norm_ops::<Self>(x, weight, eps)
    }

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

    /// Writes `values` into `buffer` at positions `start..` of axis 2 and returns the buffer.
    /// In place when the buffer is not shared (burn-flex's `slice_assign` copies the whole
    /// buffer first, which made every decoding step copy the key/value cache).
    ///
    /// # Shapes
    /// - `buffer`: `[batch, heads, capacity, head_dim]`, `values`: `[batch, heads, seq, head_dim]`
    fn write_cache(buffer: FloatTensor<Self>, values: FloatTensor<Self>, start: usize) -> FloatTensor<Self> {
        write_cache_ops::<Self>(buffer, values, start)
    }

    /// Causal scaled dot-product attention of `seq` new tokens per sequence over a key/value
    /// cache whose first `offset + seq` positions are filled (the new tokens' own keys and
    /// values last), the query heads of each key/value head sharing it.
    ///
    /// # Shapes
    /// - `q`: `[batch, heads, seq, head_dim]`, `heads` a multiple of `kv_heads`
    /// - `k`, `v`: `[batch, kv_heads, capacity, head_dim]`, positions `offset + seq..` unused
    /// - `padding`: `[batch, offset + seq]`, `true` where a key is padding (a padding token still
    ///   attends to itself, so no row is empty)
    /// - → `[batch, seq, heads, head_dim]`
    fn cached_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        offset: usize,
        padding: Option<BoolTensor<Self>>,
    ) -> FloatTensor<Self> {
        cached_attention_ops::<Self>(q, k, v, offset, padding)
    }
}

/// Set: every kernel of [`Backend`] on Flex takes its default, burn's generic ops.
static GENERIC_OPS: AtomicBool = AtomicBool::new(false);

/// Makes Flex compute every kernel of [`Backend`] with burn's generic ops, as the backends
/// without rein's kernels do (CUDA), instead of rein's fused CPU kernels; process-wide. This
/// is how the CPU tests check the path a GPU run takes: same model, same results within
/// rounding. Not for speed: the generic ops are several times slower.
pub fn use_generic_ops(on: bool) {
    GENERIC_OPS.store(on, Ordering::Relaxed);
}

fn generic_ops() -> bool {
    GENERIC_OPS.load(Ordering::Relaxed)
}

/// `grad · (1 − output²)` in burn ops: [`Backend::tanh_backward`]'s default.
fn tanh_backward_ops<B: burn::tensor::backend::Backend>(
    output: FloatTensor<B>,
    grad: FloatTensor<B>,
) -> FloatTensor<B> {
    let one_minus_sq = B::float_add_scalar(B::float_neg(B::float_powi_scalar(output, 2.into())), 1f32.into());
    B::float_mul(grad, one_minus_sq)
}

/// `layer` on `[rows, in]`, through [`Backend::fused_linear`].
pub(crate) fn linear<B: Backend>(layer: &burn::nn::Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    let y = B::fused_linear(
        x.into_primitive().tensor(),
        layer.weight.val().into_primitive().tensor(),
        layer.bias.as_ref().map(|b| b.val().into_primitive().tensor()),
    );
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

fn float<B: burn::tensor::backend::Backend, const D: usize>(x: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

/// [`Backend::fused_linear`] in burn ops.
pub(crate) fn linear_ops<B: burn::tensor::backend::Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
) -> FloatTensor<B> {
    burn::tensor::module::linear(float::<B, 2>(x), float::<B, 2>(weight), bias.map(float::<B, 1>))
        .into_primitive()
        .tensor()
}

/// [`Backend::swiglu`] in burn ops.
pub(crate) fn swiglu_ops<B: burn::tensor::backend::Backend>(
    gate: FloatTensor<B>,
    up: FloatTensor<B>,
) -> FloatTensor<B> {
    (burn::tensor::activation::silu(float::<B, 2>(gate)) * float::<B, 2>(up))
        .into_primitive()
        .tensor()
}

/// [`Backend::rms_norm`] in burn ops.
pub(crate) fn rms_norm_ops<B: burn::tensor::backend::Backend>(
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

/// [`Backend::rope`] in burn ops.
pub(crate) fn rope_ops<B: burn::tensor::backend::Backend>(
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

/// [`Backend::write_cache`] in burn ops.
pub(crate) fn write_cache_ops<B: burn::tensor::backend::Backend>(
    buffer: FloatTensor<B>,
    values: FloatTensor<B>,
    start: usize,
) -> FloatTensor<B> {
    let values = float::<B, 4>(values);
    let [batch, heads, seq, dim] = values.dims();
    float::<B, 4>(buffer)
        .slice_assign([0..batch, 0..heads, start..start + seq, 0..dim], values)
        .into_primitive()
        .tensor()
}

/// [`Backend::cached_attention`] in burn ops (and so with gradients, on an autodiff backend).
pub(crate) fn cached_attention_ops<B: burn::tensor::backend::Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    offset: usize,
    padding: Option<BoolTensor<B>>,
) -> FloatTensor<B> {
    let q = float::<B, 4>(q);
    let [batch, heads, seq, dim] = q.dims();
    let kv_heads = float::<B, 4>(k.clone()).dims()[1];
    let keys = offset + seq;
    let rep = heads / kv_heads;
    // Each key/value head repeated for the query heads that share it.
    let repeat = |t: FloatTensor<B>| {
        let t = float::<B, 4>(t).narrow(2, 0, keys);
        if rep == 1 {
            t
        } else {
            t.unsqueeze_dim::<5>(2)
                .expand([batch, kv_heads, rep, keys, dim])
                .reshape([batch, heads, keys, dim])
        }
    };
    let padding = padding.map(Tensor::<B, 2, Bool>::from_primitive);
    let mask = attention_mask::<B>(batch, seq, keys, offset, padding, &q.device());
    burn::tensor::module::attention(
        q,
        repeat(k),
        repeat(v),
        Some(mask.expand([batch, heads, seq, keys])),
        None,
        AttentionModuleOptions::default(),
    )
    .swap_dims(1, 2)
    .into_primitive()
    .tensor()
}

/// `true` where a query may not attend: future keys, and padding keys other than itself (a
/// padding query keeps itself so no row is fully masked).
///
/// # Shapes
/// → `[batch, 1, seq, keys]`; queries are the last `seq` of `keys` positions.
fn attention_mask<B: burn::tensor::backend::Backend>(
    batch: usize,
    seq: usize,
    keys: usize,
    offset: usize,
    key_padding: Option<Tensor<B, 2, Bool>>,
    device: &B::Device,
) -> Tensor<B, 4, Bool> {
    let query_pos = Tensor::<B, 1, Int>::arange(offset as i64..(offset + seq) as i64, device).reshape([1, 1, seq, 1]);
    let key_pos = Tensor::<B, 1, Int>::arange(0..keys as i64, device).reshape([1, 1, 1, keys]);
    let future = key_pos.clone().greater(query_pos.clone());
    let Some(padding) = key_padding else {
        return future.expand([batch, 1, seq, keys]);
    };
    let other = key_pos.not_equal(query_pos);
    let padded = padding.reshape([batch, 1, 1, keys]);
    future
        .expand([batch, 1, seq, keys])
        .bool_or(padded.bool_and(other.expand([batch, 1, seq, keys])))
}

/// A [`Backend`] that records gradients, whose inner backend is a [`Backend`] too.
pub trait AutodiffBackend: Backend + burn::tensor::backend::AutodiffBackend<InnerBackend: Backend> {}

impl<B: burn::tensor::backend::AutodiffBackend<InnerBackend: Backend> + Backend> AutodiffBackend for B {}

#[cfg(feature = "cuda")]
impl Backend for burn::backend::Cuda {}

impl<B: Backend, C: CheckpointStrategy> Backend for Autodiff<B, C> {
    fn tanh(x: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Tanh;

        impl<B: Backend> Backward<B, 1> for Tanh {
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
        fn backward_x_w<B: Backend>(
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

        impl<B: Backend> Backward<B, 2> for Linear {
            /// `x` and `W`.
            type State = (FloatTensor<B>, FloatTensor<B>);

            fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
                let grad = grads.consume::<B>(&ops.node);
                let [x, w] = ops.parents.map(|node| node.map(|n| n.id));
                backward_x_w::<B>([x, w], ops.state, &grad, grads);
            }
        }

        impl<B: Backend> Backward<B, 3> for Linear {
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
