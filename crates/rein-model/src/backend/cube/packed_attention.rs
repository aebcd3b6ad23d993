//! Causal attention of packed sequences (training and scoring: [`PackedSequences`] end to end
//! in one row, shared prefixes stored once) on CubeCL backends, and its backward, without one
//! launch per sequence or per block: one launch forward, two backward.
//!
//! - forward: one cube per query row `(head, token)`; its units split the keys the token sees
//!   (its own segment up to it, then each ancestor segment whole, walking up the tree), each
//!   keeping a running softmax, merged in unit order.
//! - backward, as FlashAttention-2 orders it: per query row, the softmax's `log Σ exp` and
//!   `D = Σⱼ Pⱼ ∂Pⱼ` (one walk over its keys), then `∂q = scale Σⱼ ∂Sⱼ kⱼ` (a second) (`∂Sⱼ = Pⱼ (∂Pⱼ − D)`, through the cap where
//!   there is one); per key row `(kv head, token)`, `∂k` and `∂v` summed over the queries that
//!   see it (its own segment after it and every descendant segment) and the query heads sharing
//!   it. No atomics: every sum has one owner and a fixed order.
//!
//! Every `P` is recomputed from `q·k`, never stored: no `[heads, tokens, tokens]` tensor exists.

use burn::tensor::TensorMetadata;
use burn::tensor::{DType, Int, TensorData};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::calculate_cube_count_elemwise;
use cubecl::prelude::*;

use super::softmax::{merge_softmax, score, softmax_step, start_softmax, write_softmax};
use super::{count_launch, empty_like};
use crate::backend::{PackedSequences, Scoring};

/// Units per cube for rows of `dim` values: each keeps one or two `dim`-long partial sums, and
/// the cube merges them in shared memory (at most 16 KiB).
fn units_for(dim: usize) -> usize {
    match dim {
        0..=64 => 32,
        65..=128 => 16,
        _ => 8,
    }
}

/// Where the segments lie, for the kernels (one upload): each token's segment and its position
/// in its sequence, then per segment its first token, its length, its parent plus one (0 for
/// none) and the end of its tree (the first segment after it that is not its descendant or
/// a later sibling's: `PackedSequences::trees`).
fn layout(sequences: &PackedSequences) -> Vec<i32> {
    let (lengths, parents) = (sequences.lengths(), sequences.parents());
    let starts = sequences.starts();
    let mut tree_end = vec![0usize; lengths.len()];
    for tree in sequences.trees() {
        for s in tree.clone() {
            tree_end[s] = tree.end;
        }
    }
    let mut out: Vec<i32> = lengths
        .iter()
        .enumerate()
        .flat_map(|(s, &len)| std::iter::repeat_n(s as i32, len))
        .collect();
    out.extend(sequences.positions().iter().map(|&p| p as i32));
    for s in 0..lengths.len() {
        out.extend([
            starts[s] as i32,
            lengths[s] as i32,
            parents[s].map_or(0, |p| p as i32 + 1),
            tree_end[s] as i32,
        ]);
    }
    out
}

/// Whether the token at position `key_at` is inside the window of the one at `query_at`.
#[cube]
fn in_window(query_at: u32, key_at: u32, window: u32) -> bool {
    window == 0u32 || key_at + window > query_at
}

/// What [`visit_keys`] does with each key a query sees.
const FORWARD: u32 = 0;
/// The softmax's running maximum and sum, and `Σ exp(s − m) ∂P` (for `D`).
const STATS: u32 = 1;
/// `acc += ∂S kⱼ`, from the softmax's `log Σ exp` and `D`.
const GRAD_Q: u32 = 2;

