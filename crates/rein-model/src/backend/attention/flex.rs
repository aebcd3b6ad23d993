//! Attention on Flex: decoding against the key/value cache, whole sequences (padded or packed
//! end to end) and their backward, one pass per sequence and head, reading every input in place.

#![allow(clippy::wildcard_imports)]

use burn::backend::Flex;
use burn::tensor::ops::FloatTensorOps;
use burn_flex::FlexTensor;
use rein_kernels::team;

use super::super::flex::*;
use super::super::tanh_f32;
use super::{PackedSequences, Scoring};

/// [`AttentionKernels::cached_attention`] of the sequences `spans` (a padded batch, or sequences packed
/// end to end): `[batch, seq, heads, dim]`, like `q`'s `[batch, heads, seq, dim]`.
pub(super) fn attention(
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    padding: Option<&[u8]>,
    offset: usize,
    scoring: Scoring,
    spans: &[Span<'_>],
) -> FlexTensor {
    let [batch, heads, seq, dim] = <[usize; 4]>::try_from(dims(&q)).expect("4-D queries");
    let (q, k, v) = (readable(q), readable(k), readable(v));
    let attend = Attend::of(&q, &k, &v, padding, offset, scoring);
    let mut out = vec![0.0f32; batch * seq * heads * dim];
    attend.all(spans, &mut out);
    tensor(out, &[batch, seq, heads, dim])
}

/// [`AttentionKernels::causal_attention_backward`] of the sequences of `trees` (a padded batch,
/// or sequences packed end to end), as tensors shaped like `q`, `k` and `v`. A tree is the
/// spans whose keys are shared — a prefix and the segments continuing it, or a sequence alone —
/// and one task, as its spans' key and value gradients add up in the same rows.
pub(super) fn attention_backward(
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    padding: Option<&[u8]>,
    scoring: Scoring,
    grad: FlexTensor,
    trees: &[&[Span<'_>]],
) -> (FlexTensor, FlexTensor, FlexTensor) {
    let [batch, heads, seq, dim] = <[usize; 4]>::try_from(dims(&q)).expect("4-D queries");
    let kv_heads = dims(&k)[1];
    let (q, k, v, grad) = (readable(q), readable(k), readable(v), readable(grad));
    let attend = AttendBackward {
        inputs: Attend::of(&q, &k, &v, padding, 0, scoring),
        grad: Rows::of(&grad),
    };
    let mut d_q = vec![0.0f32; batch * seq * heads * dim];
    let (mut d_k, mut d_v) = (
        vec![0.0f32; batch * seq * kv_heads * dim],
        vec![0.0f32; batch * seq * kv_heads * dim],
    );
    let rows = || trees.iter().map(|tree| tree.iter().map(|s| s.len).sum::<usize>());
    let d_q_blocks = split_into(&mut d_q, rows().map(|n| n * heads * dim));
    let d_k_blocks = split_into(&mut d_k, rows().map(|n| n * kv_heads * dim));
    let d_v_blocks = split_into(&mut d_v, rows().map(|n| n * kv_heads * dim));
    let blocks = trees.iter().zip(d_q_blocks).zip(d_k_blocks).zip(d_v_blocks);
    let spans = || trees.iter().flat_map(|tree| tree.iter());
    let work = spans().map(|s| s.len * s.keys()).sum::<usize>() * heads * dim;
    for_each_sequence(blocks, work, |(((tree, d_q), d_k), d_v)| {
        let base = tree.first().map_or(0, |span| span.start);
        for span in tree.iter() {
            attend.sequence(*span, base, d_q, d_k, d_v);
        }
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
pub(super) fn split_into(mut buffer: &mut [f32], sizes: impl Iterator<Item = usize>) -> Vec<&mut [f32]> {
    let mut blocks = Vec::new();
    for size in sizes {
        let (block, rest) = std::mem::take(&mut buffer).split_at_mut(size);
        blocks.push(block);
        buffer = rest;
    }
    blocks
}

/// One sequence of an attention batch: its tokens are rows `start..start + len` of batch entry
/// `b` (a padded batch has one sequence per entry, from 0; concatenated sequences share entry 0),
/// after the tokens of the rows `prefix` (a shared prefix stored once, in packed training
/// rows; empty otherwise).
#[derive(Debug, Clone, Copy)]
pub(super) struct Span<'a> {
    pub(super) b: usize,
    pub(super) start: usize,
    pub(super) len: usize,
    pub(super) prefix: &'a [usize],
}

impl<'a> Span<'a> {
    /// The sequences of a `[batch, seq]` batch.
    pub(super) fn padded(batch: usize, seq: usize) -> Vec<Self> {
        (0..batch)
            .map(|b| Span {
                b,
                start: 0,
                len: seq,
                prefix: &[],
            })
            .collect()
    }

    /// The segments of `sequences`, each after its ancestors' rows (`prefixes`, from
    /// [`prefix_rows`]).
    pub(super) fn packed(sequences: &PackedSequences, prefixes: &'a [Vec<usize>]) -> Vec<Self> {
        (sequences.starts().into_iter().zip(sequences.lengths()).zip(prefixes))
            .map(|((start, &len), prefix)| Span {
                b: 0,
                start,
                len,
                prefix,
            })
            .collect()
    }

    /// The keys its last token sees, its prefix's and its own (before any window).
    pub(super) fn keys(&self) -> usize {
        self.prefix.len() + self.len
    }

    /// The row of the key at position `j` of its sequence: the prefix's rows, then its own.
    #[inline(always)]
    fn key_row(&self, j: usize) -> usize {
        match self.prefix.get(j) {
            Some(&row) => row,
            None => self.start + j - self.prefix.len(),
        }
    }
}

/// Each segment's [`PackedSequences::prefix_rows`].
pub(super) fn prefix_rows(sequences: &PackedSequences) -> Vec<Vec<usize>> {
    let starts = sequences.starts();
    (0..sequences.lengths().len())
        .map(|i| sequences.prefix_rows(i, &starts))
        .collect()
}

/// `f` on each sequence's item, on all threads when the sequences' `work` (multiply-adds) is
/// large enough and this thread is not already one of several parallel tasks.
pub(super) fn for_each_sequence<T: Send>(items: impl Iterator<Item = T>, work: usize, f: impl Fn(T) + Sync + Send) {
    if work >= PARALLEL_WORK && !nested() {
        team::for_each(items.collect(), f);
    } else {
        items.for_each(f);
    }
}

/// Attention's inputs (see [`AttentionKernels::cached_attention`] and
/// [`AttentionKernels::varlen_causal_attention`]), read in place: queries `[batch, heads, seq, dim]`
/// (at positions `offset..offset + seq` of their sequence), keys and values
/// `[batch, kv_heads, capacity, dim]`, padding `[batch, offset + seq]`, the scores formed as
/// `scoring` says.
pub(super) struct Attend<'a> {
    pub(super) q: Rows<'a>,
    pub(super) k: Rows<'a>,
    pub(super) v: Rows<'a>,
    pub(super) padding: Option<&'a [u8]>,
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    pub(super) offset: usize,
    pub(super) dim: usize,
    pub(super) scoring: Scoring,
}

impl<'a> Attend<'a> {
    /// The inputs `q`, `k`, `v` ([`readable`] ones) as [`Attend`] reads them.
    pub(super) fn of(
        q: &'a FlexTensor,
        k: &'a FlexTensor,
        v: &'a FlexTensor,
        padding: Option<&'a [u8]>,
        offset: usize,
        scoring: Scoring,
    ) -> Self {
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
            scoring,
        }
    }

    /// The attention of every sequence of `spans` into `out`, `[seq, heads, dim]` blocks one
    /// after the other, on all threads when there is enough work.
    pub(super) fn all(&self, spans: &[Span<'_>], out: &mut [f32]) {
        let block = |span: &Span| span.len * self.heads * self.dim;
        let blocks = spans.iter().zip(split_into(out, spans.iter().map(block)));
        let work = spans.iter().map(|s| block(s) * (self.offset + s.keys())).sum();
        for_each_sequence(blocks, work, |(span, out)| self.sequence(*span, out));
    }

    /// Attention of the sequence `span` into its `[seq, heads, dim]` output block `out`.
    pub(super) fn sequence(&self, span: Span<'_>, out: &mut [f32]) {
        with_avx2!(fn run(attend: &Attend<'_>, span: Span<'_>, out: &mut [f32]) => attend_sequence);
        run(self, span, out);
    }
}

#[inline(always)]
pub(super) fn attend_sequence(a: &Attend<'_>, span: Span<'_>, out: &mut [f32]) {
    let (dim, heads) = (a.dim, a.heads);
    let (b, shared) = (span.b, a.offset + span.prefix.len());
    let filled = shared + span.len;
    let group = heads / a.kv_heads;
    let mut weights = vec![0.0f32; filled];
    let padding = a.padding.map(|p| &p[b * filled..(b + 1) * filled]);
    for h in 0..heads {
        let kv = h / group;
        for t in 0..span.len {
            // Position `at` sees keys `first..=at` (all from 0 without a window): itself, and no
            // padding but itself.
            let at = shared + t;
            let first = a.scoring.first_key(at);
            let weights = &mut weights[..=at - first];
            let (key, value) = (
                |j| a.k.row(b, kv, span.key_row(first + j)),
                |j| a.v.row(b, kv, span.key_row(first + j)),
            );
            let padding = padding.map(|p| &p[first..]);
            attention_weights(a.q.row(b, h, span.start + t), key, padding, a.scoring, weights);
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

/// `weights ← softmax(s)` over the first `weights.len()` keys, the last being the query's own
/// position, with `s` the scores `scoring` forms from `keys · query`: padding keys before it get
/// no weight.
#[inline(always)]
pub(super) fn attention_weights<'k>(
    query: &[f32],
    key: impl Fn(usize) -> &'k [f32],
    padding: Option<&[u8]>,
    scoring: Scoring,
    weights: &mut [f32],
) {
    let at = weights.len() - 1;
    for (j, w) in weights.iter_mut().enumerate() {
        *w = dot(query, key(j)) * scoring.scale;
    }
    if let Some(cap) = scoring.softcap {
        for w in weights.iter_mut() {
            *w = cap * tanh_f32(*w / cap);
        }
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

/// [`AttentionKernels::causal_attention_backward`]'s inputs: `q` `[batch, heads, seq, dim]`, `k` and `v`
/// `[batch, kv_heads, seq, dim]`, `grad` `[batch, seq, heads, dim]`, padding `[batch, seq]`.
pub(super) struct AttendBackward<'a> {
    /// `q`, `k`, `v` and the padding, at offset 0.
    pub(super) inputs: Attend<'a>,
    pub(super) grad: Rows<'a>,
}

impl AttendBackward<'_> {
    /// The gradients of the sequence `span` added into those of its rows, laid out as `[seq,
    /// heads, dim]` (the projections' layout): `d_q` over the query heads, `d_k` and `d_v` over
    /// the key/value heads (its prefix's rows get its share).
    /// `d_q`, `d_k` and `d_v` hold the rows from `base` on.
    pub(super) fn sequence(&self, span: Span<'_>, base: usize, d_q: &mut [f32], d_k: &mut [f32], d_v: &mut [f32]) {
        with_avx2!(fn run(a: &AttendBackward<'_>, span: Span<'_>, base: usize, d_q: &mut [f32], d_k: &mut [f32], d_v: &mut [f32]) => attention_backward_sequence);
        run(self, span, base, d_q, d_k, d_v);
    }
}

/// One sequence of [`AttentionKernels::causal_attention_backward`], query by query: the weights `p`
/// recomputed as the forward pass computed them, then `∂sⱼ = pⱼ (∂O·vⱼ − Σᵢ pᵢ ∂O·vᵢ)` (times
/// `1 − (sⱼ/c)²` through a soft cap), and `∂q += ∂sⱼ kⱼ·scale`, `∂kⱼ += ∂sⱼ q·scale`,
/// `∂vⱼ += pⱼ ∂O` over the keys it sees.
#[inline(always)]
pub(super) fn attention_backward_sequence(
    backward: &AttendBackward<'_>,
    span: Span<'_>,
    base: usize,
    d_q: &mut [f32],
    d_k: &mut [f32],
    d_v: &mut [f32],
) {
    let (a, grad) = (&backward.inputs, &backward.grad);
    let (dim, heads, kv_heads) = (a.dim, a.heads, a.kv_heads);
    let (b, seq, shared) = (span.b, span.len, span.prefix.len());
    let group = heads / kv_heads;
    let scoring = a.scoring;
    let padding = a.padding.map(|p| &p[b * seq..(b + 1) * seq]);
    let (mut weights, mut d_scores) = (vec![0.0f32; span.keys()], vec![0.0f32; span.keys()]);
    for h in 0..heads {
        let kv = h / group;
        for t in 0..seq {
            let at = shared + t;
            let first = scoring.first_key(at);
            let row = |j| span.key_row(first + j);
            let (key, value) = (|j| a.k.row(b, kv, row(j)), |j| a.v.row(b, kv, row(j)));
            let (weights, d_scores) = (&mut weights[..=at - first], &mut d_scores[..=at - first]);
            let query = a.q.row(b, h, span.start + t);
            let d_out = grad.row(b, span.start + t, h);
            attention_weights(query, key, padding.map(|p| &p[first..]), scoring, weights);
            for (j, ds) in d_scores.iter_mut().enumerate() {
                *ds = dot(d_out, value(j));
            }
            let mean = dot(weights, d_scores);
            for (ds, &p) in d_scores.iter_mut().zip(weights.iter()) {
                *ds = p * (*ds - mean) * scoring.scale;
            }
            if let Some(cap) = scoring.softcap {
                // The capped scores again (the weights overwrote them), for `1 − tanh²`.
                for (j, ds) in d_scores.iter_mut().enumerate() {
                    let capped = tanh_f32(dot(query, key(j)) * scoring.scale / cap);
                    *ds *= 1.0 - capped * capped;
                }
            }
            let d_query = &mut d_q[((span.start + t - base) * heads + h) * dim..][..dim];
            for (j, (&ds, &p)) in d_scores.iter().zip(weights.iter()).enumerate() {
                let at = ((row(j) - base) * kv_heads + kv) * dim..((row(j) - base) * kv_heads + kv + 1) * dim;
                axpy(d_query, ds, key(j));
                axpy(&mut d_k[at.clone()], ds, query);
                axpy(&mut d_v[at], p, d_out);
            }
        }
    }
}

/// `y ← y + a·x`.
#[inline(always)]
pub(super) fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// `out ← Σⱼ weights[j] · value(j)` over rows of `D` values, accumulated in registers.
#[inline(always)]
pub(super) fn weighted_sum<'v, const D: usize>(weights: &[f32], value: impl Fn(usize) -> &'v [f32], out: &mut [f32]) {
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
pub(super) fn sum(x: &[f32]) -> f32 {
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
