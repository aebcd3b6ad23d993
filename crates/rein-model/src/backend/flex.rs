//! rein's kernels on burn-flex, the CPU backend (see the parent module for why each exists).
//!
//! Every kernel computes in `f32` and falls back to the burn-op default for other dtypes.

use std::sync::{Arc, Mutex};

use burn::backend::Flex;
use burn::tensor::ops::{BoolTensor, FloatTensor, FloatTensorOps, IntTensor};
use burn::tensor::{DType, TensorData};
use burn_flex::FlexTensor;
use rayon::prelude::*;
use rein_kernels::{Init, Isa, MatRef, PackedMatrix, matmul, matmul_packed};

use super::{
    Backend, cached_attention_ops, causal_attention_backward_ops, equals_packed_ops, generic_ops, linear_ops,
    log_prob_entropy_backward_ops, log_prob_entropy_ops, lora_linear_backward_ops, lora_linear_ops,
    packed_causal_attention_backward_ops, packed_causal_attention_ops, packed_linear_ops, packed_spans,
    rms_norm_backward_ops, rms_norm_ops, rope_ops, swiglu_backward_ops, swiglu_ops, tanh_backward_ops, write_cache_ops,
};

impl Backend for Flex {
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

    /// One shard per thread once each gets 8 rows or more: every op of a decoding step then
    /// runs on all cores without waiting on the others, where splitting each small op costs
    /// more in synchronisation than it saves (SmolLM2 at batch 16 on a 2-core Xeon: 277
    /// tokens/s as one shard, 304 as two of 8 rows).
    fn decode_shards(rows: usize) -> usize {
        if nested() || generic_ops() {
            1
        } else {
            rayon::current_num_threads().min(rows / 8).max(1)
        }
    }

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

    fn reads_packed_weights() -> bool {
        !generic_ops()
    }

    fn packed_linear(
        x: FloatTensor<Self>,
        parts: &[&PackedMatrix],
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        let bias_f32 = bias.as_ref().is_none_or(|b| b.dtype() == DType::F32);
        let (Some(x_view), true, false) = (matrix(&x), bias_f32, generic_ops()) else {
            return packed_linear_ops::<Self>(x, parts, bias);
        };
        let rows = x_view.shape()[0];
        let outputs: usize = parts.iter().map(|p| p.shape()[1]).sum();
        let (mut out, init) = output_from_bias(bias.as_ref(), rows, outputs);
        let mut at = 0;
        for part in parts {
            matmul_packed(&mut out[at..], outputs, x_view, part, init);
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

    fn matmul(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        let (Some(a_view), Some(b_view), false) = (matrix(&a), matrix(&b), generic_ops()) else {
            return Self::float_matmul(a, b);
        };
        let ([rows, _], cols) = (a_view.shape(), b_view.shape()[1]);
        let mut out = vec![0.0f32; rows * cols];
        matmul(&mut out, cols, a_view, b_view, Init::Zero);
        tensor(out, &[rows, cols])
    }

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
            d_gate
                .par_chunks_mut(BLOCK)
                .zip(d_up.par_chunks_mut(BLOCK))
                .enumerate()
                .for_each(block);
        } else {
            d_gate
                .chunks_mut(BLOCK)
                .zip(d_up.chunks_mut(BLOCK))
                .enumerate()
                .for_each(block);
        }
        (tensor(d_gate, &shape), tensor(d_up, &shape))
    }

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

    fn write_cache(mut buffer: FloatTensor<Self>, values: FloatTensor<Self>, start: usize) -> FloatTensor<Self> {
        let full = buffer.layout().start_offset() == 0
            && buffer.is_contiguous()
            && buffer.bytes().len() == buffer.layout().num_elements() * 4;
        if buffer.dtype() != DType::F32 || values.dtype() != DType::F32 || !full || !buffer.is_unique() || generic_ops()
        {
            return write_cache_ops::<Self>(buffer, values, start);
        }
        let [batch, heads, capacity, dim] = <[usize; 4]>::try_from(dims(&buffer)).expect("a 4-D cache buffer");
        let seq = dims(&values)[2];
        let values = values.to_contiguous();
        let mut rows = f32s(&values).chunks_exact(seq * dim);
        let buffer_rows = buffer.storage_mut::<f32>().chunks_exact_mut(capacity * dim);
        for row in buffer_rows.take(batch * heads) {
            let new = rows.next().expect("one row of values per (batch, head)");
            row[start * dim..(start + seq) * dim].copy_from_slice(new);
        }
        buffer
    }

