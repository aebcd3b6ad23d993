//! Products small enough that packing costs more than it saves: the MLPs of classic control (a
//! batch of 256 rows through 64-unit layers), whose operands all sit in the closest caches.
//!
//! `B` is read in place when its rows are contiguous and copied once, transposed, when they are
//! not (`∂X = ∂Y·Wᵀ`: a few thousand values); `A` is never copied: each step broadcasts `A[i][p]`
//! from wherever it is, so a transposed `A` (`∂W = Xᵀ·∂Y`) costs nothing either. A tile of
//! `MR` rows by up to four vectors of `C` stays in registers for all `k` steps, loaded once and
//! stored once. Products of one to four columns (a critic's value, a policy's head) put rows of
//! `C` in the lanes instead ([`narrow_avx512`]). Each element is still one chain of fused
//! multiply-adds in the order of `p` from its starting value (the contract in [`crate::matmul`]),
//! so the bits are those of the packed path on every instruction set.
//!
//! Measured on a 2-core Xeon (AVX-512), one core (`examples/small_speed.rs`): a 256 × 64 × 64
//! product 81–88 GFLOP/s packed, 110–128 unpacked; `256 × 64 · 64 × 1` 4.7 µs packed, 2.2 µs
//! narrow; the products of one 64-unit MLP layer of each kind 104 µs → 54–58 µs.

use crate::isa::Isa;
use crate::mat_ref::MatRef;

/// Multiply-adds up to which a product runs unpacked (the products under it are not split
/// across threads either: see `PARALLEL_WORK` in [`crate::matmul`]).
const MAX_WORK: usize = 1 << 21;
/// Elements of `B` up to which a product runs unpacked (256 KiB: within a core's L2 cache, so
/// every tile reads `B` from there).
const MAX_B: usize = 1 << 16;

/// Columns up to which a product with AVX-512 runs [narrow](narrow_avx512): rows in the
/// lanes.
const MAX_NARROW: usize = 4;

/// Whether `a · b` (`m × k · k × n`) runs unpacked on `isa`: an instruction set with vectors, a
/// small product, and at least one whole vector of columns (narrower products waste most of each
/// vector) or, with AVX-512, at most [`MAX_NARROW`] columns and an `A` whose rows or columns are
/// contiguous.
pub(crate) fn suits(isa: Isa, a: &MatRef<'_>, b: &MatRef<'_>) -> bool {
    let ([m, k], n) = (a.shape(), b.shape()[1]);
    let lanes = match isa {
        Isa::Scalar => return false,
        Isa::Avx2 => 8,
        Isa::Avx512 => 16,
    };
    let narrow = isa == Isa::Avx512 && n <= MAX_NARROW && m >= lanes && (a.col_stride == 1 || a.row_stride == 1);
    cfg!(target_arch = "x86_64") && (n >= lanes || narrow) && k * n <= MAX_B && m * k * n <= MAX_WORK
}

/// What each row of `C` starts from: zero, its current values, or a row of biases.
#[derive(Clone, Copy)]
pub(crate) enum Start<'a> {
    Zero,
    Current,
    Rows(&'a [f32]),
}