/// Visits this unit's share of the keys token `t` sees (its own segment up to `t`, then each
/// ancestor segment whole, walking up the tree; every `units`-th key), for query row `query`:
/// - `FORWARD`: running softmax `state = [m, l]` and `acc = Σ exp(s − m) v`;
/// - `STATS`: `state = [m, l, Σ exp(s − m) ∂P]` with `∂Pⱼ = ∂o · vⱼ`;
/// - `GRAD_Q`: `acc += ∂Sⱼ kⱼ`, `∂Sⱼ = Pⱼ (∂Pⱼ − D)` through the cap, `Pⱼ = exp(sⱼ − lse)`.
#[cube]
fn visit_keys<F: Float, I: Numeric>(
    query: &Array<f32>,
    d_out: &Array<f32>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    layout: &Tensor<I>,
    t: usize,
    kv_head: usize,
    state: &mut Array<f32>,
    acc: &mut Array<f32>,
    lse: f32,
    big_d: f32,
    scale: f32,
    window: u32,
    softcap: f32,
    #[comptime] dim: usize,
    #[comptime] units: usize,
    #[comptime] mode: u32,
) {
    let total = k.shape(2);
    let unit = UNIT_POS_X as usize;
    let query_at = u32::cast_from(layout[total + t]);
    // The segment being visited, plus one (0: past the root).
    let mut next = u32::cast_from(layout[t]) as usize + 1;
    let mut end = t + 1;
    while next > 0 {
        let at = 2 * total + 4 * (next - 1);
        let mut u = u32::cast_from(layout[at]) as usize + unit;
        while u < end {
            if in_window(query_at, u32::cast_from(layout[total + u]), window) {
                let (s, slope) = score::<F>(query, k, kv_head * k.stride(1) + u * k.stride(2), scale, softcap, dim);
                let v_row = kv_head * v.stride(1) + u * v.stride(2);
                if comptime!(mode == GRAD_Q) {
                    let mut d_p = 0.0f32;
                    for d in 0..dim {
                        d_p += d_out[d] * f32::cast_from(v[v_row + d * v.stride(3)]);
                    }
                    let d_s = f32::exp(s - lse) * (d_p - big_d) * slope;
                    let k_row = kv_head * k.stride(1) + u * k.stride(2);
                    for d in 0..dim {
                        acc[d] += d_s * f32::cast_from(k[k_row + d * k.stride(3)]);
                    }
                } else if comptime!(mode == FORWARD) {
                    softmax_step::<F>(s, v, v_row, state, acc, dim);
                } else {
                    // `Σ exp(s − m) ∂P` rescales with the maximum as `l` does.
                    let mut d_p = 0.0f32;
                    for d in 0..dim {
                        d_p += d_out[d] * f32::cast_from(v[v_row + d * v.stride(3)]);
                    }
                    let grown = select(s > state[0], s, state[0]);
                    let (rescale, weight) = (f32::exp(state[0] - grown), f32::exp(s - grown));
                    state[1] = state[1] * rescale + weight;
                    state[2] = state[2] * rescale + weight * d_p;
                    state[0] = grown;
                }
            }
            u += units;
        }
        next = u32::cast_from(layout[at + 2]) as usize;
        if next > 0 {
            let parent = 2 * total + 4 * (next - 1);
            end = u32::cast_from(layout[parent]) as usize + u32::cast_from(layout[parent + 1]) as usize;
        }
    }
}

/// Loads row `(h, t)` of `x` (`[1, heads, total, dim]`, or with `token_major` the output's
/// layout `[1, total, heads, dim]`) into `row`, in f32.
#[cube]
fn load_row<F: Float>(
    x: &Tensor<F>,
    h: usize,
    t: usize,
    row: &mut Array<f32>,
    #[comptime] dim: usize,
    #[comptime] token_major: bool,
) {
    let mut base = h * x.stride(1) + t * x.stride(2);
    if comptime!(token_major) {
        base = t * x.stride(1) + h * x.stride(2);
    }
    for d in 0..dim {
        row[d] = f32::cast_from(x[base + d * x.stride(3)]);
    }
}