    fn cached_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        offset: usize,
        padding: Option<BoolTensor<Self>>,
    ) -> FloatTensor<Self> {
        if q.dtype() != DType::F32 || k.dtype() != DType::F32 || v.dtype() != DType::F32 || generic_ops() {
            return cached_attention_ops::<Self>(q, k, v, offset, padding);
        }
        let [batch, _, seq, _] = <[usize; 4]>::try_from(dims(&q)).expect("4-D queries");
        let padding = padding.map(|p| p.to_contiguous());
        let padding = padding.as_ref().map(|p| &p.storage::<u8>()[..batch * (offset + seq)]);
        attention(q, k, v, padding, offset, &Span::padded(batch, seq))
    }

    fn log_prob_entropy(logits: FloatTensor<Self>, targets: IntTensor<Self>, scale: f32) -> FloatTensor<Self> {
        let index = indices(&targets);
        let (Some(targets), DType::F32, false) = (index, logits.dtype(), generic_ops()) else {
            return log_prob_entropy_ops::<Self>(logits, targets, scale);
        };
        let logits = logits.to_contiguous();
        let [rows, vocab] = shape_2d(&logits);
        let logits = f32s(&logits);
        let mut out = vec![0.0f32; rows * 2];
        for_rows(&mut out, 2, vocab, |r, out| {
            let row = &logits[r * vocab..(r + 1) * vocab];
            let moments = softmax_moments(row, scale);
            out[0] = scale * row[targets[r]] - moments.log_normaliser();
            out[1] = moments.entropy();
        });
        tensor(out, &[rows, 2])
    }

    fn log_prob_entropy_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        scale: f32,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let index = indices(&targets);
        let (Some(targets), DType::F32, DType::F32, false) = (index, logits.dtype(), grad.dtype(), generic_ops())
        else {
            return log_prob_entropy_backward_ops::<Self>(logits, targets, scale, grad);
        };
        let (logits, grad) = (logits.to_contiguous(), grad.to_contiguous());
        let [rows, vocab] = shape_2d(&logits);
        let (logits, grad) = (f32s(&logits), f32s(&grad));
        let mut out = vec![0.0f32; rows * vocab];
        for_rows(&mut out, vocab, vocab, |r, d_row| {
            let [g_lp, g_h] = [grad[2 * r], grad[2 * r + 1]];
            log_prob_entropy_gradient_row(d_row, &logits[r * vocab..(r + 1) * vocab], scale, g_lp, g_h);
            d_row[targets[r]] += scale * g_lp;
        });
        tensor(out, &[rows, vocab])
    }

    fn packed_causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        lengths: &[usize],
    ) -> FloatTensor<Self> {
        if [&q, &k, &v].iter().any(|t| t.dtype() != DType::F32) || generic_ops() {
            return packed_causal_attention_ops::<Self>(q, k, v, lengths);
        }
        attention(q, k, v, None, 0, &Span::packed(lengths))
    }

    fn packed_causal_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        lengths: &[usize],
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        if [&q, &k, &v, &grad].iter().any(|t| t.dtype() != DType::F32) || generic_ops() {
            return packed_causal_attention_backward_ops::<Self>(q, k, v, lengths, grad);
        }
        attention_backward(q, k, v, None, grad, &Span::packed(lengths))
    }

    fn causal_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        padding: Option<BoolTensor<Self>>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        if [&q, &k, &v, &grad].iter().any(|t| t.dtype() != DType::F32) || generic_ops() {
            return causal_attention_backward_ops::<Self>(q, k, v, padding, grad);
        }
        let [batch, _, seq, _] = <[usize; 4]>::try_from(dims(&q)).expect("4-D queries");
        let padding = padding.map(|p| p.to_contiguous());
        let padding = padding.as_ref().map(|p| &p.storage::<u8>()[..batch * seq]);
        attention_backward(q, k, v, padding, grad, &Span::padded(batch, seq))
    }
}

/// [`Backend::cached_attention`] of the sequences `spans` (a padded batch, or sequences packed
/// end to end): `[batch, seq, heads, dim]`, like `q`'s `[batch, heads, seq, dim]`.
fn attention(
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    padding: Option<&[u8]>,
    offset: usize,
    spans: &[Span],
) -> FlexTensor {
    let [batch, heads, seq, dim] = <[usize; 4]>::try_from(dims(&q)).expect("4-D queries");
    let (q, k, v) = (readable(q), readable(k), readable(v));
    let attend = Attend::of(&q, &k, &v, padding, offset);
    let mut out = vec![0.0f32; batch * seq * heads * dim];
    attend.all(spans, &mut out);
    tensor(out, &[batch, seq, heads, dim])
}

/// [`Backend::causal_attention_backward`] of the sequences `spans` (a padded batch, or
/// sequences packed end to end), as tensors shaped like `q`, `k` and `v`.
fn attention_backward(
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    padding: Option<&[u8]>,
    grad: FlexTensor,
    spans: &[Span],
) -> (FlexTensor, FlexTensor, FlexTensor) {
    let [batch, heads, seq, dim] = <[usize; 4]>::try_from(dims(&q)).expect("4-D queries");
    let kv_heads = dims(&k)[1];
    let (q, k, v, grad) = (readable(q), readable(k), readable(v), readable(grad));
    let attend = AttendBackward {
        inputs: Attend::of(&q, &k, &v, padding, 0),
        grad: Rows::of(&grad),
    };
    let mut d_q = vec![0.0f32; batch * seq * heads * dim];
    let (mut d_k, mut d_v) = (
        vec![0.0f32; batch * seq * kv_heads * dim],
        vec![0.0f32; batch * seq * kv_heads * dim],
    );
    let lengths = || spans.iter().map(|s| s.len);
    let d_q_blocks = split_into(&mut d_q, lengths().map(|n| n * heads * dim));
    let d_k_blocks = split_into(&mut d_k, lengths().map(|n| n * kv_heads * dim));
    let d_v_blocks = split_into(&mut d_v, lengths().map(|n| n * kv_heads * dim));
    let blocks = spans.iter().zip(d_q_blocks).zip(d_k_blocks).zip(d_v_blocks);
    let work = lengths().map(|n| n * n).sum::<usize>() * heads * dim;
    for_each_sequence(blocks, work, |(((span, d_q), d_k), d_v)| {
        attend.sequence(*span, d_q, d_k, d_v)
    });
    // Written as `[batch, seq, heads, dim]`, the layout of the projections the inputs are
    // transposed views of: their gradients then reach those projections without a copy.
    let transposed = |values, heads| Flex::float_swap_dims(tensor(values, &[batch, seq, heads, dim]), 1, 2);
    (
        transposed(d_q, heads),
        transposed(d_k, kv_heads),
        transposed(d_v, kv_heads),
    )
}