thread_local! {
    /// Each thread's copy of a transposed `B`, kept between products.
    static B_ROWS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `C ← C₀ + A·B`, `C₀` as `start` says, for the product [`suits`] accepted.
///
/// # Safety
/// `c` addresses `m` rows of `n` writable values, `ldc` apart; `isa` is available on this CPU and
/// [`suits`] accepted the shapes.
pub(crate) unsafe fn product(isa: Isa, c: *mut f32, ldc: usize, a: MatRef<'_>, b: MatRef<'_>, start: Start<'_>) {
    let n = b.shape()[1];
    #[cfg(target_arch = "x86_64")]
    if n < 16 && isa == Isa::Avx512 {
        // SAFETY: the caller's contract; `suits` accepted `A`'s layout and `n`.
        return unsafe { narrow_avx512(c, ldc, a, b, start) };
    }
    let mut copy = B_ROWS.take();
    let (b_at, ldb) = if b.col_stride == 1 {
        (b.ptr(), b.row_stride)
    } else {
        transpose_into(&mut copy, b);
        (copy.as_ptr(), n)
    };
    let job = Job {
        a,
        b: b_at,
        ldb,
        n,
        c,
        ldc,
        start,
    };
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY: the CPU has the level (the caller's contract); `job` addresses what it says.
        Isa::Avx512 => unsafe { job.columns_avx512() },
        Isa::Avx2 => unsafe { job.columns_avx2() },
        Isa::Scalar => unreachable!("`suits` refuses scalar products"),
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (isa, job);
    B_ROWS.set(copy);
}

/// `B` copied row-major into `rows` (`k × n`), read column after column: a transposed view's
/// columns are contiguous.
fn transpose_into(rows: &mut Vec<f32>, b: MatRef<'_>) {
    let [k, n] = b.shape();
    rows.resize(k * n, 0.0);
    let base = b.ptr();
    for j in 0..n {
        // SAFETY: column `j`'s `k` elements lie inside `B` (`MatRef::new` checked its extent).
        let column = unsafe { base.add(j * b.col_stride) };
        for (p, row) in rows.chunks_exact_mut(n).enumerate() {
            // SAFETY: as above, element `(p, j)`.
            row[j] = unsafe { *column.add(p * b.row_stride) };
        }
    }
}

/// One unpacked product: `B` row-major at `b` (rows `ldb` apart), `C` row-major at `c`.
struct Job<'a> {
    a: MatRef<'a>,
    b: *const f32,
    ldb: usize,
    /// Columns of `B` and `C`.
    n: usize,
    c: *mut f32,
    ldc: usize,
    start: Start<'a>,
}

/// How many rows a tile of `nv` vectors has: as many as leave the `regs` registers room for
/// `B`'s `nv` vectors and a broadcast (at most 12), at most the product's rows (rounded down to
/// 4, 2 or 1).
const fn tile_rows(nv: usize, regs: usize, m: usize) -> usize {
    let most = match (regs - nv - 1) / nv {
        r if r > 12 => 12,
        r => r,
    };
    match m {
        _ if m >= most => most,
        4.. => 4,
        2.. => 2,
        _ => 1,
    }
}

/// Runs `$tile::<MR, $nv, $edge>` over the product's rows in tiles of the height
/// [`tile_rows`] gives (the last one shorter).
#[cfg(target_arch = "x86_64")]
macro_rules! tiles {
    ($self:ident, $tile:ident, $nv:literal, $edge:literal, $regs:literal, $j0:ident, $cols:ident) => {
        tiles!(@heights $self, $tile, $nv, $edge, $regs, $j0, $cols, 12 9 6 4 2 1)
    };
    (@heights $self:ident, $tile:ident, $nv:literal, $edge:literal, $regs:literal, $j0:ident, $cols:ident, $($mr:literal)*) => {{
        let m = $self.a.rows;
        match tile_rows($nv, $regs, m) {
            $($mr => {
                for i0 in (0..m).step_by($mr) {
                    $self.$tile::<$mr, $nv, $edge>(i0, (m - i0).min($mr), $j0, $cols);
                }
            })*
            h => unreachable!("no tile of {h} rows"),
        }
    }};
}

impl Job<'_> {
    /// Pointers to rows `i0..i0 + MR` of `A` (past the last row, the last row again: a short
    /// tile computes those rows without storing them).
    #[inline(always)]
    fn a_rows<const MR: usize>(&self, i0: usize, rows: usize) -> [*const f32; MR] {
        let base = self.a.ptr();
        std::array::from_fn(|r| base.wrapping_add((i0 + r.min(rows - 1)) * self.a.row_stride))
    }

    /// Columns in blocks of four vectors of 16, then the rest (a last vector masked).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,fma")]
    fn columns_avx512(&self) {
        let n = self.n;
        let mut j0 = 0;
        while j0 < n {
            let cols = (n - j0).min(64);
            match (cols.div_ceil(16), !cols.is_multiple_of(16)) {
                (4, false) => tiles!(self, tile_avx512, 4, false, 32, j0, cols),
                (4, true) => tiles!(self, tile_avx512, 4, true, 32, j0, cols),
                (3, false) => tiles!(self, tile_avx512, 3, false, 32, j0, cols),
                (3, true) => tiles!(self, tile_avx512, 3, true, 32, j0, cols),
                (2, false) => tiles!(self, tile_avx512, 2, false, 32, j0, cols),
                (2, true) => tiles!(self, tile_avx512, 2, true, 32, j0, cols),
                (_, false) => tiles!(self, tile_avx512, 1, false, 32, j0, cols),
                (_, true) => tiles!(self, tile_avx512, 1, true, 32, j0, cols),
            }
            j0 += cols;
        }
    }

    /// Columns in blocks of two vectors of 8, then the rest (a last vector masked).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn columns_avx2(&self) {
        let n = self.n;
        let mut j0 = 0;
        while j0 < n {
            let cols = (n - j0).min(16);
            match (cols.div_ceil(8), !cols.is_multiple_of(8)) {
                (2, false) => tiles!(self, tile_avx2, 2, false, 16, j0, cols),
                (2, true) => tiles!(self, tile_avx2, 2, true, 16, j0, cols),
                (_, false) => tiles!(self, tile_avx2, 1, false, 16, j0, cols),
                (_, true) => tiles!(self, tile_avx2, 1, true, 16, j0, cols),
            }
            j0 += cols;
        }
    }

    /// Rows `i0..i0 + rows` by columns `j0..j0 + cols` of `C` (`cols` in `NV` vectors of 16, the
    /// last one partial when `EDGE`), in AVX-512.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,fma")]
    fn tile_avx512<const MR: usize, const NV: usize, const EDGE: bool>(
        &self,
        i0: usize,
        rows: usize,
        j0: usize,
        cols: usize,
    ) {
        use std::arch::x86_64::*;
        let masks: [__mmask16; NV] = std::array::from_fn(|v| {
            let lanes = cols.saturating_sub(16 * v).min(16);
            ((1u32 << lanes) - 1) as __mmask16
        });
        let a = self.a_rows::<MR>(i0, rows);
        let step = self.a.col_stride;
        // SAFETY: the loads of `B` stay in its `k` rows of columns `j0..j0 + cols` (masked past
        // them); those of `A` in its rows (`a_rows`) and `k` columns; the loads and stores of `C`
        // in rows `i0..i0 + rows`, columns `j0..j0 + cols` (the caller's contract).
        unsafe {
            let load = |row: *const f32| -> [__m512; NV] {
                std::array::from_fn(|v| match EDGE {
                    true => _mm512_maskz_loadu_ps(masks[v], row.add(16 * v)),
                    false => _mm512_loadu_ps(row.add(16 * v)),
                })
            };
            let mut acc = [[_mm512_setzero_ps(); NV]; MR];
            match self.start {
                Start::Zero => {}
                Start::Current => {
                    for (r, acc) in acc.iter_mut().enumerate().take(rows) {
                        *acc = load(self.c.add((i0 + r) * self.ldc + j0));
                    }
                }
                Start::Rows(bias) => acc = [load(bias[j0..].as_ptr()); MR],
            }
            for p in 0..self.a.cols {
                let row = self.b.add(p * self.ldb + j0);
                let b: [__m512; NV] = std::array::from_fn(|v| match EDGE {
                    true => _mm512_maskz_loadu_ps(masks[v], row.add(16 * v)),
                    false => _mm512_loadu_ps(row.add(16 * v)),
                });
                for (acc, a) in acc.iter_mut().zip(&a) {
                    let a = _mm512_set1_ps(*a.add(p * step));
                    for (acc, b) in acc.iter_mut().zip(&b) {
                        *acc = _mm512_fmadd_ps(a, *b, *acc);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate().take(rows) {
                let row = self.c.add((i0 + r) * self.ldc + j0);
                for (v, acc) in acc.iter().enumerate() {
                    match EDGE {
                        true => _mm512_mask_storeu_ps(row.add(16 * v), masks[v], *acc),
                        false => _mm512_storeu_ps(row.add(16 * v), *acc),
                    }
                }
            }
        }
    }

    /// [`Job::tile_avx512`] in AVX2: vectors of 8.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn tile_avx2<const MR: usize, const NV: usize, const EDGE: bool>(
        &self,
        i0: usize,
        rows: usize,
        j0: usize,
        cols: usize,
    ) {
        use std::arch::x86_64::*;
        let masks: [__m256i; NV] = std::array::from_fn(|v| {
            let lanes = cols.saturating_sub(8 * v).min(8) as i32;
            _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
        });
        let a = self.a_rows::<MR>(i0, rows);
        let step = self.a.col_stride;
        // SAFETY: as in `tile_avx512`.
        unsafe {
            let load = |row: *const f32| -> [__m256; NV] {
                std::array::from_fn(|v| match EDGE {
                    true => _mm256_maskload_ps(row.add(8 * v), masks[v]),
                    false => _mm256_loadu_ps(row.add(8 * v)),
                })
            };
            let mut acc = [[_mm256_setzero_ps(); NV]; MR];
            match self.start {
                Start::Zero => {}
                Start::Current => {
                    for (r, acc) in acc.iter_mut().enumerate().take(rows) {
                        *acc = load(self.c.add((i0 + r) * self.ldc + j0));
                    }
                }
                Start::Rows(bias) => acc = [load(bias[j0..].as_ptr()); MR],
            }
            for p in 0..self.a.cols {
                let row = self.b.add(p * self.ldb + j0);
                let b: [__m256; NV] = std::array::from_fn(|v| match EDGE {
                    true => _mm256_maskload_ps(row.add(8 * v), masks[v]),
                    false => _mm256_loadu_ps(row.add(8 * v)),
                });
                for (acc, a) in acc.iter_mut().zip(&a) {
                    let a = _mm256_broadcast_ss(&*a.add(p * step));
                    for (acc, b) in acc.iter_mut().zip(&b) {
                        *acc = _mm256_fmadd_ps(a, *b, *acc);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate().take(rows) {
                let row = self.c.add((i0 + r) * self.ldc + j0);
                for (v, acc) in acc.iter().enumerate() {
                    match EDGE {
                        true => _mm256_maskstore_ps(row.add(8 * v), masks[v], *acc),
                        false => _mm256_storeu_ps(row.add(8 * v), *acc),
                    }
                }
            }
        }
    }
}

/// `C ← C₀ + A·B` for a `B` of at most [`MAX_NARROW`] columns: each vector holds 16 rows of one
/// column of `C`. A column-major `A` (`∂W = Xᵀ·∂Y`) gives those rows' values of each step in one
/// load; a row-major one (`Y = X·W`) is read 16 × 16 at a time and transposed in registers.
///
/// # Safety
/// As [`product`]; the CPU has AVX-512F; `A` has contiguous rows or columns.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn narrow_avx512(c: *mut f32, ldc: usize, a: MatRef<'_>, b: MatRef<'_>, start: Start<'_>) {
    match b.shape()[1] {
        // SAFETY (each): the caller's.
        1 => unsafe { narrow_columns::<1>(c, ldc, a, b, start) },
        2 => unsafe { narrow_columns::<2>(c, ldc, a, b, start) },
        3 => unsafe { narrow_columns::<3>(c, ldc, a, b, start) },
        4 => unsafe { narrow_columns::<4>(c, ldc, a, b, start) },
        n => unreachable!("{n} columns are not narrow"),
    }
}

/// [`narrow_avx512`] for `N` columns, over blocks of 64 rows: four vectors of rows per column,
/// so that each step has `4·N` independent chains (one chain's latency would bound a column).
///
/// # Safety
/// As [`narrow_avx512`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn narrow_columns<const N: usize>(c: *mut f32, ldc: usize, a: MatRef<'_>, b: MatRef<'_>, start: Start<'_>) {
    use std::arch::x86_64::*;
    let [m, k] = a.shape();
    let (a_at, b_at) = (a.ptr(), b.ptr());
    let b_value = |p: usize, j: usize| -> f32 {
        // SAFETY: `(p, j)` is inside `B`, whose extent `MatRef::new` checked.
        unsafe { *b_at.add(p * b.row_stride + j * b.col_stride) }
    };
    for i0 in (0..m).step_by(64) {
        // Rows of each vector (0 past the product's last row).
        let rows: [usize; 4] = std::array::from_fn(|g| (m - i0).saturating_sub(16 * g).min(16));
        let mut acc = [[_mm512_setzero_ps(); N]; 4];
        for (g, acc) in acc.iter_mut().enumerate() {
            for (j, acc) in acc.iter_mut().enumerate() {
                *acc = match start {
                    Start::Zero => _mm512_setzero_ps(),
                    // SAFETY: those rows of column `j` are `C`'s (the caller's contract).
                    Start::Current => unsafe { load_rows(c, ldc, i0 + 16 * g, rows[g], j) },
                    Start::Rows(bias) => _mm512_set1_ps(bias[j]),
                };
            }
        }
        if a.row_stride == 1 {
            let masks = rows.map(|r| ((1u32 << r) - 1) as __mmask16);
            for p in 0..k {
                let b: [__m512; N] = std::array::from_fn(|j| _mm512_set1_ps(b_value(p, j)));
                for (g, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: rows `i0 + 16g..` of column `p` are `A`'s, contiguous; lanes past
                    // them (or a whole vector past the last row) are masked.
                    let column =
                        unsafe { _mm512_maskz_loadu_ps(masks[g], a_at.wrapping_add(p * a.col_stride + i0 + 16 * g)) };
                    for (acc, b) in acc.iter_mut().zip(&b) {
                        *acc = _mm512_fmadd_ps(column, *b, *acc);
                    }
                }
            }
        } else {
            for (g, group) in acc.iter_mut().enumerate().filter(|(g, _)| rows[*g] > 0) {
                // A copy, only ever indexed by constants, so that it stays in registers.
                let mut acc = *group;
                let first = i0 + 16 * g;
                for p0 in (0..k).step_by(16) {
                    let steps = (k - p0).min(16);
                    let mask = ((1u32 << steps) - 1) as __mmask16;
                    // Past the last row, the last row again (computed, never stored).
                    let block: [__m512; 16] = std::array::from_fn(|r| {
                        let row = a_at.wrapping_add((first + r.min(rows[g] - 1)) * a.row_stride + p0);
                        // SAFETY: columns `p0..p0 + steps` of a row of `A`, contiguous; the rest masked.
                        unsafe { _mm512_maskz_loadu_ps(mask, row) }
                    });
                    let columns = transpose_16x16(block);
                    for (q, column) in columns.iter().enumerate().take(steps) {
                        for (j, acc) in acc.iter_mut().enumerate() {
                            *acc = _mm512_fmadd_ps(*column, _mm512_set1_ps(b_value(p0 + q, j)), *acc);
                        }
                    }
                }
                *group = acc;
            }
        }
        for (g, acc) in acc.iter().enumerate() {
            for (j, acc) in acc.iter().enumerate() {
                // SAFETY: as the loads.
                unsafe { store_rows(c, ldc, i0 + 16 * g, rows[g], j, *acc) };
            }
        }
    }
}

/// Rows `i0..i0 + rows` (at most 16) of column `j` of `C` as one vector, zeros past them.
///
/// # Safety
/// Those elements of `C` are readable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn load_rows(c: *const f32, ldc: usize, i0: usize, rows: usize, j: usize) -> std::arch::x86_64::__m512 {
    // SAFETY: the caller's.
    let lanes: [f32; 16] = std::array::from_fn(|r| {
        if r < rows {
            unsafe { *c.add((i0 + r) * ldc + j) }
        } else {
            0.0
        }
    });
    // SAFETY: `lanes` holds 16 values.
    unsafe { std::arch::x86_64::_mm512_loadu_ps(lanes.as_ptr()) }
}

/// Writes the first `rows` lanes of `values` to rows `i0..` of column `j` of `C`.
///
/// # Safety
/// Those elements of `C` are writable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn store_rows(c: *mut f32, ldc: usize, i0: usize, rows: usize, j: usize, values: std::arch::x86_64::__m512) {
    let mut lanes = [0.0f32; 16];
    // SAFETY: `lanes` holds 16 values.
    unsafe { std::arch::x86_64::_mm512_storeu_ps(lanes.as_mut_ptr(), values) };
    for (r, value) in lanes.iter().enumerate().take(rows) {
        // SAFETY: the caller's.
        unsafe { *c.add((i0 + r) * ldc + j) = *value };
    }
}

/// The transpose of 16 rows of 16: four rounds of interleaving row `i` with row `i + 8` (each
/// round rotates the bits of an element's (row, column) index by one; four give (column, row)).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn transpose_16x16(mut rows: [std::arch::x86_64::__m512; 16]) -> [std::arch::x86_64::__m512; 16] {
    use std::arch::x86_64::*;
    let low = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    let high = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for _ in 0..4 {
        rows = std::array::from_fn(|r| {
            let (first, second) = (rows[r / 2], rows[r / 2 + 8]);
            match r % 2 {
                0 => _mm512_permutex2var_ps(first, low, second),
                _ => _mm512_permutex2var_ps(first, high, second),
            }
        });
    }
    rows
}