/// Forward: one cube per query row `r = head · total + t`; `out` is `[1, total, heads, dim]`.
#[cube(launch)]
fn packed_attention_kernel<F: Float, I: Numeric>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    layout: &Tensor<I>,
    out: &mut Tensor<F>,
    scale: f32,
    window: u32,
    softcap: f32,
    #[comptime] dim: usize,
    #[comptime] units: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let (heads, total) = (q.shape(1), q.shape(2));
    let row = CUBE_POS;
    if row >= heads * total {
        terminate!();
    }
    let (h, t) = (row / total, row % total);
    let kv_head = h / (heads / k.shape(1));
    let mut query = Array::<f32>::new(dim);
    load_row::<F>(q, h, t, &mut query, dim, false);
    let mut state = Array::<f32>::new(3usize);
    let mut acc = Array::<f32>::new(dim);
    start_softmax(&mut state, &mut acc, dim);
    visit_keys::<F, I>(
        &query, &query, k, v, layout, t, kv_head, &mut state, &mut acc, 0.0f32, 0.0f32, scale, window, softcap, dim,
        units, FORWARD,
    );
    write_softmax::<F>(&state, &acc, out, (t * heads + h) * dim, dim, units);
}

/// Backward, per query row `r = head · total + t`: `stats[r] = [log Σ exp, D]` and
/// `d_q[h, t] = scale Σⱼ ∂Sⱼ kⱼ`.
#[cube(launch)]
fn packed_attention_grad_q_kernel<F: Float, I: Numeric>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    grad: &Tensor<F>,
    layout: &Tensor<I>,
    stats: &mut Tensor<f32>,
    d_q: &mut Tensor<F>,
    scale: f32,
    window: u32,
    softcap: f32,
    #[comptime] dim: usize,
    #[comptime] units: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let (heads, total) = (q.shape(1), q.shape(2));
    let row = CUBE_POS;
    if row >= heads * total {
        terminate!();
    }
    let unit = UNIT_POS_X as usize;
    let (h, t) = (row / total, row % total);
    let kv_head = h / (heads / k.shape(1));
    let mut query = Array::<f32>::new(dim);
    load_row::<F>(q, h, t, &mut query, dim, false);
    let mut d_out = Array::<f32>::new(dim);
    load_row::<F>(grad, h, t, &mut d_out, dim, true);
    let mut state = Array::<f32>::new(3usize);
    let mut acc = Array::<f32>::new(dim);
    start_softmax(&mut state, &mut acc, dim);
    visit_keys::<F, I>(
        &query, &d_out, k, v, layout, t, kv_head, &mut state, &mut acc, 0.0f32, 0.0f32, scale, window, softcap, dim,
        units, STATS,
    );
    let mut maxima = SharedMemory::<f32>::new(units);
    let mut sums = SharedMemory::<f32>::new(units);
    let mut partials = SharedMemory::<f32>::new(comptime!(units * dim));
    maxima[unit] = state[0];
    sums[unit] = state[1];
    partials[unit] = state[2];
    sync_cube();
    let (top, norm) = merge_softmax(&mut maxima, &sums, units);
    let mut weighted = 0.0f32;
    for w in 0..units {
        weighted += partials[w] * maxima[w];
    }
    let lse = top + f32::ln(norm);
    let big_d = weighted / norm;
    sync_cube();
    visit_keys::<F, I>(
        &query, &d_out, k, v, layout, t, kv_head, &mut state, &mut acc, lse, big_d, scale, window, softcap, dim, units,
        GRAD_Q,
    );
    for d in 0..dim {
        partials[unit * dim + d] = acc[d];
    }
    sync_cube();
    let q_row = (h * total + t) * dim;
    let mut d = unit;
    while d < dim {
        let mut sum = 0.0f32;
        for w in 0..units {
            sum += partials[w * dim + d];
        }
        d_q[q_row + d] = F::cast_from(scale * sum);
        d += units;
    }
    if unit == 0 {
        stats[2 * row] = lse;
        stats[2 * row + 1] = big_d;
    }
}

