//! The attention kernels' shared steps: a score `q·k`, a running softmax over the keys one unit
//! visits, and the merge of the units' running softmaxes in unit order (so the result has the
//! same bits on every run).

use cubecl::prelude::*;

/// `s = q·k · scale` with `k` at `k_row`, soft-capped where `softcap > 0`; and the cap's slope
/// `1 − (s/c)²` (1 without one).
#[cube]
pub(super) fn score<F: Float>(
    query: &Array<f32>,
    k: &Tensor<F>,
    k_row: usize,
    scale: f32,
    softcap: f32,
    #[comptime] dim: usize,
) -> (f32, f32) {
    let mut s = 0.0f32;
    for d in 0..dim {
        s += query[d] * f32::cast_from(k[k_row + d * k.stride(3)]);
    }
    s *= scale;
    let mut slope = 1.0f32;
    if softcap > 0.0f32 {
        s = softcap * f32::tanh(s / softcap);
        slope = 1.0f32 - (s / softcap) * (s / softcap);
    }
    (s, slope)
}

/// A running softmax's start: `state = [m, l, ·]` with `m` below any score, `acc = 0`.
#[cube]
pub(super) fn start_softmax(state: &mut Array<f32>, acc: &mut Array<f32>, #[comptime] dim: usize) {
    state[0] = f32::new(-3.0e38);
    state[1] = 0.0f32;
    state[2] = 0.0f32;
    for d in 0..dim {
        acc[d] = 0.0f32;
    }
}

/// One key into a running softmax `state = [m, l]`, `acc = Σ exp(s − m) v` (the value at
/// `v_row`): both rescaled where the score `s` raises the maximum `m`.
#[cube]
pub(super) fn softmax_step<F: Float>(
    s: f32,
    v: &Tensor<F>,
    v_row: usize,
    state: &mut Array<f32>,
    acc: &mut Array<f32>,
    #[comptime] dim: usize,
) {
    let grown = select(s > state[0], s, state[0]);
    let rescale = f32::exp(state[0] - grown);
    let weight = f32::exp(s - grown);
    state[1] = state[1] * rescale + weight;
    for d in 0..dim {
        acc[d] = acc[d] * rescale + weight * f32::cast_from(v[v_row + d * v.stride(3)]);
    }
    state[0] = grown;
}

/// The units' running softmaxes (`maxima`, `sums`) merged in unit order: `(max, Σ l e^{m − max})`,
/// with each unit's factor `e^{m − max}` left in `maxima` for the caller.
#[cube]
pub(super) fn merge_softmax(
    maxima: &mut SharedMemory<f32>,
    sums: &SharedMemory<f32>,
    #[comptime] units: usize,
) -> (f32, f32) {
    let mut top = f32::new(-3.0e38);
    for w in 0..units {
        top = select(maxima[w] > top, maxima[w], top);
    }
    let mut norm = 0.0f32;
    for w in 0..units {
        norm += sums[w] * f32::exp(maxima[w] - top);
    }
    sync_cube();
    if UNIT_POS_X == 0 {
        for w in 0..units {
            maxima[w] = f32::exp(maxima[w] - top);
        }
    }
    sync_cube();
    (top, norm)
}

/// Merges every unit's running softmax (`state = [m, l]`, `acc`) and writes `softmax · v`,
/// `dim` values, at `out_row` of `out`.
#[cube]
pub(super) fn write_softmax<F: Float>(
    state: &Array<f32>,
    acc: &Array<f32>,
    out: &mut Tensor<F>,
    out_row: usize,
    #[comptime] dim: usize,
    #[comptime] units: usize,
) {
    let unit = UNIT_POS_X as usize;
    let mut maxima = SharedMemory::<f32>::new(units);
    let mut sums = SharedMemory::<f32>::new(units);
    let mut partials = SharedMemory::<f32>::new(comptime!(units * dim));
    maxima[unit] = state[0];
    sums[unit] = state[1];
    for d in 0..dim {
        partials[unit * dim + d] = acc[d];
    }
    sync_cube();
    let (_, norm) = merge_softmax(&mut maxima, &sums, units);
    let mut d = unit;
    while d < dim {
        let mut sum = 0.0f32;
        for w in 0..units {
            sum += partials[w * dim + d] * maxima[w];
        }
        out[out_row + d] = F::cast_from(sum / norm);
        d += units;
    }
}
