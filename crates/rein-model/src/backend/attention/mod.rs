//! Causal attention: decoding against a key/value cache (and writing the cache in place), and
//! whole sequences for training and scoring, padded or concatenated end to end, with a backward
//! that recomputes each query's weights from `q` and `k` and writes `∂q`, `∂k`, `∂v` in one pass
//! per sequence. burn's autodiff of its attention ops kept `[batch, heads, seq, seq]` weights and
//! copied repeated keys, masks and transposed views several times per layer (over a third of a
//! GRPO step). On Flex every input is read in place and the output written in the layout the
//! next projection reads ([`flex`]); other backends, CUDA included, run burn ops: one masked
//! attention per block of packed sequences.

mod flex;
mod packed_sequences;
#[cfg(test)]
mod tests;

use burn::backend::Flex;
use burn::tensor::activation::softmax;
use burn::tensor::ops::{BoolTensor, FloatTensor};
use burn::tensor::{Bool, DType, Int, Tensor};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

pub use self::packed_sequences::PackedSequences;

use self::flex::{Span, attention, attention_backward, prefix_rows};
use super::flex::{dims, f32s};
use super::{LinearKernels, ReinBackend, float, generic_ops, register_inputs};

/// How a query's attention scores over its keys are formed, and which keys it sees:
///
/// ```text
/// sⱼ = q·kⱼ · scale                     (scale = 1/√head_dim unless the model says otherwise)
/// sⱼ ← c · tanh(sⱼ / c)                 (soft-capping, Gemma 2)
/// keys j ≤ i − window are masked         (sliding window: query i sees its last `window` keys)
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scoring {
    /// The factor on `q·k`.
    pub scale: f32,
    /// Sliding-window attention: a query sees only the `window` keys ending at its own.
    pub window: Option<usize>,
    /// Soft-capping: scores become `c·tanh(s/c)`.
    pub softcap: Option<f32>,
}

impl Scoring {
    /// `1/√head_dim`, every earlier key, no cap: the attention of Llama and Qwen2.
    pub fn standard(head_dim: usize) -> Self {
        Self {
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: None,
            softcap: None,
        }
    }

    /// The first of keys `0..=at` the query at index `at` sees.
    #[inline(always)]
    pub fn first_key(&self, at: usize) -> usize {
        self.window.map_or(0, |window| (at + 1).saturating_sub(window))
    }
}

/// Causal attention over a cache and over whole sequences, with its backward.
pub trait AttentionKernels: LinearKernels {
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
    /// values last), the query heads of each key/value head sharing it, its scores as
    /// `scoring` forms and masks them (a window counts positions of the cache).
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
        scoring: Scoring,
    ) -> FloatTensor<Self> {
        cached_attention_ops::<Self>(q, k, v, offset, padding, scoring)
    }

    /// Causal attention of whole sequences (training and scoring, no cache): attention over
    /// keys and values of the same `seq` tokens. Its autodiff version has its own backward,
    /// [`AttentionKernels::causal_attention_backward`].
    ///
    /// # Shapes
    /// - `q`: `[batch, heads, seq, head_dim]`, `k`, `v`: `[batch, kv_heads, seq, head_dim]`,
    ///   `padding`: `[batch, seq]` (as for [`AttentionKernels::cached_attention`]) → `[batch, seq, heads, head_dim]`
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        padding: Option<BoolTensor<Self>>,
        scoring: Scoring,
    ) -> FloatTensor<Self> {
        Self::cached_attention(q, k, v, 0, padding, scoring)
    }

    /// The gradients of [`AttentionKernels::causal_attention`] given the output's, `(∂q, ∂k, ∂v)`. With
    /// `P = softmax(S)`, `S = q kᵀ·scale` (masked) per query head and `∂P = ∂O vᵀ`:
    /// `∂v = Pᵀ ∂O`, `∂S = P ⊙ (∂P − rowsum(P ⊙ ∂P))`, `∂q = ∂S k·scale`, `∂k = ∂Sᵀ q·scale`, the key
    /// and value gradients summed over the query heads that share them; with soft-capping
    /// `∂S` is first multiplied by `1 − (S_capped/c)²`. `P` is recomputed,
    /// not stored: one more `q kᵀ` costs less than keeping `[batch, heads, seq, seq]` per layer.
    ///
    /// # Shapes
    /// - as [`AttentionKernels::causal_attention`]'s inputs, `grad` like its output → like `q`, `k`, `v`
    fn causal_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        padding: Option<BoolTensor<Self>>,
        scoring: Scoring,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        causal_attention_backward_ops::<Self>(q, k, v, padding, scoring, grad)
    }

    /// Causal attention of sequences concatenated end to end along the token axis, without padding
    /// ([`PackedSequences`]): each segment attends to its ancestors' tokens and its own, at
    /// positions after its ancestors'. What [`AttentionKernels::causal_attention`] computes for
    /// each root-to-leaf sequence alone, without the rows a padded batch spends on padding, and
    /// with a shared prefix computed once. Its autodiff version has its own backward,
    /// [`AttentionKernels::varlen_causal_attention_backward`].
    ///
    /// # Shapes
    /// - `q`: `[1, heads, total, head_dim]`, `k`, `v`: `[1, kv_heads, total, head_dim]` with
    ///   `total` the segments' tokens → `[1, total, heads, head_dim]`
    fn varlen_causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        sequences: &PackedSequences,
        scoring: Scoring,
    ) -> FloatTensor<Self> {
        varlen_causal_attention_ops::<Self>(q, k, v, sequences, scoring)
    }

    /// The gradients of [`AttentionKernels::varlen_causal_attention`] given the output's: each
    /// sequence's as [`AttentionKernels::causal_attention_backward`] gives them, a shared
    /// prefix's key and value gradients summed over the segments that continue it.
    ///
    /// # Shapes
    /// - as [`AttentionKernels::varlen_causal_attention`]'s inputs, `grad` like its output → like `q`, `k`, `v`
    fn varlen_causal_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        sequences: &PackedSequences,
        scoring: Scoring,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        varlen_causal_attention_backward_ops::<Self>(q, k, v, sequences, scoring, grad)
    }
}