/// Adds query row `(h, t)`'s share to key `key`'s gradients: `∂v += P ∂o` and `∂k += ∂S q`
/// (unscaled), `P = exp(s − lse)`, `∂S = P (∂o·v − D)` through the cap, with `[lse, D]` the
/// row's `stats`.
#[cube]
fn key_grads_from<F: Float>(
    q: &Tensor<F>,
    grad: &Tensor<F>,
    stats: &Tensor<f32>,
    key: &Array<f32>,
    value: &Array<f32>,
    h: usize,
    t: usize,
    acc_k: &mut Array<f32>,
    acc_v: &mut Array<f32>,
    scale: f32,
    softcap: f32,
    #[comptime] dim: usize,
) {
    let q_row = h * q.stride(1) + t * q.stride(2);
    let o_row = t * grad.stride(1) + h * grad.stride(2);
    // q·k is symmetric: the key is the local row, the query the one read in place.
    let (s, slope) = score::<F>(key, q, q_row, scale, softcap, dim);
    let mut d_p = 0.0f32;
    for d in 0..dim {
        d_p += f32::cast_from(grad[o_row + d * grad.stride(3)]) * value[d];
    }
    let r = h * q.shape(2) + t;
    let p = f32::exp(s - stats[2 * r]);
    let d_s = p * (d_p - stats[2 * r + 1]) * slope;
    for d in 0..dim {
        acc_v[d] += p * f32::cast_from(grad[o_row + d * grad.stride(3)]);
        acc_k[d] += d_s * f32::cast_from(q[q_row + d * q.stride(3)]);
    }
}

/// Backward, per key row `r = kv_head · total + u`: `∂k[g, u] = scale Σ ∂S q` and
/// `∂v[g, u] = Σ P ∂o`, over the queries that see key `u` (its own segment from `u` on, then
/// every descendant segment) and the query heads sharing key/value head `g`.
#[cube(launch)]
fn packed_attention_grad_kv_kernel<F: Float, I: Numeric>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    grad: &Tensor<F>,
    layout: &Tensor<I>,
    stats: &Tensor<f32>,
    d_k: &mut Tensor<F>,
    d_v: &mut Tensor<F>,
    scale: f32,
    window: u32,
    softcap: f32,
    #[comptime] dim: usize,
    #[comptime] units: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let (heads, total, kv_heads) = (q.shape(1), q.shape(2), k.shape(1));
    let row = CUBE_POS;
    if row >= kv_heads * total {
        terminate!();
    }
    let unit = UNIT_POS_X as usize;
    let (g, u) = (row / total, row % total);
    let group = heads / kv_heads;
    let mut key = Array::<f32>::new(dim);
    load_row::<F>(k, g, u, &mut key, dim, false);
    let mut value = Array::<f32>::new(dim);
    load_row::<F>(v, g, u, &mut value, dim, false);
    let mut acc_k = Array::<f32>::new(dim);
    let mut acc_v = Array::<f32>::new(dim);
    for d in 0..dim {
        acc_k[d] = 0.0f32;
        acc_v[d] = 0.0f32;
    }
    let key_at = u32::cast_from(layout[total + u]);
    let own = u32::cast_from(layout[u]) as usize;
    let tree_end = u32::cast_from(layout[2 * total + 4 * own + 3]) as usize;
    // The key's own segment from it on, then each later segment of its tree that descends
    // from it.
    let mut segment = own;
    while segment < tree_end {
        let at = 2 * total + 4 * segment;
        let mut descends = segment == own;
        // Up the tree from the segment's parent (plus one) until the key's segment or above it.
        let mut up = u32::cast_from(layout[at + 2]) as usize;
        while !descends && up > own {
            descends = up == own + 1;
            up = u32::cast_from(layout[2 * total + 4 * (up - 1) + 2]) as usize;
        }
        if descends {
            let start = u32::cast_from(layout[at]) as usize;
            let end = start + u32::cast_from(layout[at + 1]) as usize;
            let mut t = select(segment == own, u, start) + unit;
            while t < end {
                if in_window(u32::cast_from(layout[total + t]), key_at, window) {
                    for j in 0..group {
                        let h = g * group + j;
                        key_grads_from::<F>(
                            q, grad, stats, &key, &value, h, t, &mut acc_k, &mut acc_v, scale, softcap, dim,
                        );
                    }
                }
                t += units;
            }
        }
        segment += 1;
    }
    let mut partials = SharedMemory::<f32>::new(comptime!(2 * units * dim));
    for d in 0..dim {
        partials[unit * dim + d] = acc_k[d];
        partials[(units + unit) * dim + d] = acc_v[d];
    }
    sync_cube();
    let out_row = (g * total + u) * dim;
    let mut d = unit;
    while d < dim {
        let mut sum_k = 0.0f32;
        let mut sum_v = 0.0f32;
        for w in 0..units {
            sum_k += partials[w * dim + d];
            sum_v += partials[(units + w) * dim + d];
        }
        d_k[out_row + d] = F::cast_from(scale * sum_k);
        d_v[out_row + d] = F::cast_from(sum_v);
        d += units;
    }
}

