//! The generic versions of [`ReinBackend`]'s kernels: burn's own ops, which every backend runs
//! (they are the trait's defaults, CUDA's path, and what the fused kernels are tested against).

#![allow(clippy::wildcard_imports)]

use super::*;

/// `grad · (1 − output²)` in burn ops: [`ReinBackend::tanh_backward`]'s default.
pub(super) fn tanh_backward_ops<B: burn::tensor::backend::Backend>(
    output: FloatTensor<B>,
    grad: FloatTensor<B>,
) -> FloatTensor<B> {
    let one_minus_sq = B::float_add_scalar(B::float_neg(B::float_powi_scalar(output, 2.into())), 1f32.into());
    B::float_mul(grad, one_minus_sq)
}

/// `layer` on `[rows, in]`, through [`ReinBackend::fused_linear`].
pub(crate) fn linear<B: ReinBackend>(layer: &burn::nn::Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    affine(x, layer.weight.val(), layer.bias.as_ref().map(|b| b.val()))
}

/// `x · W + b` on `[rows, in]` with `W` `[in, out]` (a transposed view is fine), through
/// [`ReinBackend::fused_linear`].
pub(crate) fn affine<B: ReinBackend>(
    x: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, 2> {
    let y = B::fused_linear(
        x.into_primitive().tensor(),
        weight.into_primitive().tensor(),
        bias.map(|b| b.into_primitive().tensor()),
    );
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// [`ReinBackend::packed_linear`] by unpacking the weight: [`ReinBackend::fused_linear`] on its dense copy.
pub(crate) fn packed_linear_ops<B: ReinBackend>(
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

/// [`ReinBackend::equals_packed`] through the weight's data.
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

pub(super) fn float<B: burn::tensor::backend::Backend, const D: usize>(x: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

/// [`ReinBackend::fused_linear`] in burn ops.
pub(crate) fn linear_ops<B: burn::tensor::backend::Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
) -> FloatTensor<B> {
    burn::tensor::module::linear(float::<B, 2>(x), float::<B, 2>(weight), bias.map(float::<B, 1>))
        .into_primitive()
        .tensor()
}

/// [`ReinBackend::lora_linear`] in burn ops.
pub(crate) fn lora_linear_ops<B: ReinBackend>(
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

/// [`ReinBackend::lora_linear_backward`] in burn ops.
pub(crate) fn lora_linear_backward_ops<B: ReinBackend>(
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

/// [`ReinBackend::swiglu`] in burn ops.
pub(crate) fn swiglu_ops<B: burn::tensor::backend::Backend>(
    gate: FloatTensor<B>,
    up: FloatTensor<B>,
) -> FloatTensor<B> {
    (burn::tensor::activation::silu(float::<B, 2>(gate)) * float::<B, 2>(up))
        .into_primitive()
        .tensor()
}

/// Registers the gradients of a two-input op's inputs, those that track gradients.
pub(super) fn register_inputs<B: ReinBackend, const N: usize>(
    inputs: [Option<NodeId>; N],
    grads: &mut Gradients,
    values: [FloatTensor<B>; N],
) {
    for (id, grad) in inputs.into_iter().zip(values) {
        if let Some(id) = id {
            grads.register::<B>(id, grad);
        }
    }
}

/// [`ReinBackend::swiglu_backward`] in burn ops.
pub(crate) fn swiglu_backward_ops<B: burn::tensor::backend::Backend>(
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

/// [`ReinBackend::rms_norm`] in burn ops.
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

/// [`ReinBackend::rms_norm_backward`] in burn ops.
pub(crate) fn rms_norm_backward_ops<B: burn::tensor::backend::Backend>(
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

/// [`ReinBackend::rope`] in burn ops.
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

/// [`ReinBackend::write_cache`] in burn ops.
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

/// [`ReinBackend::cached_attention`] in burn ops (and so with gradients, on an autodiff backend).
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

/// [`ReinBackend::causal_attention_backward`] in burn ops.
pub(crate) fn causal_attention_backward_ops<B: burn::tensor::backend::Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    padding: Option<BoolTensor<B>>,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let (q, k, v) = (float::<B, 4>(q), float::<B, 4>(k), float::<B, 4>(v));
    let [batch, heads, seq, dim] = q.dims();
    let kv_heads = k.dims()[1];
    let rep = heads / kv_heads;
    let scale = 1.0 / (dim as f64).sqrt();
    let repeat = |t: Tensor<B, 4>| {
        t.unsqueeze_dim::<5>(2)
            .expand([batch, kv_heads, rep, seq, dim])
            .reshape([batch, heads, seq, dim])
    };
    // The key/value heads' gradients: the sum over the query heads sharing each.
    let fold = |t: Tensor<B, 4>| {
        t.reshape([batch, kv_heads, rep, seq, dim])
            .sum_dim(2)
            .reshape([batch, kv_heads, seq, dim])
    };
    let (k, v) = (repeat(k), repeat(v));
    let padding = padding.map(Tensor::<B, 2, Bool>::from_primitive);
    let mask = attention_mask::<B>(batch, seq, seq, 0, padding, &q.device()).expand([batch, heads, seq, seq]);
    let scores = q.clone().matmul(k.clone().swap_dims(2, 3)).mul_scalar(scale);
    let p = burn::tensor::activation::softmax(scores.mask_fill(mask, f32::NEG_INFINITY), 3);
    let d_out = float::<B, 4>(grad).swap_dims(1, 2);
    let d_v = p.clone().swap_dims(2, 3).matmul(d_out.clone());
    let d_p = d_out.matmul(v.swap_dims(2, 3));
    let d_s = p.clone() * (d_p.clone() - (p * d_p).sum_dim(3));
    let d_q = d_s.clone().matmul(k).mul_scalar(scale);
    let d_k = d_s.swap_dims(2, 3).matmul(q).mul_scalar(scale);
    let raw = |t: Tensor<B, 4>| t.into_primitive().tensor();
    (raw(d_q), raw(fold(d_k)), raw(fold(d_v)))
}

/// Where each packed sequence starts, and its length.
pub(crate) fn sequence_spans(lengths: &[usize]) -> impl Iterator<Item = (usize, usize)> + '_ {
    lengths.iter().scan(0, |start, &len| {
        *start += len;
        Some((*start - len, len))
    })
}

/// [`ReinBackend::varlen_causal_attention`] as one [`ReinBackend::causal_attention`] per sequence.
pub(crate) fn varlen_causal_attention_ops<B: ReinBackend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    lengths: &[usize],
) -> FloatTensor<B> {
    let (q, k, v) = (float::<B, 4>(q), float::<B, 4>(k), float::<B, 4>(v));
    let raw = |t: Tensor<B, 4>| t.into_primitive().tensor();
    let outputs = sequence_spans(lengths)
        .map(|(start, len)| {
            let part = |t: &Tensor<B, 4>| raw(t.clone().narrow(2, start, len));
            float::<B, 4>(B::causal_attention(part(&q), part(&k), part(&v), None))
        })
        .collect();
    raw(Tensor::cat(outputs, 1))
}

/// [`ReinBackend::varlen_causal_attention_backward`] as one [`ReinBackend::causal_attention_backward`]
/// per sequence.
pub(crate) fn varlen_causal_attention_backward_ops<B: ReinBackend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    lengths: &[usize],
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let (q, k, v, grad) = (
        float::<B, 4>(q),
        float::<B, 4>(k),
        float::<B, 4>(v),
        float::<B, 4>(grad),
    );
    let raw = |t: Tensor<B, 4>| t.into_primitive().tensor();
    let (mut d_q, mut d_k, mut d_v) = (Vec::new(), Vec::new(), Vec::new());
    for (start, len) in sequence_spans(lengths) {
        let part = |t: &Tensor<B, 4>| raw(t.clone().narrow(2, start, len));
        let grad = raw(grad.clone().narrow(1, start, len));
        let (q, k, v) = B::causal_attention_backward(part(&q), part(&k), part(&v), None, grad);
        d_q.push(float::<B, 4>(q));
        d_k.push(float::<B, 4>(k));
        d_v.push(float::<B, 4>(v));
    }
    (
        raw(Tensor::cat(d_q, 2)),
        raw(Tensor::cat(d_k, 2)),
        raw(Tensor::cat(d_v, 2)),
    )
}

/// [`ReinBackend::log_prob_entropy`] in burn ops.
pub(crate) fn log_prob_entropy_ops<B: burn::tensor::backend::Backend>(
    logits: FloatTensor<B>,
    targets: IntTensor<B>,
    scale: f32,
) -> FloatTensor<B> {
    let logits = float::<B, 2>(logits);
    let rows = logits.dims()[0];
    let targets = Tensor::<B, 1, Int>::from_primitive(targets).reshape([rows, 1]);
    let log_p = burn::tensor::activation::log_softmax(logits.mul_scalar(scale), 1);
    let chosen = log_p.clone().gather(1, targets);
    let entropy = (log_p.clone().exp() * log_p).sum_dim(1).neg();
    Tensor::cat(vec![chosen, entropy], 1).into_primitive().tensor()
}

/// [`ReinBackend::log_prob_entropy_backward`] in burn ops.
pub(crate) fn log_prob_entropy_backward_ops<B: burn::tensor::backend::Backend>(
    logits: FloatTensor<B>,
    targets: IntTensor<B>,
    scale: f32,
    grad: FloatTensor<B>,
) -> FloatTensor<B> {
    let logits = float::<B, 2>(logits);
    let [rows, vocab] = logits.dims();
    let device = logits.device();
    let targets = Tensor::<B, 1, Int>::from_primitive(targets)
        .reshape([rows, 1])
        .expand([rows, vocab]);
    let tokens = Tensor::<B, 1, Int>::arange(0..vocab as i64, &device)
        .reshape([1, vocab])
        .expand([rows, vocab]);
    let chosen = tokens.equal(targets).float();
    let log_p = burn::tensor::activation::log_softmax(logits.mul_scalar(scale), 1);
    let p = log_p.clone().exp();
    let entropy = (p.clone() * log_p.clone()).sum_dim(1).neg();
    let grad = float::<B, 2>(grad).mul_scalar(scale);
    let (g_lp, g_h) = (grad.clone().narrow(1, 0, 1), grad.narrow(1, 1, 1));
    ((chosen - p.clone()) * g_lp - p * (log_p + entropy) * g_h)
        .into_primitive()
        .tensor()
}

/// `true` where a query may not attend: future keys, and padding keys other than itself (a
/// padding query keeps itself so no row is fully masked).
///
/// # Shapes
/// → `[batch, 1, seq, keys]`; queries are the last `seq` of `keys` positions.
pub(super) fn attention_mask<B: burn::tensor::backend::Backend>(
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