/// `buffer` cut into consecutive blocks of the given sizes.
fn split_into(mut buffer: &mut [f32], sizes: impl Iterator<Item = usize>) -> Vec<&mut [f32]> {
    let mut blocks = Vec::new();
    for size in sizes {
        let (block, rest) = std::mem::take(&mut buffer).split_at_mut(size);
        blocks.push(block);
        buffer = rest;
    }
    blocks
}

/// One sequence of an attention batch: its tokens are rows `start..start + len` of batch entry
/// `b` (a padded batch has one sequence per entry, from 0; packed sequences share entry 0).
#[derive(Debug, Clone, Copy)]
struct Span {
    b: usize,
    start: usize,
    len: usize,
}

impl Span {
    /// The sequences of a `[batch, seq]` batch.
    fn padded(batch: usize, seq: usize) -> Vec<Span> {
        (0..batch).map(|b| Span { b, start: 0, len: seq }).collect()
    }

    /// Sequences of `lengths` tokens, end to end.
    fn packed(lengths: &[usize]) -> Vec<Span> {
        packed_spans(lengths)
            .map(|(start, len)| Span { b: 0, start, len })
            .collect()
    }
}

/// `f` on each sequence's item, on all threads when the sequences' `work` (multiply-adds) is
/// large enough and this thread is not already one of several parallel tasks.
fn for_each_sequence<T: Send>(items: impl Iterator<Item = T>, work: usize, f: impl Fn(T) + Sync + Send) {
    if work >= PARALLEL_WORK && !nested() {
        items.collect::<Vec<_>>().into_par_iter().for_each(f);
    } else {
        items.for_each(f);
    }
}

/// Multiply-adds below which a kernel stays on one thread.
const PARALLEL_WORK: usize = 1 << 16;

/// Elements below which an element-wise kernel stays on one thread.
const PARALLEL_ELEMENTS: usize = 1 << 15;

/// Elements per task of an element-wise kernel split across threads: fixed, so the split never
/// depends on the thread count (and no result on the split: each element is computed alone).
const BLOCK: usize = 1 << 13;

/// The weights [`Backend::equals_packed`] found equal to a packed matrix, with it: a generation
/// asks about every weight of the model (~0.5 s for SmolLM2-135M), and a LoRA run's base
/// weights never change. Each entry keeps a clone of the weight, so its storage can be neither
/// freed and reused nor written in place (burn-flex copies shared storage before writing):
/// while a weight has the same storage and layout, it has the same values. Entries whose packed
/// matrix only this list still holds (its model is gone) are dropped.
struct VerifiedWeights;

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

/// Whole rows of `width` per task of a row-wise kernel (about [`BLOCK`] elements).
fn rows_per_block(width: usize) -> usize {
    (BLOCK / width.max(1)).max(1)
}

/// `f(i, block i of out)` over consecutive blocks of `block` elements, on all threads when
/// `out` is large enough and this thread is not already one of several parallel tasks.
fn for_blocks(out: &mut [f32], block: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if out.len() >= PARALLEL_ELEMENTS && !nested() {
        out.par_chunks_mut(block).enumerate().for_each(|(i, out)| f(i, out));
    } else {
        out.chunks_mut(block).enumerate().for_each(|(i, out)| f(i, out));
    }
}

/// `f(r, row r of out)` for each row of `out` (`out_width` wide), on all threads when the rows'
/// work (`work_per_row` elements each) is large enough and this thread is not already one of
/// several parallel tasks. Each row is computed alone, so the split never changes a result.
fn for_rows(out: &mut [f32], out_width: usize, work_per_row: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let rows = out.len() / out_width.max(1);
    if rows * work_per_row >= PARALLEL_ELEMENTS && !nested() {
        out.par_chunks_mut(out_width.max(1))
            .enumerate()
            .for_each(|(r, out)| f(r, out));
    } else {
        out.chunks_mut(out_width.max(1))
            .enumerate()
            .for_each(|(r, out)| f(r, out));
    }
}

/// Whether to run the AVX2 copies of the kernels below. The crate is built for baseline x86-64,
/// whose loops vectorise 4 floats wide (SSE2); the copies compiled for AVX2 run 8 wide. Both give
/// the same results bit for bit: vectorising never reorders floating-point operations, it only
/// changes how many run at once (and neither copy fuses multiply-adds).
#[inline(always)]
fn has_avx2() -> bool {
    Isa::active() >= Isa::Avx2
}

/// Calls `$body` (an `#[inline(always)]` function) through a copy compiled for AVX2 where the
/// CPU has it.
macro_rules! with_avx2 {
    (fn $name:ident($($arg:ident: $ty:ty),*) => $body:ident) => {
        with_avx2!(fn $name($($arg: $ty),*) -> () => $body);
    };
    (fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty => $body:ident) => {
        fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2")]
            fn avx2($($arg: $ty),*) -> $ret {
                $body($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            if has_avx2() {
                // SAFETY: the CPU has AVX2, checked just above.
                return unsafe { avx2($($arg),*) };
            }
            $body($($arg),*)
        }
    };
}

/// Attention's inputs (see [`Backend::cached_attention`] and
/// [`Backend::packed_causal_attention`]), read in place: queries `[batch, heads, seq, dim]`
/// (at positions `offset..offset + seq` of their sequence), keys and values
/// `[batch, kv_heads, capacity, dim]`, padding `[batch, offset + seq]`.
struct Attend<'a> {
    q: Rows<'a>,
    k: Rows<'a>,
    v: Rows<'a>,
    padding: Option<&'a [u8]>,
    heads: usize,
    kv_heads: usize,
    offset: usize,
    dim: usize,
}