/// [`AttentionKernels::write_cache`] in burn ops.
pub(super) fn write_cache_ops<B: burn::tensor::backend::Backend>(
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

/// [`AttentionKernels::cached_attention`] in burn ops (and so with gradients, on an autodiff
/// backend): [`masked_attention_ops`] over the cache's filled positions.
pub(super) fn cached_attention_ops<B: LinearKernels>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    offset: usize,
    padding: Option<BoolTensor<B>>,
    scoring: Scoring,
) -> FloatTensor<B> {
    let q = float::<B, 4>(q);
    let [batch, _, seq, _] = q.dims();
    let keys = offset + seq;
    let filled = |t: FloatTensor<B>| float::<B, 4>(t).narrow(2, 0, keys);
    let padding = padding.map(Tensor::<B, 2, Bool>::from_primitive);
    let mask = attention_mask::<B>(batch, seq, keys, offset, padding, scoring.window, &q.device());
    masked_attention_ops(q, filled(k), filled(v), mask, scoring)
}

/// The scores `q kᵀ·scale` (soft-capped where `scoring` caps them).
fn scores<B: LinearKernels>(q: Tensor<B, 4>, k: Tensor<B, 4>, scoring: Scoring) -> Tensor<B, 4> {
    let scores = product(q, k.swap_dims(2, 3)).mul_scalar(scoring.scale);
    match scoring.softcap {
        Some(cap) => scores.div_scalar(cap).tanh().mul_scalar(cap),
        None => scores,
    }
}

/// `softmax(S) v` in burn ops, `S` the [`scores`], where `mask` is `true` at `-∞` (no row may be
/// wholly masked), its two products through [`LinearKernels::matmul`]; the query heads of each
/// key/value head share it.
///
/// # Shapes
/// - `q`: `[batch, heads, seq, dim]`, `k`, `v`: `[batch, kv_heads, keys, dim]`, `mask`:
///   `[batch or 1, 1, seq, keys]` → `[batch, seq, heads, dim]`
fn masked_attention_ops<B: LinearKernels>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Tensor<B, 4, Bool>,
    scoring: Scoring,
) -> FloatTensor<B> {
    let [batch, heads, seq, _] = q.dims();
    let keys = k.dims()[2];
    let scores = scores(q, repeat_kv(k, heads), scoring);
    let weights = softmax(
        scores.mask_fill(mask.expand([batch, heads, seq, keys]), f32::NEG_INFINITY),
        3,
    );
    product(weights, repeat_kv(v, heads))
        .swap_dims(1, 2)
        .into_primitive()
        .tensor()
}

