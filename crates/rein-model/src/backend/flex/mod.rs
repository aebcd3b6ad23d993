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
    ReinBackend, cached_attention_ops, causal_attention_backward_ops, equals_packed_ops, generic_ops, linear_ops,
    log_prob_entropy_backward_ops, log_prob_entropy_ops, lora_linear_backward_ops, lora_linear_ops, packed_linear_ops,
    rms_norm_backward_ops, rms_norm_ops, rope_ops, sequence_spans, swiglu_backward_ops, swiglu_ops, tanh_backward_ops,
    varlen_causal_attention_backward_ops, varlen_causal_attention_ops, write_cache_ops,
};

impl ReinBackend for Flex {
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

    fn varlen_causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        lengths: &[usize],
    ) -> FloatTensor<Self> {
        if [&q, &k, &v].iter().any(|t| t.dtype() != DType::F32) || generic_ops() {
            return varlen_causal_attention_ops::<Self>(q, k, v, lengths);
        }
        attention(q, k, v, None, 0, &Span::concatenated(lengths))
    }

    fn varlen_causal_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        lengths: &[usize],
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        if [&q, &k, &v, &grad].iter().any(|t| t.dtype() != DType::F32) || generic_ops() {
            return varlen_causal_attention_backward_ops::<Self>(q, k, v, lengths, grad);
        }
        attention_backward(q, k, v, None, grad, &Span::concatenated(lengths))
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

/// Multiply-adds below which a kernel stays on one thread.
pub(super) const PARALLEL_WORK: usize = 1 << 16;

/// Elements below which an element-wise kernel stays on one thread.
pub(super) const PARALLEL_ELEMENTS: usize = 1 << 15;

/// Elements per task of an element-wise kernel split across threads: fixed, so the split never
/// depends on the thread count (and no result on the split: each element is computed alone).
pub(super) const BLOCK: usize = 1 << 13;

/// The weights [`ReinBackend::equals_packed`] found equal to a packed matrix, with it: a generation
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

/// Whole rows of `width` per task of a row-wise kernel (about [`BLOCK`] elements).
pub(super) fn rows_per_block(width: usize) -> usize {
    (BLOCK / width.max(1)).max(1)
}

/// `f(i, block i of out)` over consecutive blocks of `block` elements, on all threads when
/// `out` is large enough and this thread is not already one of several parallel tasks.
pub(super) fn for_blocks(out: &mut [f32], block: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if out.len() >= PARALLEL_ELEMENTS && !nested() {
        out.par_chunks_mut(block).enumerate().for_each(|(i, out)| f(i, out));
    } else {
        out.chunks_mut(block).enumerate().for_each(|(i, out)| f(i, out));
    }
}

/// `f(r, row r of out)` for each row of `out` (`out_width` wide), on all threads when the rows'
/// work (`work_per_row` elements each) is large enough and this thread is not already one of
/// several parallel tasks. Each row is computed alone, so the split never changes a result.
pub(super) fn for_rows(out: &mut [f32], out_width: usize, work_per_row: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
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
pub(super) fn has_avx2() -> bool {
    Isa::active() >= Isa::Avx2
}

/// Calls `$body` (an `#[inline(always)]` function) through a copy compiled for AVX2 where the
/// CPU has it.
macro_rules! with_avx2 {
    (fn $name:ident($($arg:ident: $ty:ty),*) => $body:ident) => {
        with_avx2!(fn $name($($arg: $ty),*) -> () => $body);
    };
    (fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty => $body:ident) => {
        pub(super) fn $name($($arg: $ty),*) -> $ret {
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

mod attention;
mod rows;
#[cfg(test)]
mod tests;

use attention::*;
use rows::*;

/// Whether this thread already runs one of several parallel tasks (a decoding shard), so a
/// kernel splitting its work further would only add synchronisation.
pub(super) fn nested() -> bool {
    rayon::current_thread_index().is_some()
}

pub(super) fn dims(x: &FlexTensor) -> Vec<usize> {
    let shape = x.layout().shape();
    (0..shape.num_dims()).map(|i| shape[i]).collect()
}

pub(super) fn shape_2d(x: &FlexTensor) -> [usize; 2] {
    let shape = x.layout().shape();
    [shape[0], shape[1]]
}

/// A linear layer's `[rows, outputs]` output before its product: the bias in every row (the
/// product then accumulates), or zeros.
pub(super) fn output_from_bias(bias: Option<&FlexTensor>, rows: usize, outputs: usize) -> (Vec<f32>, Init) {
    match bias {
        Some(bias) => (f32s(&bias.to_contiguous()).repeat(rows), Init::Accumulate),
        None => (vec![0.0f32; rows * outputs], Init::Zero),
    }
}

/// The elements of a contiguous `f32` tensor.
pub(super) fn f32s(x: &FlexTensor) -> &[f32] {
    &x.storage::<f32>()[..x.layout().num_elements()]
}

pub(super) fn tensor(values: Vec<f32>, shape: &[usize]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape.to_vec()))
}

/// A 2-D `f32` tensor as a kernel matrix view, read through its strides (`None` for other
/// dtypes, ranks or negative strides).
pub(super) fn matrix(x: &FlexTensor) -> Option<MatRef<'_>> {
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
pub(super) fn rows_of<'a>(x: &'a FlexTensor) -> Option<impl Fn(usize) -> &'a [f32]> {
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
pub(super) fn indices(x: &FlexTensor) -> Option<Vec<usize>> {
    let x = x.to_contiguous();
    let n = x.layout().num_elements();
    match x.dtype() {
        DType::I32 => Some(x.storage::<i32>()[..n].iter().map(|&i| i as usize).collect()),
        DType::I64 => Some(x.storage::<i64>()[..n].iter().map(|&i| i as usize).collect()),
        _ => None,
    }
}

with_avx2!(fn rms_norm_rows(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) => rms_norm_kernel);