/// The rows along the last axis of a 4-D `f32` tensor, read in place through its strides
/// (transposed views included): row `(i, j, t)` starts at `start + i·s₀ + j·s₁ + t·s₂`.
#[derive(Clone, Copy)]
struct Rows<'a> {
    data: &'a [f32],
    start: usize,
    strides: [usize; 3],
    width: usize,
}

impl<'a> Rows<'a> {
    /// `None` unless `x` is a 4-D `f32` tensor with contiguous rows and non-negative strides.
    fn try_of(x: &'a FlexTensor) -> Option<Self> {
        let layout = x.layout();
        let strides = layout.strides();
        if x.dtype() != DType::F32 || layout.shape().num_dims() != 4 || strides[3] != 1 {
            return None;
        }
        let stride = |i: usize| usize::try_from(strides[i]).ok();
        Some(Self {
            data: x.storage::<f32>(),
            start: layout.start_offset(),
            strides: [stride(0)?, stride(1)?, stride(2)?],
            width: layout.shape()[3],
        })
    }

    /// The rows of a tensor that [`readable`] returned.
    fn of(x: &'a FlexTensor) -> Self {
        Self::try_of(x).expect("a readable 4-D f32 tensor")
    }

    #[inline(always)]
    fn row(&self, i: usize, j: usize, t: usize) -> &'a [f32] {
        let [s0, s1, s2] = self.strides;
        &self.data[self.start + i * s0 + j * s1 + t * s2..][..self.width]
    }
}

/// `x` itself when [`Rows`] can read it in place, else a contiguous copy.
fn readable(x: FlexTensor) -> FlexTensor {
    if Rows::try_of(&x).is_some() {
        x
    } else {
        x.to_contiguous()
    }
}

impl<'a> Attend<'a> {
    /// The inputs `q`, `k`, `v` ([`readable`] ones) as [`Attend`] reads them.
    fn of(q: &'a FlexTensor, k: &'a FlexTensor, v: &'a FlexTensor, padding: Option<&'a [u8]>, offset: usize) -> Self {
        let [_, heads, _, dim] = <[usize; 4]>::try_from(dims(q)).expect("4-D queries");
        Attend {
            q: Rows::of(q),
            k: Rows::of(k),
            v: Rows::of(v),
            padding,
            heads,
            kv_heads: dims(k)[1],
            offset,
            dim,
        }
    }

    /// The attention of every sequence of `spans` into `out`, `[seq, heads, dim]` blocks one
    /// after the other, on all threads when there is enough work.
    fn all(&self, spans: &[Span], out: &mut [f32]) {
        let block = |span: &Span| span.len * self.heads * self.dim;
        let blocks = spans.iter().zip(split_into(out, spans.iter().map(block)));
        let work = spans.iter().map(|s| block(s) * (self.offset + s.len)).sum();
        for_each_sequence(blocks, work, |(span, out)| self.sequence(*span, out));
    }

    /// Attention of the sequence `span` into its `[seq, heads, dim]` output block `out`.
    fn sequence(&self, span: Span, out: &mut [f32]) {
        with_avx2!(fn run(attend: &Attend<'_>, span: Span, out: &mut [f32]) => attend_sequence);
        run(self, span, out);
    }
}

#[inline(always)]
fn attend_sequence(a: &Attend<'_>, span: Span, out: &mut [f32]) {
    let (dim, heads) = (a.dim, a.heads);
    let Span { b, start, len } = span;
    let filled = a.offset + len;
    let group = heads / a.kv_heads;
    let scale = 1.0 / (dim as f32).sqrt();
    let mut weights = vec![0.0f32; filled];
    let padding = a.padding.map(|p| &p[b * filled..(b + 1) * filled]);
    for h in 0..heads {
        let kv = h / group;
        for t in 0..len {
            // Position `at` sees keys `0..=at`: itself, and no padding but itself.
            let at = a.offset + t;
            let weights = &mut weights[..=at];
            let (key, value) = (|j| a.k.row(b, kv, start + j), |j| a.v.row(b, kv, start + j));
            attention_weights(a.q.row(b, h, start + t), key, padding, scale, weights);
            let out = &mut out[(t * heads + h) * dim..][..dim];
            match dim {
                64 => weighted_sum::<64>(weights, value, out),
                128 => weighted_sum::<128>(weights, value, out),
                _ => {
                    out.fill(0.0);
                    for (j, &w) in weights.iter().enumerate() {
                        axpy(out, w, value(j));
                    }
                }
            }
        }
    }
}

/// `weights ← softmax(scale · keys · query)` over the first `weights.len()` keys, the last
/// being the query's own position: padding keys before it get no weight.
#[inline(always)]
fn attention_weights<'k>(
    query: &[f32],
    key: impl Fn(usize) -> &'k [f32],
    padding: Option<&[u8]>,
    scale: f32,
    weights: &mut [f32],
) {
    let at = weights.len() - 1;
    for (j, w) in weights.iter_mut().enumerate() {
        *w = dot(query, key(j)) * scale;
    }
    if let Some(padding) = padding {
        for (w, &padded) in weights[..at].iter_mut().zip(padding) {
            if padded != 0 {
                *w = f32::NEG_INFINITY;
            }
        }
    }
    let max = weights.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // Exponentials first and the sum apart, so both loops vectorise.
    for w in weights.iter_mut() {
        *w = exp_f32(*w - max);
    }
    let inv_total = 1.0 / sum(weights);
    for w in weights.iter_mut() {
        *w *= inv_total;
    }
}

/// [`Backend::causal_attention_backward`]'s inputs: `q` `[batch, heads, seq, dim]`, `k` and `v`
/// `[batch, kv_heads, seq, dim]`, `grad` `[batch, seq, heads, dim]`, padding `[batch, seq]`.
struct AttendBackward<'a> {
    /// `q`, `k`, `v` and the padding, at offset 0.
    inputs: Attend<'a>,
    grad: Rows<'a>,
}