/// Each key/value head repeated for the query heads that share it: `[batch, kv_heads, keys, dim]`
/// → `[batch, heads, keys, dim]`.
fn repeat_kv<B: burn::tensor::backend::Backend>(t: Tensor<B, 4>, heads: usize) -> Tensor<B, 4> {
    let [batch, kv_heads, keys, dim] = t.dims();
    let rep = heads / kv_heads;
    if rep == 1 {
        return t;
    }
    t.unsqueeze_dim::<5>(2)
        .expand([batch, kv_heads, rep, keys, dim])
        .reshape([batch, heads, keys, dim])
}

/// `a · b` over the last two axes through [`LinearKernels::matmul`] (full f32 on CUDA).
fn product<B: LinearKernels>(a: Tensor<B, 4>, b: Tensor<B, 4>) -> Tensor<B, 4> {
    float(B::matmul(a.into_primitive().tensor(), b.into_primitive().tensor()))
}

/// [`AttentionKernels::causal_attention_backward`] in burn ops.
pub(super) fn causal_attention_backward_ops<B: LinearKernels>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    padding: Option<BoolTensor<B>>,
    scoring: Scoring,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let q = float::<B, 4>(q);
    let [batch, _, seq, _] = q.dims();
    let padding = padding.map(Tensor::<B, 2, Bool>::from_primitive);
    let mask = attention_mask::<B>(batch, seq, seq, 0, padding, scoring.window, &q.device());
    masked_attention_backward_ops(q, float(k), float(v), mask, scoring, float(grad))
}

/// The gradients of [`masked_attention_ops`] given its output's `grad` (`[batch, seq, heads,
/// dim]`), as [`AttentionKernels::causal_attention_backward`] states them, the weights
/// recomputed.
fn masked_attention_backward_ops<B: LinearKernels>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Tensor<B, 4, Bool>,
    scoring: Scoring,
    grad: Tensor<B, 4>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let [batch, heads, seq, dim] = q.dims();
    let [_, kv_heads, keys, _] = k.dims();
    let rep = heads / kv_heads;
    // The key/value heads' gradients: the sum over the query heads sharing each.
    let fold = |t: Tensor<B, 4>| {
        t.reshape([batch, kv_heads, rep, keys, dim])
            .sum_dim(2)
            .reshape([batch, kv_heads, keys, dim])
    };
    let (k, v) = (repeat_kv(k, heads), repeat_kv(v, heads));
    let mask = mask.expand([batch, heads, seq, keys]);
    let scores = scores(q.clone(), k.clone(), scoring);
    let p = softmax(scores.clone().mask_fill(mask, f32::NEG_INFINITY), 3);
    let d_out = grad.swap_dims(1, 2);
    let d_v = product(p.clone().swap_dims(2, 3), d_out.clone());
    let d_p = product(d_out, v.swap_dims(2, 3));
    let d_s = p.clone() * (d_p.clone() - (p * d_p).sum_dim(3));
    // Through the cap: ∂s/∂(q·k·scale) = 1 − tanh² = 1 − (s/c)².
    let d_s = match scoring.softcap {
        Some(cap) => d_s * scores.div_scalar(cap).powi_scalar(2).neg().add_scalar(1.0),
        None => d_s,
    };
    let scale = f64::from(scoring.scale);
    let d_q = product(d_s.clone(), k).mul_scalar(scale);
    let d_k = product(d_s.swap_dims(2, 3), q).mul_scalar(scale);
    let raw = |t: Tensor<B, 4>| t.into_primitive().tensor();
    (raw(d_q), raw(fold(d_k)), raw(fold(d_v)))
}

/// The most tokens one block of packed attention in burn ops spans (see [`packed_blocks`]).
const BLOCK_TOKENS: usize = 1024;

/// Consecutive trees of packed segments (a sequence, or a prefix and the segments continuing
/// it) grouped into blocks of at most `limit` tokens (a larger tree is a block of its own):
/// `(first token, the block's segments)`. One masked attention per block instead of one per
/// sequence: on a GPU each burn op is a kernel launch, and per sequence a GRPO step's
/// attention was most of its launches; a block's masked scores (`heads × limit²`) stay small.
fn packed_blocks(sequences: &PackedSequences, limit: usize) -> Vec<(usize, PackedSequences)> {
    let lengths = sequences.lengths();
    let mut blocks = Vec::new();
    let (mut first, mut start, mut tokens) = (0, 0, 0);
    for tree in sequences.trees() {
        let len: usize = lengths[tree.clone()].iter().sum();
        if tree.start > first && tokens + len > limit {
            blocks.push((start, sequences.slice(first..tree.start)));
            (first, start, tokens) = (tree.start, start + tokens, 0);
        }
        tokens += len;
    }
    if first < lengths.len() {
        blocks.push((start, sequences.slice(first..lengths.len())));
    }
    blocks
}

