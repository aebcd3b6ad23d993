//! The innermost loop of a product: an `MR × NR` tile of `C` kept in registers while it runs
//! `kc` steps of its chains of fused multiply-adds (see [`crate::matmul`] for the contract).
//!
//! One generic kernel over fixed-size arrays, which the compiler vectorises with the caller's
//! target features, and intrinsic ones where the compiled tile was slow: AVX2's 6 × 16 (twelve accumulators, two panel loads and one broadcast in the sixteen
//! registers) and AVX-512's `MR` × 32. Written generically, the compiler spilled or scattered
//! those tiles' accumulators (8 GFLOP/s for 6 × 16 on an AMD EPYC, 6–28 for several AVX-512
//! tiles on a Xeon). All compute each element as `fma(a, b, acc)` in the order of `p`: the same
//! bits.

use crate::isa::Isa;

/// `kc` rows of `NR` values of `B`, `stride` apart: packed, or in place.
#[derive(Clone, Copy)]
pub(crate) struct Panel {
    pub(crate) at: *const f32,
    pub(crate) stride: usize,
}

/// Where a micro-kernel's tile of `C` is: `MR` rows of `NR` values, `stride` apart (a tile of
/// `C` itself, or a copy of an edge tile), and whether it starts from their values or from zero.
#[derive(Clone, Copy)]
pub(crate) struct TileAt {
    pub(crate) at: *mut f32,
    pub(crate) stride: usize,
    pub(crate) load: bool,
}

/// The tile of `C` the next micro-kernel will run on: its first `rows` rows (`stride` apart, `NR`
/// values each) are prefetched while this one runs, so that its loads and stores find `C` in
/// the closest cache. A product's `C` is larger than the caches and is visited once per block of
/// the inner dimension: without this, the waits for its tiles cost a third of some products
/// (a 3392 × 576 × 1536 product ran 156 GFLOP/s on a 2-core Xeon where a 576-wide one ran 255).
#[derive(Clone, Copy)]
pub(crate) struct NextTile {
    pub(crate) at: *const f32,
    pub(crate) stride: usize,
    pub(crate) rows: usize,
}

impl NextTile {
    pub(crate) const NONE: NextTile = NextTile {
        at: std::ptr::null(),
        stride: 0,
        rows: 0,
    };

    /// Prefetches cache line `line` of the tile (row by row, `NR / 16` lines a row); one is
    /// asked for at each of the kernel's first steps, so they do not all wait at once.
    #[inline(always)]
    fn prefetch_line<const NR: usize>(&self, line: usize) {
        let per_row = NR.div_ceil(16);
        if line < self.rows * per_row {
            prefetch(
                self.at
                    .wrapping_add((line / per_row) * self.stride + (line % per_row) * 16),
                1,
            );
        }
    }
}