impl AttendBackward<'_> {
    /// The gradients of the sequence `span`, each laid out as `[seq, heads, dim]` (the
    /// projections' layout): `d_q` over the query heads, `d_k` and `d_v` over the key/value heads.
    fn sequence(&self, span: Span, d_q: &mut [f32], d_k: &mut [f32], d_v: &mut [f32]) {
        with_avx2!(fn run(a: &AttendBackward<'_>, span: Span, d_q: &mut [f32], d_k: &mut [f32], d_v: &mut [f32]) => attention_backward_sequence);
        run(self, span, d_q, d_k, d_v);
    }
}

/// One sequence of [`Backend::causal_attention_backward`], query by query: the weights `p`
/// recomputed as the forward pass computed them, then `∂sⱼ = pⱼ (∂O·vⱼ − Σᵢ pᵢ ∂O·vᵢ)`, and
/// `∂q += ∂sⱼ kⱼ/√d`, `∂kⱼ += ∂sⱼ q/√d`, `∂vⱼ += pⱼ ∂O` over the keys it sees.
#[inline(always)]
fn attention_backward_sequence(
    backward: &AttendBackward<'_>,
    span: Span,
    d_q: &mut [f32],
    d_k: &mut [f32],
    d_v: &mut [f32],
) {
    let (a, grad) = (&backward.inputs, &backward.grad);
    let (dim, heads, kv_heads) = (a.dim, a.heads, a.kv_heads);
    let Span { b, start, len: seq } = span;
    let group = heads / kv_heads;
    let scale = 1.0 / (dim as f32).sqrt();
    let padding = a.padding.map(|p| &p[b * seq..(b + 1) * seq]);
    let (mut weights, mut d_scores) = (vec![0.0f32; seq], vec![0.0f32; seq]);
    for h in 0..heads {
        let kv = h / group;
        let (key, value) = (|j| a.k.row(b, kv, start + j), |j| a.v.row(b, kv, start + j));
        for t in 0..seq {
            let (weights, d_scores) = (&mut weights[..=t], &mut d_scores[..=t]);
            let query = a.q.row(b, h, start + t);
            let d_out = grad.row(b, start + t, h);
            attention_weights(query, key, padding, scale, weights);
            for (j, ds) in d_scores.iter_mut().enumerate() {
                *ds = dot(d_out, value(j));
            }
            let mean = dot(weights, d_scores);
            for (ds, &p) in d_scores.iter_mut().zip(weights.iter()) {
                *ds = p * (*ds - mean) * scale;
            }
            let d_query = &mut d_q[(t * heads + h) * dim..][..dim];
            for j in 0..=t {
                let at = (j * kv_heads + kv) * dim..(j * kv_heads + kv + 1) * dim;
                axpy(d_query, d_scores[j], key(j));
                axpy(&mut d_k[at.clone()], d_scores[j], query);
                axpy(&mut d_v[at], weights[j], d_out);
            }
        }
    }
}

with_avx2!(fn softmax_moments(row: &[f32], scale: f32) -> SoftmaxMoments => softmax_moments_kernel);
with_avx2!(fn log_prob_entropy_gradient_row(out: &mut [f32], row: &[f32], scale: f32, g_lp: f32, g_h: f32) => log_prob_entropy_gradient_kernel);

/// What a row's log-probabilities and entropy under `softmax(u)`, `u = scale·z`, are computed
/// from: `m = maxⱼ uⱼ`, `S = Σⱼ exp(uⱼ − m)` and `T = Σⱼ exp(uⱼ − m) · (uⱼ − m)` (shifted by
/// `m`, so the entropy does not lose digits subtracting two numbers near `m`).
struct SoftmaxMoments {
    max: f32,
    total: f32,
    weighted: f32,
}

impl SoftmaxMoments {
    /// `log Σⱼ exp(uⱼ) = m + ln S`: `log pⱼ = uⱼ − m − ln S`.
    fn log_normaliser(&self) -> f32 {
        self.max + self.total.ln()
    }

    /// `H = −Σⱼ pⱼ log pⱼ = ln S − T/S`.
    fn entropy(&self) -> f32 {
        self.total.ln() - self.weighted / self.total
    }
}

#[inline(always)]
fn softmax_moments_kernel(row: &[f32], scale: f32) -> SoftmaxMoments {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &z| m.max(scale * z));
    let (mut total, mut weighted) = ([0.0f32; 8], [0.0f32; 8]);
    let (body, tail) = row.split_at(row.len() / 8 * 8);
    for chunk in body.chunks_exact(8) {
        for i in 0..8 {
            let shifted = scale * chunk[i] - max;
            let e = exp_f32(shifted);
            total[i] += e;
            weighted[i] += e * shifted;
        }
    }
    let (mut total_tail, mut weighted_tail) = (0.0f32, 0.0f32);
    for &z in tail {
        let shifted = scale * z - max;
        let e = exp_f32(shifted);
        total_tail += e;
        weighted_tail += e * shifted;
    }
    SoftmaxMoments {
        max,
        total: total.iter().sum::<f32>() + total_tail,
        weighted: weighted.iter().sum::<f32>() + weighted_tail,
    }
}