/// `true` where a query of a block of packed segments may not attend: future keys, keys before
/// its window, and keys of segments other than its own and its ancestors. → `[1, 1, total, total]`
fn packed_mask<B: burn::tensor::backend::Backend>(
    block: &PackedSequences,
    window: Option<usize>,
    device: &B::Device,
) -> Tensor<B, 4, Bool> {
    let total = block.total();
    if block.shares_prefixes() {
        let mask = tree_mask(block, window);
        return Tensor::from_data(burn::tensor::TensorData::new(mask, [1, 1, total, total]), device);
    }
    let ids: Vec<i64> = (0..block.lengths().len() as i64)
        .zip(block.lengths())
        .flat_map(|(id, &len)| std::iter::repeat_n(id, len))
        .collect();
    let ids = Tensor::<B, 1, Int>::from_data(burn::tensor::TensorData::new(ids, [total]), device);
    let other = ids.clone().reshape([total, 1]).not_equal(ids.reshape([1, total]));
    let mask = attention_mask::<B>(1, total, total, 0, None, window, device).reshape([total, total]);
    mask.bool_or(other).reshape([1, 1, total, total])
}

/// [`packed_mask`] of segments that continue others, built here: `[total × total]`, row-major.
fn tree_mask(block: &PackedSequences, window: Option<usize>) -> Vec<bool> {
    let (lengths, parents) = (block.lengths(), block.parents());
    let segments = lengths.len();
    // `sees[i × segments + s]`: segment `i` attends to segment `s` (itself or an ancestor).
    let mut sees = vec![false; segments * segments];
    for i in 0..segments {
        let mut at = Some(i);
        while let Some(s) = at {
            sees[i * segments + s] = true;
            at = parents[s];
        }
    }
    let segment: Vec<usize> = (0..segments).flat_map(|s| std::iter::repeat_n(s, lengths[s])).collect();
    let positions = block.positions();
    let total = positions.len();
    let mut mask = vec![true; total * total];
    for query in 0..total {
        for key in 0..total {
            let (at, pos) = (positions[query], positions[key]);
            let visible = sees[segment[query] * segments + segment[key]]
                && pos <= at
                && window.is_none_or(|window| at - pos < window);
            mask[query * total + key] = !visible;
        }
    }
    mask
}

/// [`AttentionKernels::varlen_causal_attention`] in burn ops: one masked attention per block of
/// segments ([`packed_blocks`]).
pub(super) fn varlen_causal_attention_ops<B: LinearKernels>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    sequences: &PackedSequences,
    scoring: Scoring,
) -> FloatTensor<B> {
    blocked_attention_ops::<B>(q, k, v, sequences, scoring, BLOCK_TOKENS)
}

fn blocked_attention_ops<B: LinearKernels>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    sequences: &PackedSequences,
    scoring: Scoring,
    limit: usize,
) -> FloatTensor<B> {
    let (q, k, v) = (float::<B, 4>(q), float::<B, 4>(k), float::<B, 4>(v));
    let outputs = packed_blocks(sequences, limit)
        .into_iter()
        .map(|(start, block)| {
            let len = block.total();
            let part = |t: &Tensor<B, 4>| t.clone().narrow(2, start, len);
            let mask = packed_mask::<B>(&block, scoring.window, &q.device());
            float::<B, 4>(masked_attention_ops(part(&q), part(&k), part(&v), mask, scoring))
        })
        .collect();
    Tensor::cat(outputs, 1).into_primitive().tensor()
}

/// [`AttentionKernels::varlen_causal_attention_backward`] in burn ops, block by block as the
/// forward ([`varlen_causal_attention_ops`]).
pub(super) fn varlen_causal_attention_backward_ops<B: LinearKernels>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    sequences: &PackedSequences,
    scoring: Scoring,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    blocked_attention_backward_ops::<B>(q, k, v, sequences, scoring, grad, BLOCK_TOKENS)
}

