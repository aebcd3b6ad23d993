//! Interleaving `W` contiguous streams into one array, `dst[p·W + s] = stream_s[p]`: how a
//! product packs the rows of a row-major `A` into `MR`-high panels, and the columns of a
//! column-major `B` (a transposed weight) into `NR`-wide ones.
//!
//! Element by element this is a strided store per value; the vector path moves blocks of 8
//! streams × 8 steps through registers with the classic 8 × 8 transpose (and 4- and 2-stream
//! remainders), which measured several times faster on the SmolLM2 training products. Copying
//! never changes a value, so both give the same array.

/// `dst[p·W + s] = streams[s][p]` for `p < len`, and zero for `s ≥ streams.len()` (a panel's
/// rows or columns past the matrix's edge). `wide`: whether the CPU has AVX2 (the vector path).
///
/// # Safety
/// Each stream addresses `len` readable values; `dst` holds `len·W` values.
#[inline(always)]
pub(crate) unsafe fn interleave<const W: usize>(dst: &mut [f32], streams: &[*const f32], len: usize, wide: bool) {
    debug_assert!(streams.len() <= W && dst.len() >= len * W);
    #[cfg(target_arch = "x86_64")]
    if wide && streams.len() == W {
        // SAFETY: the CPU has AVX (with AVX2); the rest is the caller's contract.
        return unsafe { interleave_avx::<W>(dst, streams, len) };
    }
    let _ = wide;
    for (s, &stream) in streams.iter().enumerate() {
        // SAFETY: the caller's contract.
        let stream = unsafe { std::slice::from_raw_parts(stream, len) };
        for (p, &v) in stream.iter().enumerate() {
            dst[p * W + s] = v;
        }
    }
    for s in streams.len()..W {
        dst[..len * W].iter_mut().skip(s).step_by(W).for_each(|v| *v = 0.0);
    }
}

/// [`interleave`] of exactly `W` streams: groups of 8, then 4, then 2 streams through register
/// transposes, 8 steps at a time; a last odd stream and the last `len % 8` steps one by one.
///
/// # Safety
/// As [`interleave`]; the CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn interleave_avx<const W: usize>(dst: &mut [f32], streams: &[*const f32], len: usize) {
    use std::arch::x86_64::*;
    let body = len / 8 * 8;
    let out = dst.as_mut_ptr();
    let mut s = 0;
    // SAFETY (every load and store below): loads read steps `p..p + 8 ≤ len` of streams
    // `s.. < W`; stores write `dst[(p + q)·W + s..]` for `q < 8` and at most `W − s` values, inside
    // `len·W` (the caller's contract).
    unsafe {
        while s + 8 <= W {
            for p in (0..body).step_by(8) {
                let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(streams[s + i].add(p)));
                let t = transpose8(r);
                for (q, t) in t.iter().enumerate() {
                    _mm256_storeu_ps(out.add((p + q) * W + s), *t);
                }
            }
            s += 8;
        }
        if s + 4 <= W {
            for p in (0..body).step_by(8) {
                let r: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(streams[s + i].add(p)));
                // Pairs, then quadruples: lane q of each 128-bit half holds step q (or q + 4).
                let (a, b) = (_mm256_unpacklo_ps(r[0], r[1]), _mm256_unpackhi_ps(r[0], r[1]));
                let (c, d) = (_mm256_unpacklo_ps(r[2], r[3]), _mm256_unpackhi_ps(r[2], r[3]));
                let steps = [
                    _mm256_shuffle_ps::<0x44>(a, c),
                    _mm256_shuffle_ps::<0xEE>(a, c),
                    _mm256_shuffle_ps::<0x44>(b, d),
                    _mm256_shuffle_ps::<0xEE>(b, d),
                ];
                for (q, v) in steps.iter().enumerate() {
                    _mm_storeu_ps(out.add((p + q) * W + s), _mm256_castps256_ps128(*v));
                    _mm_storeu_ps(out.add((p + q + 4) * W + s), _mm256_extractf128_ps::<1>(*v));
                }
            }
            s += 4;
        }
        if s + 2 <= W {
            for p in (0..body).step_by(8) {
                let (x, y) = (
                    _mm256_loadu_ps(streams[s].add(p)),
                    _mm256_loadu_ps(streams[s + 1].add(p)),
                );
                // Lanes (x_q, y_q): steps 0, 1, 4, 5 in `lo`, 2, 3, 6, 7 in `hi`.
                let (lo, hi) = (_mm256_unpacklo_ps(x, y), _mm256_unpackhi_ps(x, y));
                for (v, steps) in [(lo, [0, 1, 4, 5]), (hi, [2, 3, 6, 7])] {
                    let (low, high) = (_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                    let (low, high) = (_mm_castps_pd(low), _mm_castps_pd(high));
                    _mm_storel_pd(out.add((p + steps[0]) * W + s).cast(), low);
                    _mm_storeh_pd(out.add((p + steps[1]) * W + s).cast(), low);
                    _mm_storel_pd(out.add((p + steps[2]) * W + s).cast(), high);
                    _mm_storeh_pd(out.add((p + steps[3]) * W + s).cast(), high);
                }
            }
            s += 2;
        }
        for (s, stream) in streams.iter().enumerate().skip(s) {
            for p in 0..body {
                *out.add(p * W + s) = *stream.add(p);
            }
        }
        for p in body..len {
            for (s, stream) in streams.iter().enumerate() {
                *out.add(p * W + s) = *stream.add(p);
            }
        }
    }
}