/// `out ← −scale · pⱼ · (g_lp + g_H · (log pⱼ + H))`, the gradient of `g_lp·log pₜ + g_H·H`
/// with respect to `z` except the chosen token's `+scale·g_lp`. With
/// `log pⱼ + H = (uⱼ − m) − T/S` that is `−scale · pⱼ · (c + g_H·(uⱼ − m))`, `c = g_lp − g_H·T/S`.
#[inline(always)]
fn log_prob_entropy_gradient_kernel(out: &mut [f32], row: &[f32], scale: f32, g_lp: f32, g_h: f32) {
    let moments = softmax_moments_kernel(row, scale);
    let c = g_lp - g_h * moments.weighted / moments.total;
    let factor = -scale / moments.total;
    for (o, &z) in out.iter_mut().zip(row) {
        let shifted = scale * z - moments.max;
        *o = factor * exp_f32(shifted) * (c + g_h * shifted);
    }
}

/// `out ← x ⊙ cos + rotate_half(x) ⊙ sin`, `rotate_half([a, c]) = [−c, a]`.
#[inline(always)]
fn rotate_half(out: &mut [f32], x: &[f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    let (first, second) = x.split_at(half);
    let (out_first, out_second) = out.split_at_mut(half);
    for i in 0..half {
        let (a, c) = (first[i], second[i]);
        out_first[i] = a * cos[i] + -c * sin[i];
        out_second[i] = c * cos[i + half] + a * sin[i + half];
    }
}

/// `y ← y + a·x`.
#[inline(always)]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// `out ← Σⱼ weights[j] · value(j)` over rows of `D` values, accumulated in registers.
#[inline(always)]
fn weighted_sum<'v, const D: usize>(weights: &[f32], value: impl Fn(usize) -> &'v [f32], out: &mut [f32]) {
    let mut acc = [0.0f32; D];
    for (j, &w) in weights.iter().enumerate() {
        // As an array, so the loop unrolls into `D / 8` vector registers.
        let value: &[f32; D] = value(j).first_chunk().expect("rows of D values");
        for (a, &x) in acc.iter_mut().zip(value) {
            *a += w * x;
        }
    }
    out.copy_from_slice(&acc);
}

/// `Σ xᵢ` with independent partial sums, so the loop vectorises.
#[inline(always)]
fn sum(x: &[f32]) -> f32 {
    const LANES: usize = 8;
    let mut partial = [0.0f32; LANES];
    let (body, tail) = x.split_at(x.len() / LANES * LANES);
    for chunk in body.chunks_exact(LANES) {
        for i in 0..LANES {
            partial[i] += chunk[i];
        }
    }
    partial.iter().sum::<f32>() + tail.iter().sum::<f32>()
}

/// Whether this thread already runs one of several parallel tasks (a decoding shard), so a
/// kernel splitting its work further would only add synchronisation.
fn nested() -> bool {
    rayon::current_thread_index().is_some()
}

fn dims(x: &FlexTensor) -> Vec<usize> {
    let shape = x.layout().shape();
    (0..shape.num_dims()).map(|i| shape[i]).collect()
}

fn shape_2d(x: &FlexTensor) -> [usize; 2] {
    let shape = x.layout().shape();
    [shape[0], shape[1]]
}

/// A linear layer's `[rows, outputs]` output before its product: the bias in every row (the
/// product then accumulates), or zeros.
fn output_from_bias(bias: Option<&FlexTensor>, rows: usize, outputs: usize) -> (Vec<f32>, Init) {
    match bias {
        Some(bias) => (f32s(&bias.to_contiguous()).repeat(rows), Init::Accumulate),
        None => (vec![0.0f32; rows * outputs], Init::Zero),
    }
}

/// The elements of a contiguous `f32` tensor.
fn f32s(x: &FlexTensor) -> &[f32] {
    &x.storage::<f32>()[..x.layout().num_elements()]
}

fn tensor(values: Vec<f32>, shape: &[usize]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape.to_vec()))
}

/// A 2-D `f32` tensor as a kernel matrix view, read through its strides (`None` for other
/// dtypes, ranks or negative strides).
fn matrix(x: &FlexTensor) -> Option<MatRef<'_>> {
    let layout = x.layout();
    if x.dtype() != DType::F32 || layout.shape().num_dims() != 2 {
        return None;
    }
    let strides = layout.strides();
    let strides = [usize::try_from(strides[0]).ok()?, usize::try_from(strides[1]).ok()?];
    let shape = [layout.shape()[0], layout.shape()[1]];
    MatRef::new(x.storage::<f32>(), layout.start_offset(), shape, strides).ok()
}