/// `c[i][j] ← fma(a[p][i], b[p][j], c[i][j])` for `p = 0..kc`, in order, over the tile `c`
/// (from zero when it is not loaded). `a` holds `kc` columns of `MR` values; `b` is `kc` rows of
/// `NR` values, `b.stride` apart. `isa`: the product's instruction set (which the CPU has),
/// whose intrinsic kernels the 6 × 16 (AVX2) and `MR` × 32 (AVX-512) tiles run.
///
/// # Safety
/// `b` addresses `kc` readable rows; `c` addresses `MR` rows of `NR` writable values, readable
/// when loaded; the CPU has `isa`.
#[inline(always)]
pub(crate) unsafe fn micro_kernel<const MR: usize, const NR: usize>(
    kc: usize,
    a: &[f32],
    b: Panel,
    c: TileAt,
    next: NextTile,
    isa: Isa,
) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && MR == 6 && NR == 16 {
        // SAFETY: MR and NR checked just above; the CPU has AVX2 and FMA; `b` and `c` as the
        // caller's contract.
        unsafe { avx2_6x16(kc, a, b, c, next) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && NR == 32 {
        // SAFETY: NR checked just above; the CPU has AVX-512F and FMA; `b` and `c` as the
        // caller's contract.
        unsafe { avx512_x32::<MR>(kc, a, b, c, next) };
        return;
    }
    let _ = isa;
    // A local copy, only ever indexed by constants, so it lives in registers.
    let mut acc = [[0.0f32; NR]; MR];
    if c.load {
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: row `i` of the tile (the caller's contract).
            *row = unsafe { *(c.at.add(i * c.stride) as *const [f32; NR]) };
        }
    }
    // A panel read in place has its rows a whole row of `B` apart, each in another page, where
    // the hardware prefetchers do not follow: ask for the rows a few steps ahead.
    let in_place = b.stride != NR;
    for (p, a) in a.chunks_exact(MR).take(kc).enumerate() {
        if in_place {
            prefetch(b.at.wrapping_add((p + PREFETCH_ROWS) * b.stride), NR);
        }
        next.prefetch_line::<NR>(p);
        // SAFETY: row `p < kc` of `b` (the caller's contract).
        let b = unsafe { &*(b.at.add(p * b.stride) as *const [f32; NR]) };
        for i in 0..MR {
            let ai = a[i];
            for j in 0..NR {
                acc[i][j] = ai.mul_add(b[j], acc[i][j]);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        // SAFETY: as the loads.
        unsafe { *(c.at.add(i * c.stride) as *mut [f32; NR]) = *row };
    }
}

/// [`micro_kernel`] for a 6 × 16 tile, in AVX2 intrinsics.
///
/// # Safety
/// As [`micro_kernel`]; the CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_6x16(kc: usize, a: &[f32], b: Panel, c: TileAt, next: NextTile) {
    use std::arch::x86_64::*;
    let a = &a[..6 * kc];
    let in_place = b.stride != 16;
    // SAFETY: the loads and stores of the tile stay inside its rows of 16; those of `a` inside
    // its `6·kc` values; those of `b` inside its `kc` rows (the caller's contract).
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; 6];
        if c.load {
            for (i, acc) in acc.iter_mut().enumerate() {
                let row = c.at.add(i * c.stride);
                *acc = [_mm256_loadu_ps(row), _mm256_loadu_ps(row.add(8))];
            }
        }
        for (p, a) in a.chunks_exact(6).enumerate() {
            if in_place {
                prefetch(b.at.wrapping_add((p + PREFETCH_ROWS) * b.stride), 16);
            }
            next.prefetch_line::<16>(p);
            let row = b.at.add(p * b.stride);
            let (b0, b1) = (_mm256_loadu_ps(row), _mm256_loadu_ps(row.add(8)));
            for (acc, a) in acc.iter_mut().zip(a) {
                let a = _mm256_broadcast_ss(a);
                acc[0] = _mm256_fmadd_ps(a, b0, acc[0]);
                acc[1] = _mm256_fmadd_ps(a, b1, acc[1]);
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            let row = c.at.add(i * c.stride);
            _mm256_storeu_ps(row, acc[0]);
            _mm256_storeu_ps(row.add(8), acc[1]);
        }
    }
}

/// [`micro_kernel`] for an `MR` × 32 tile, in AVX-512 intrinsics: two accumulators a row (24
/// of the 32 registers at twelve rows), two panel loads and a broadcast. Written generically,
/// some of these tiles compiled to 6–27 GFLOP/s a core on a Xeon where this runs 70–130.
///
/// # Safety
/// As [`micro_kernel`]; the CPU has AVX-512F and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn avx512_x32<const MR: usize>(kc: usize, a: &[f32], b: Panel, c: TileAt, next: NextTile) {
    use std::arch::x86_64::*;
    let a = &a[..MR * kc];
    let in_place = b.stride != 32;
    // SAFETY: as in `avx2_6x16`, for rows of 32.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        if c.load {
            for (i, acc) in acc.iter_mut().enumerate() {
                let row = c.at.add(i * c.stride);
                *acc = [_mm512_loadu_ps(row), _mm512_loadu_ps(row.add(16))];
            }
        }
        for (p, a) in a.chunks_exact(MR).enumerate() {
            if in_place {
                prefetch(b.at.wrapping_add((p + PREFETCH_ROWS) * b.stride), 32);
            }
            next.prefetch_line::<32>(p);
            let row = b.at.add(p * b.stride);
            let (b0, b1) = (_mm512_loadu_ps(row), _mm512_loadu_ps(row.add(16)));
            for (acc, a) in acc.iter_mut().zip(a) {
                let a = _mm512_set1_ps(*a);
                acc[0] = _mm512_fmadd_ps(a, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(a, b1, acc[1]);
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            let row = c.at.add(i * c.stride);
            _mm512_storeu_ps(row, acc[0]);
            _mm512_storeu_ps(row.add(16), acc[1]);
        }
    }
}

/// How many rows ahead [`micro_kernel`] prefetches a panel read in place (enough bytes in
/// flight to cover memory's latency at full bandwidth).
const PREFETCH_ROWS: usize = 16;

/// Hints that `len` floats from `at` will be read soon. Never reads them itself (a prefetch
/// does not fault), so `at` may lie past the end of the matrix.
#[inline(always)]
pub(crate) fn prefetch(at: *const f32, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..len).step_by(16) {
        // SAFETY: a prefetch is a hint; it neither faults nor reads into the program.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.wrapping_add(line).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (at, len);
}