/// The transpose of 8 rows of 8: element `q` of row `i` becomes element `i` of row `q`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
fn transpose8(r: [std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    let a = [
        _mm256_unpacklo_ps(r[0], r[1]),
        _mm256_unpackhi_ps(r[0], r[1]),
        _mm256_unpacklo_ps(r[2], r[3]),
        _mm256_unpackhi_ps(r[2], r[3]),
        _mm256_unpacklo_ps(r[4], r[5]),
        _mm256_unpackhi_ps(r[4], r[5]),
        _mm256_unpacklo_ps(r[6], r[7]),
        _mm256_unpackhi_ps(r[6], r[7]),
    ];
    let b = [
        _mm256_shuffle_ps::<0x44>(a[0], a[2]),
        _mm256_shuffle_ps::<0xEE>(a[0], a[2]),
        _mm256_shuffle_ps::<0x44>(a[1], a[3]),
        _mm256_shuffle_ps::<0xEE>(a[1], a[3]),
        _mm256_shuffle_ps::<0x44>(a[4], a[6]),
        _mm256_shuffle_ps::<0xEE>(a[4], a[6]),
        _mm256_shuffle_ps::<0x44>(a[5], a[7]),
        _mm256_shuffle_ps::<0xEE>(a[5], a[7]),
    ];
    [
        _mm256_permute2f128_ps::<0x20>(b[0], b[4]),
        _mm256_permute2f128_ps::<0x20>(b[1], b[5]),
        _mm256_permute2f128_ps::<0x20>(b[2], b[6]),
        _mm256_permute2f128_ps::<0x20>(b[3], b[7]),
        _mm256_permute2f128_ps::<0x31>(b[0], b[4]),
        _mm256_permute2f128_ps::<0x31>(b[1], b[5]),
        _mm256_permute2f128_ps::<0x31>(b[2], b[6]),
        _mm256_permute2f128_ps::<0x31>(b[3], b[7]),
    ]
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn check<const W: usize>(streams: usize, len: usize, wide: bool) {
        let data: Vec<Vec<f32>> = (0..streams)
            .map(|s| (0..len).map(|p| (s * 1000 + p) as f32 + 0.5).collect())
            .collect();
        let pointers: Vec<*const f32> = data.iter().map(|d| d.as_ptr()).collect();
        let mut dst = vec![f32::NAN; len * W];
        // SAFETY: each stream holds `len` values; `dst` holds `len·W`.
        unsafe { interleave::<W>(&mut dst, &pointers, len, wide) };
        for p in 0..len {
            for s in 0..W {
                let expected = if s < streams { data[s][p] } else { 0.0 };
                assert_eq!(
                    dst[p * W + s].to_bits(),
                    expected.to_bits(),
                    "W {W}, stream {s}, step {p}"
                );
            }
        }
    }

    proptest! {
        #[test]
        fn every_width_interleaves_its_streams(len in 0usize..70, missing in 0usize..3, wide: bool) {
            let wide = wide && crate::Isa::Avx2.is_available();
            check::<1>(1 - missing.min(1), len, wide);
            check::<2>(2 - missing.min(2), len, wide);
            check::<4>(4 - missing, len, wide);
            check::<6>(6 - missing, len, wide);
            check::<8>(8 - missing, len, wide);
            check::<12>(12 - missing, len, wide);
            check::<16>(16 - missing, len, wide);
            check::<32>(32 - missing, len, wide);
        }
    }
}