/// Row `r` of a 2-D `f32` tensor whose rows are contiguous (column stride 1), whatever its row
/// stride; `None` for other layouts.
fn rows_of<'a>(x: &'a FlexTensor) -> Option<impl Fn(usize) -> &'a [f32]> {
    let layout = x.layout();
    let strides = layout.strides();
    if layout.shape().num_dims() != 2 || strides[1] != 1 || strides[0] < 0 {
        return None;
    }
    let (start, stride, width) = (layout.start_offset(), strides[0] as usize, layout.shape()[1]);
    let storage = x.storage::<f32>();
    Some(move |r: usize| &storage[start + r * stride..start + r * stride + width])
}

/// An integer tensor's elements as indices (`None` for dtypes other than `i32` and `i64`).
fn indices(x: &FlexTensor) -> Option<Vec<usize>> {
    let x = x.to_contiguous();
    let n = x.layout().num_elements();
    match x.dtype() {
        DType::I32 => Some(x.storage::<i32>()[..n].iter().map(|&i| i as usize).collect()),
        DType::I64 => Some(x.storage::<i64>()[..n].iter().map(|&i| i as usize).collect()),
        _ => None,
    }
}

with_avx2!(fn rms_norm_rows(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) => rms_norm_kernel);

/// `out ← weight ⊙ x / sqrt(mean(x²) + eps)`, row by row (rows as long as `weight`).
#[inline(always)]
fn rms_norm_kernel(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
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
fn rms_norm_backward_x_kernel(d_x: &mut [f32], x: &[f32], weight: &[f32], grad: &[f32], eps: f32) {
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
fn rms_norm_backward_weight_kernel(d_weight: &mut [f32], x: &[f32], grad: &[f32], eps: f32) {
    let hidden = d_weight.len();
    for (x, dy) in x.chunks_exact(hidden).zip(grad.chunks_exact(hidden)) {
        let inv_rms = 1.0 / (dot(x, x) / hidden as f32 + eps).sqrt();
        for i in 0..hidden {
            d_weight[i] += dy[i] * (x[i] * inv_rms);
        }
    }
}

/// `Σ aᵢbᵢ` with independent partial sums, so the loop vectorises.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut partial = [0.0f32; LANES];
    let (a_body, a_tail) = a.split_at(a.len() / LANES * LANES);
    let (b_body, b_tail) = b.split_at(a_body.len());
    for (x, y) in a_body.chunks_exact(LANES).zip(b_body.chunks_exact(LANES)) {
        for i in 0..LANES {
            partial[i] += x[i] * y[i];
        }
    }
    partial.iter().sum::<f32>() + a_tail.iter().zip(b_tail).map(|(x, y)| x * y).sum::<f32>()
}

with_avx2!(fn swiglu_in_place(up: &mut [f32], gate: &[f32]) => swiglu_rows);

with_avx2!(fn swiglu_backward_in_place(d_gate: &mut [f32], d_up: &mut [f32], gate: &[f32], up: &[f32], grad: &[f32]) => swiglu_backward_rows);

/// `∂up = ∂y ⊙ silu(g)`, `∂g = ∂y ⊙ up ⊙ σ(g) (1 + g (1 − σ(g)))`.
#[inline(always)]
fn swiglu_backward_rows(d_gate: &mut [f32], d_up: &mut [f32], gate: &[f32], up: &[f32], grad: &[f32]) {
    for i in 0..grad.len() {
        let (g, dy) = (gate[i], grad[i]);
        let sigmoid = 1.0 / (1.0 + exp_f32(-g));
        d_up[i] = dy * g * sigmoid;
        d_gate[i] = dy * up[i] * sigmoid * (1.0 + g * (1.0 - sigmoid));
    }
}

/// `up ← silu(gate) ⊙ up`.
#[inline(always)]
fn swiglu_rows(up: &mut [f32], gate: &[f32]) {
    for (u, &g) in up.iter_mut().zip(gate) {
        *u *= g / (1.0 + exp_f32(-g));
    }
}

/// `eˣ` for `f32` (Cephes' `expf`: `2ⁿ · p(r)` with `x = n ln 2 + r`, within 2 ulp), written
/// without branches or library calls so loops over it vectorise. Saturates below −87.3 and
/// above 88.7.
#[inline(always)]
fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    /// Adding then subtracting 1.5 · 2²³ rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.7);
    let shifted = x * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = ((((1.987_569_2e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 1.666_666_5e-1)
        * r
        + 0.5;
    let p = p * r * r + r + 1.0;
    // n + 127, the biased exponent of 2ⁿ, is in the low bits of `shifted`. Wrapping arithmetic
    // (it cannot overflow here) keeps overflow checks out of the loop, so it vectorises.
    let biased = shifted.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127);
    p * f32::from_bits(biased << 23)
}

/// `tanh` for `f32` as a rational function of `x` (Eigen's `generic_fast_tanh_float`): only
/// multiplications, additions and one division, so loops over it vectorise.
#[inline(always)]
fn tanh_f32(x: f32) -> f32 {
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

#[cfg(test)]
mod tests {
    use burn::tensor::backend::Backend as _;
    use burn::tensor::{Bool, Distribution, Int, Tensor, TensorPrimitive};

    use super::*;

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

    fn random<const D: usize>(shape: [usize; D], seed: u64) -> Tensor<Flex, D> {
        let device = Default::default();
        Flex::seed(&device, seed);
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), &device)
    }

    fn raw<const D: usize>(x: &Tensor<Flex, D>) -> FlexTensor {
        x.clone().into_primitive().tensor()
    }

    fn assert_close(kernel: FlexTensor, ops: FlexTensor) {
        let (a, b) = (
            Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(
                kernel.reshape(vec![kernel.layout().num_elements()].into()),
            )),
            Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(
                ops.reshape(vec![ops.layout().num_elements()].into()),
            )),
        );
        let (a, b) = (
            a.into_data().to_vec::<f32>().unwrap(),
            b.into_data().to_vec::<f32>().unwrap(),
        );
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                "element {i}: kernel {x} vs burn ops {y}"
            );
        }
    }

    #[test]
    fn rms_norm_matches_burn_ops() {
        let (x, w) = (random([5, 24], 1), random([24], 2));
        assert_close(
            Flex::rms_norm(raw(&x), raw(&w), 1e-6),
            rms_norm_ops::<Flex>(raw(&x), raw(&w), 1e-6),
        );
    }

    #[test]
    fn rope_matches_burn_ops_on_a_transposed_view() {
        let device = Default::default();
        // [batch, seq, heads, dim] viewed as [batch, heads, seq, dim], as the model does.
        let x = random([2, 3, 4, 8], 3).swap_dims(1, 2);
        let (cos, sin) = (random([10, 8], 4), random([10, 8], 5));
        let positions = Tensor::<Flex, 2, Int>::from_data([[0, 1, 2], [4, 7, 9]], &device);
        assert_close(
            Flex::rope(raw(&x), positions.clone().into_primitive(), raw(&cos), raw(&sin)),
            rope_ops::<Flex>(raw(&x), positions.into_primitive(), raw(&cos), raw(&sin)),
        );
    }

    #[test]
    fn cached_attention_matches_burn_ops_with_padding() {
        let device = Default::default();
        // 4 query heads over 2 key/value heads; a cache of capacity 7.
        let (k, v) = (random([3, 2, 7, 8], 7), random([3, 2, 7, 8], 8));
        // Decoding one token, prefilling five, and three more after two cached.
        for (seq, offset) in [(1, 4), (5, 0), (3, 2)] {
            let keys = offset + seq;
            // A transposed view, as the model's queries are.
            let q = random([3, seq, 4, 8], 6 + seq as u64).swap_dims(1, 2);
            let flags: Vec<bool> = (0..3 * keys).map(|i| i % keys < i / keys).collect();
            let padding = Tensor::<Flex, 1, Bool>::from_data(flags.as_slice(), &device).reshape([3, keys]);
            for padding in [None, Some(padding)] {
                let padding = padding.map(Tensor::into_primitive);
                assert_close(
                    Flex::cached_attention(raw(&q), raw(&k), raw(&v), offset, padding.clone()),
                    cached_attention_ops::<Flex>(raw(&q), raw(&k), raw(&v), offset, padding),
                );
            }
        }
    }

    #[test]
    fn write_cache_matches_slice_assign_and_writes_in_place() {
        let buffer = random([2, 3, 6, 4], 9);
        // A transposed view, as the model's values are.
        let values = random([2, 2, 3, 4], 10).swap_dims(1, 2);
        let expected = write_cache_ops::<Flex>(raw(&buffer), raw(&values), 3);
        let buffer = buffer.into_primitive().tensor();
        let address = buffer.bytes().as_ptr();
        let written = Flex::write_cache(buffer, raw(&values), 3);
        assert_eq!(written.bytes().as_ptr(), address, "the buffer was copied");
        assert_close(written, expected);
    }

    #[test]
    fn linear_matches_burn_ops_on_strided_inputs() {
        let x = random([7, 5], 11);
        let weight = random([3, 5], 12).transpose(); // [5, 3], column-major
        let bias = random([3], 13);
        for bias in [None, Some(raw(&bias))] {
            assert_close(
                Flex::fused_linear(raw(&x), raw(&weight), bias.clone()),
                linear_ops::<Flex>(raw(&x), raw(&weight), bias),
            );
        }
        let big = (random([64, 256], 14), random([256, 300], 15));
        assert_close(
            Flex::fused_linear(raw(&big.0), raw(&big.1), None),
            linear_ops::<Flex>(raw(&big.0), raw(&big.1), None),
        );
    }

    #[test]
    fn swiglu_matches_burn_ops() {
        let (gate, up) = (random([4, 9], 16).mul_scalar(8.0), random([4, 9], 17));
        assert_close(
            Flex::swiglu(raw(&gate), raw(&up)),
            swiglu_ops::<Flex>(raw(&gate), raw(&up)),
        );
        // The two halves of one fused gate-and-up product, read as views.
        let gate_up = random([5, 18], 18).mul_scalar(4.0);
        let (gate, up) = (gate_up.clone().narrow(1, 0, 9), gate_up.narrow(1, 9, 9));
        assert!(!raw(&up).is_contiguous());
        assert_close(
            Flex::swiglu(raw(&gate), raw(&up)),
            swiglu_ops::<Flex>(raw(&gate), raw(&up)),
        );
    }

    #[test]
    fn fast_exp_matches_libm() {
        let mut worst = 0.0f32;
        for i in -87_000..=88_000 {
            let x = i as f32 / 1_000.0;
            worst = worst.max((exp_f32(x) - x.exp()).abs() / x.exp());
        }
        assert!(worst < 3e-7, "max relative error {worst}");
        let tiny = exp_f32(f32::NEG_INFINITY);
        assert!((0.0..1e-37).contains(&tiny), "exp(-∞) = {tiny}");
    }

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