fn blocked_attention_backward_ops<B: LinearKernels>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    sequences: &PackedSequences,
    scoring: Scoring,
    grad: FloatTensor<B>,
    limit: usize,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let (q, k, v, grad) = (
        float::<B, 4>(q),
        float::<B, 4>(k),
        float::<B, 4>(v),
        float::<B, 4>(grad),
    );
    let (mut d_q, mut d_k, mut d_v) = (Vec::new(), Vec::new(), Vec::new());
    for (start, block) in packed_blocks(sequences, limit) {
        let len = block.total();
        let part = |t: &Tensor<B, 4>| t.clone().narrow(2, start, len);
        let mask = packed_mask::<B>(&block, scoring.window, &q.device());
        let grad = grad.clone().narrow(1, start, len);
        let (q, k, v) = masked_attention_backward_ops(part(&q), part(&k), part(&v), mask, scoring, grad);
        d_q.push(float::<B, 4>(q));
        d_k.push(float::<B, 4>(k));
        d_v.push(float::<B, 4>(v));
    }
    let raw = |t: Tensor<B, 4>| t.into_primitive().tensor();
    (
        raw(Tensor::cat(d_q, 2)),
        raw(Tensor::cat(d_k, 2)),
        raw(Tensor::cat(d_v, 2)),
    )
}

/// `true` where a query may not attend: future keys, keys `window` or more positions before
/// it, and padding keys other than itself (a padding query keeps itself so no row is fully
/// masked).
///
/// # Shapes
/// → `[batch, 1, seq, keys]`; queries are the last `seq` of `keys` positions.
pub(super) fn attention_mask<B: burn::tensor::backend::Backend>(
    batch: usize,
    seq: usize,
    keys: usize,
    offset: usize,
    key_padding: Option<Tensor<B, 2, Bool>>,
    window: Option<usize>,
    device: &B::Device,
) -> Tensor<B, 4, Bool> {
    let query_pos = Tensor::<B, 1, Int>::arange(offset as i64..(offset + seq) as i64, device).reshape([1, 1, seq, 1]);
    let key_pos = Tensor::<B, 1, Int>::arange(0..keys as i64, device).reshape([1, 1, 1, keys]);
    let mut future = key_pos.clone().greater(query_pos.clone());
    if let Some(window) = window {
        let before = key_pos.clone().lower_equal(query_pos.clone().sub_scalar(window as i64));
        future = future.bool_or(before);
    }
    let Some(padding) = key_padding else {
        return future.expand([batch, 1, seq, keys]);
    };
    let other = key_pos.not_equal(query_pos);
    let padded = padding.reshape([batch, 1, 1, keys]);
    future
        .expand([batch, 1, seq, keys])
        .bool_or(padded.bool_and(other.expand([batch, 1, seq, keys])))
}

impl AttentionKernels for Flex {
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
        scoring: Scoring,
    ) -> FloatTensor<Self> {
        if q.dtype() != DType::F32 || k.dtype() != DType::F32 || v.dtype() != DType::F32 || generic_ops() {
            return cached_attention_ops::<Self>(q, k, v, offset, padding, scoring);
        }
        let [batch, _, seq, _] = <[usize; 4]>::try_from(dims(&q)).expect("4-D queries");
        let padding = padding.map(|p| p.to_contiguous());
        let padding = padding.as_ref().map(|p| &p.storage::<u8>()[..batch * (offset + seq)]);
        attention(q, k, v, padding, offset, scoring, &Span::padded(batch, seq))
    }

    fn varlen_causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        sequences: &PackedSequences,
        scoring: Scoring,
    ) -> FloatTensor<Self> {
        if [&q, &k, &v].iter().any(|t| t.dtype() != DType::F32) || generic_ops() {
            return varlen_causal_attention_ops::<Self>(q, k, v, sequences, scoring);
        }
        let prefixes = prefix_rows(sequences);
        attention(q, k, v, None, 0, scoring, &Span::packed(sequences, &prefixes))
    }

    fn varlen_causal_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        sequences: &PackedSequences,
        scoring: Scoring,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        if [&q, &k, &v, &grad].iter().any(|t| t.dtype() != DType::F32) || generic_ops() {
            return varlen_causal_attention_backward_ops::<Self>(q, k, v, sequences, scoring, grad);
        }
        let prefixes = prefix_rows(sequences);
        let spans = Span::packed(sequences, &prefixes);
        let trees: Vec<&[Span]> = sequences.trees().into_iter().map(|tree| &spans[tree]).collect();
        attention_backward(q, k, v, None, scoring, grad, &trees)
    }

    fn causal_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        padding: Option<BoolTensor<Self>>,
        scoring: Scoring,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        if [&q, &k, &v, &grad].iter().any(|t| t.dtype() != DType::F32) || generic_ops() {
            return causal_attention_backward_ops::<Self>(q, k, v, padding, scoring, grad);
        }
        let [batch, _, seq, _] = <[usize; 4]>::try_from(dims(&q)).expect("4-D queries");
        let padding = padding.map(|p| p.to_contiguous());
        let padding = padding.as_ref().map(|p| &p.storage::<u8>()[..batch * seq]);
        let spans = Span::padded(batch, seq);
        let trees: Vec<&[Span]> = spans.chunks(1).collect();
        attention_backward(q, k, v, padding, scoring, grad, &trees)
    }
}