/// The layout of `sequences` on `like`'s device, in the backend's int type.
fn upload_layout<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    sequences: &PackedSequences,
    like: &CubeTensor<R>,
) -> CubeTensor<R> {
    let values = layout(sequences);
    let len = values.len();
    burn::tensor::Tensor::<CubeBackend<R, F, I, BT>, 1, Int>::from_data(TensorData::new(values, [len]), &like.device)
        .into_primitive()
}

/// [`crate::backend::AttentionKernels::varlen_causal_attention`] in one launch.
pub(super) fn packed_attention<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    sequences: &PackedSequences,
    scoring: Scoring,
) -> CubeTensor<R> {
    let [_, heads, total, dim] = q.shape().dims::<4>();
    let out = empty_like(&q, [1, total, heads, dim].into());
    if heads * total == 0 || dim == 0 {
        return out;
    }
    let layout = upload_layout::<R, F, I, BT>(sequences, &q);
    let client = q.client.clone();
    let units = units_for(dim);
    let dtypes = [q.dtype.into(), layout.dtype.into()];
    count_launch();
    packed_attention_kernel::launch::<R>(
        &client,
        calculate_cube_count_elemwise(&client, heads * total, CubeDim::new_1d(1)),
        CubeDim::new_1d(units as u32),
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        layout.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        scoring.scale,
        scoring.window.map_or(0, |w| w as u32),
        scoring.softcap.unwrap_or(0.0),
        dim,
        units,
        dtypes,
    );
    out
}

/// [`crate::backend::AttentionKernels::varlen_causal_attention_backward`] in two launches.
pub(super) fn packed_attention_backward<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    sequences: &PackedSequences,
    scoring: Scoring,
    grad: CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let [_, heads, total, dim] = q.shape().dims::<4>();
    let kv_heads = k.shape()[1];
    let (d_q, d_k, d_v) = (
        empty_like(&q, q.shape()),
        empty_like(&k, k.shape()),
        empty_like(&v, v.shape()),
    );
    if heads * total == 0 || dim == 0 {
        return (d_q, d_k, d_v);
    }
    let layout = upload_layout::<R, F, I, BT>(sequences, &q);
    let client = q.client.clone();
    let stats = empty_device_contiguous_dtype(client.clone(), q.device.clone(), [heads * total, 2].into(), DType::F32);
    let units = units_for(dim);
    let dtypes = [q.dtype.into(), layout.dtype.into()];
    let (scale, window, softcap) = (
        scoring.scale,
        scoring.window.map_or(0, |w| w as u32),
        scoring.softcap.unwrap_or(0.0),
    );
    count_launch();
    packed_attention_grad_q_kernel::launch::<R>(
        &client,
        calculate_cube_count_elemwise(&client, heads * total, CubeDim::new_1d(1)),
        CubeDim::new_1d(units as u32),
        q.clone().into_tensor_arg(),
        k.clone().into_tensor_arg(),
        v.clone().into_tensor_arg(),
        grad.clone().into_tensor_arg(),
        layout.clone().into_tensor_arg(),
        stats.clone().into_tensor_arg(),
        d_q.clone().into_tensor_arg(),
        scale,
        window,
        softcap,
        dim,
        units,
        dtypes,
    );
    count_launch();
    packed_attention_grad_kv_kernel::launch::<R>(
        &client,
        calculate_cube_count_elemwise(&client, kv_heads * total, CubeDim::new_1d(1)),
        CubeDim::new_1d(units as u32),
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        grad.into_tensor_arg(),
        layout.into_tensor_arg(),
        stats.into_tensor_arg(),
        d_k.clone().into_tensor_arg(),
        d_v.clone().into_tensor_arg(),
        scale,
        window,
        softcap,
        dim,
        units,
        dtypes,
    );
    (d_q, d_k, d_v)
}
