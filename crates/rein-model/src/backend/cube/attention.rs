//! Attention over the key/value cache on CubeCL backends (decoding and prefill): one cube per
//! query row, reading the cache in place (no gathers, no copy of its filled prefix, the query
//! heads of a key/value head reading the same rows), the scores, their softmax and the weighted
//! values in one launch. Packed sequences (training) are `packed_attention.rs`'s; padded
//! whole sequences keep burn's ops.
//!
//! Each of the cube's units takes every `units`-th key and keeps a running softmax over them
//! (its maximum `m`, its sum `l = Σ exp(s − m)` and `Σ exp(s − m) v`, rescaled when `m` grows);
//! the units' partials are then merged in unit order, so the result is the same on every run.

use burn::tensor::TensorMetadata;
use burn::tensor::ops::{BoolTensor, FloatTensor};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::calculate_cube_count_elemwise;
use cubecl::prelude::*;

use super::packed_attention::{packed_attention, packed_attention_backward};
use super::softmax::{score, softmax_step, start_softmax, write_softmax};
use super::{count_launch, empty_like};
use crate::backend::{AttentionKernels, PackedSequences, Scoring};

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> AttentionKernels for CubeBackend<R, F, I, BT> {
    fn cached_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        offset: usize,
        padding: Option<BoolTensor<Self>>,
        scoring: Scoring,
    ) -> FloatTensor<Self> {
        let [batch, heads, seq, dim] = q.shape().dims::<4>();
        let out = empty_like(&q, [batch, seq, heads, dim].into());
        let rows = batch * heads * seq;
        if rows == 0 || dim == 0 {
            return out;
        }
        // Every unit keeps `dim` partial sums, and the cube merges them in shared memory.
        let units = if dim > 128 { 16 } else { 32 };
        let client = out.client.clone();
        let has_padding = padding.is_some();
        // Without padding the kernel never reads it: `q` stands in.
        let padding = padding.unwrap_or_else(|| q.clone());
        let dtypes = [q.dtype.into(), padding.dtype.into()];
        count_launch();
        cached_attention_kernel::launch::<R>(
            &client,
            calculate_cube_count_elemwise(&client, rows, CubeDim::new_1d(1)),
            CubeDim::new_1d(units as u32),
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            padding.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            offset as u32,
            scoring.scale,
            scoring.window.map_or(0, |w| w as u32),
            scoring.softcap.unwrap_or(0.0),
            dim,
            units,
            has_padding,
            dtypes,
        );
        out
    }

    fn varlen_causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        sequences: &PackedSequences,
        scoring: Scoring,
    ) -> FloatTensor<Self> {
        packed_attention::<R, F, I, BT>(q, k, v, sequences, scoring)
    }

    fn varlen_causal_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        sequences: &PackedSequences,
        scoring: Scoring,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        packed_attention_backward::<R, F, I, BT>(q, k, v, sequences, scoring, grad)
    }
}

/// `out[b, i, h] = softmax_j(s_j) · v[b, h / rep, j]` over the keys `j` query `i` sees, with
/// `s_j = q[b, h, i] · k[b, h / rep, j] · scale` (soft-capped where `softcap > 0`). Query `i` is
/// at position `offset + i` and sees the keys up to it, from `offset + i + 1 − window` where
/// `window > 0`, except padded ones (`padding[b, j] ≠ 0`, its own position always).
#[cube(launch)]
fn cached_attention_kernel<F: Float, P: Numeric>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    padding: &Tensor<P>,
    out: &mut Tensor<F>,
    offset: u32,
    scale: f32,
    window: u32,
    softcap: f32,
    #[comptime] dim: usize,
    #[comptime] units: usize,
    #[comptime] has_padding: bool,
    #[define(F, P)] _dtypes: [StorageType; 2],
) {
    let (heads, seq) = (q.shape(1), q.shape(2));
    let row = CUBE_POS;
    if row >= q.shape(0) * heads * seq {
        terminate!();
    }
    let unit = UNIT_POS_X as usize;
    let i = row % seq;
    let h = (row / seq) % heads;
    let b = row / (seq * heads);
    let kv_head = h / (heads / k.shape(1));
    let at = offset as usize + i;
    let mut first = 0usize;
    let window = window as usize;
    if window > 0 && at + 1 > window {
        first = at + 1 - window;
    }

    let q_row = b * q.stride(0) + h * q.stride(1) + i * q.stride(2);
    let mut query = Array::<f32>::new(dim);
    for d in 0..dim {
        query[d] = f32::cast_from(q[q_row + d * q.stride(3)]);
    }
    let mut state = Array::<f32>::new(3usize);
    let mut acc = Array::<f32>::new(dim);
    start_softmax(&mut state, &mut acc, dim);
    let k_head = b * k.stride(0) + kv_head * k.stride(1);
    let v_head = b * v.stride(0) + kv_head * v.stride(1);
    let mut j = first + unit;
    while j <= at {
        let mut visible = true;
        if comptime!(has_padding) {
            let padded = u32::cast_from(padding[b * padding.stride(0) + j * padding.stride(1)]) != 0u32;
            visible = !padded || j == at;
        }
        if visible {
            let (s, _) = score::<F>(&query, k, k_head + j * k.stride(2), scale, softcap, dim);
            softmax_step::<F>(s, v, v_head + j * v.stride(2), &mut state, &mut acc, dim);
        }
        j += units;
    }
    write_softmax::<F>(&state, &acc, out, ((b * seq + i) * heads + h) * dim, dim, units);
}