/// How the sequences of a whole-sequence attention lie in its inputs.
#[derive(Debug, Clone)]
enum Sequences<B: ReinBackend> {
    /// One per batch entry, with its padding ([`AttentionKernels::causal_attention`]).
    Padded(Option<BoolTensor<B>>),
    /// End to end in one entry ([`AttentionKernels::varlen_causal_attention`]).
    Packed(PackedSequences),
}

impl<B: ReinBackend> Sequences<B> {
    fn attention(&self, q: FloatTensor<B>, k: FloatTensor<B>, v: FloatTensor<B>, scoring: Scoring) -> FloatTensor<B> {
        match self {
            Sequences::Padded(padding) => B::causal_attention(q, k, v, padding.clone(), scoring),
            Sequences::Packed(sequences) => B::varlen_causal_attention(q, k, v, sequences, scoring),
        }
    }

    fn backward(
        self,
        q: FloatTensor<B>,
        k: FloatTensor<B>,
        v: FloatTensor<B>,
        scoring: Scoring,
        grad: FloatTensor<B>,
    ) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
        match self {
            Sequences::Padded(padding) => B::causal_attention_backward(q, k, v, padding, scoring, grad),
            Sequences::Packed(sequences) => B::varlen_causal_attention_backward(q, k, v, &sequences, scoring, grad),
        }
    }
}

/// Whole-sequence attention on the autodiff backend: the inner backend's, with the inner
/// backend's own backward (which recomputes the attention weights instead of keeping them).
fn tracked_attention<B: ReinBackend, C: CheckpointStrategy>(
    q: FloatTensor<Autodiff<B, C>>,
    k: FloatTensor<Autodiff<B, C>>,
    v: FloatTensor<Autodiff<B, C>>,
    sequences: Sequences<B>,
    scoring: Scoring,
) -> FloatTensor<Autodiff<B, C>> {
    #[derive(Debug)]
    struct Attention;

    impl<B: ReinBackend> Backward<B, 3> for Attention {
        /// `q`, `k`, `v`, where the sequences are and how their scores are formed.
        type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, Sequences<B>, Scoring);

        fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
            let (q, k, v, sequences, scoring) = ops.state;
            let grad = grads.consume::<B>(&ops.node);
            let inputs = ops.parents.map(|node| node.map(|n| n.id));
            let (d_q, d_k, d_v) = sequences.backward(q, k, v, scoring, grad);
            register_inputs::<B, 3>(inputs, grads, [d_q, d_k, d_v]);
        }
    }

    match Attention
        .prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let output = sequences.attention(q.primitive.clone(), k.primitive.clone(), v.primitive.clone(), scoring);
            prep.finish((q.primitive, k.primitive, v.primitive, sequences, scoring), output)
        }
        OpsKind::UnTracked(prep) => prep.finish(sequences.attention(q.primitive, k.primitive, v.primitive, scoring)),
    }
}

impl<B: ReinBackend, C: CheckpointStrategy> AttentionKernels for Autodiff<B, C> {
    /// Whole-sequence attention with its own backward ([`AttentionKernels::causal_attention_backward`], which
    /// recomputes the attention weights instead of keeping them).
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        padding: Option<BoolTensor<Self>>,
        scoring: Scoring,
    ) -> FloatTensor<Self> {
        tracked_attention::<B, C>(q, k, v, Sequences::Padded(padding), scoring)
    }

    /// Packed attention with its own backward ([`AttentionKernels::varlen_causal_attention_backward`]).
    fn varlen_causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        sequences: &PackedSequences,
        scoring: Scoring,
    ) -> FloatTensor<Self> {
        tracked_attention::<B, C>(q, k, v, Sequences::Packed(sequences.clone()), scoring)
    }
}
