//! Matrix products `C ← C₀ + A·B` in which every element is one chain of fused multiply-adds
//! over the inner dimension, in order:
//!
//! ```text
//! c[i][j] = fma(a[i][K−1], b[K−1][j], … fma(a[i][1], b[1][j], fma(a[i][0], b[0][j], c₀[i][j])))
//! ```
//!
//! That order is the whole contract. Vector width only decides how many *different* elements
//! are computed at once, the cache blocking only when each element's chain is paused (its
//! running value is stored in `C` and reloaded), and threads only which elements each computes,
//! so the result is the same bit for bit on every instruction set, cache size, thread count and
//! batch size (a row of `C` does not depend on the other rows: decoding one sequence and
//! scoring it in a batch of 64 give the same numbers).
//!
//! The layout is the classic one (Goto & van de Geijn, "Anatomy of high-performance matrix
//! multiplication", 2008; BLIS): `B` is packed in `KC × NC` blocks of `NR`-wide panels, `A` in
//! `MC × KC` blocks of `MR`-high panels, and an `MR × NR` micro-kernel keeps its tile of `C` in
//! registers for `KC` steps ([`crate::micro_kernel`]: plain Rust over arrays, `f32::mul_add`,
//! compiled once per instruction set with that set's target features, and the vector levels'
//! tiles in intrinsics). A packed `B` under a few rows never goes through memory unpacked: each run of
//! its columns is unpacked into registers and multiplied into every row at once
//! ([`crate::packed::RegisterRun`]). Products small enough for the closest caches skip the
//! packing ([`crate::unpacked`]).

pub use crate::init::Init;
use crate::isa::Isa;
pub use crate::mat_ref::{MatRef, OutOfBounds};
use crate::micro_kernel::{NextTile, Panel, TileAt, micro_kernel};
use crate::packed::PackedMatrix;
#[cfg(target_arch = "x86_64")]
use crate::packed::RegisterRun;
use crate::panels::{pack_a, pack_b, unpack_b};
use crate::team;
use crate::unpacked::{self, Start};

/// `C ← C₀ + A·B` on the active instruction set ([`Isa::active`]), split across as many threads
/// as rayon has (the caller and the kernels' own helper threads, [`crate::team`]) when the
/// product is large enough and the caller's work is not already split ([`crate::team::threads`]).
///
/// `c` is row-major `m × n` with row stride `ldc ≥ n`.
///
/// # Panics
/// When the shapes disagree or `c` is too short: callers check shapes first.
pub fn matmul(c: &mut [f32], ldc: usize, a: MatRef<'_>, b: MatRef<'_>, init: Init) {
    matmul_on(Isa::active(), c, ldc, a, b, init)
}

/// [`matmul`] on a given instruction set (which must be available).
pub fn matmul_on(isa: Isa, c: &mut [f32], ldc: usize, a: MatRef<'_>, b: MatRef<'_>, init: Init) {
    product_on(isa, c, ldc, a, Rhs::Dense(b), start_of(init))
}

/// `C ← A·B` with every row of `C` starting from `bias` instead of zero: a layer's `x·W + b`,
/// each element one chain from its bias (the bits of writing `bias` into every row and then
/// [`Init::Accumulate`], without that pass over `C` where the product runs
/// [unpacked](crate::unpacked)).
///
/// # Panics
/// As [`matmul`], and when `bias` is not one value per column of `C`.
pub fn matmul_bias(c: &mut [f32], ldc: usize, a: MatRef<'_>, b: MatRef<'_>, bias: &[f32]) {
    matmul_bias_on(Isa::active(), c, ldc, a, b, bias)
}

/// [`matmul_bias`] on a given instruction set (which must be available).
pub fn matmul_bias_on(isa: Isa, c: &mut [f32], ldc: usize, a: MatRef<'_>, b: MatRef<'_>, bias: &[f32]) {
    assert_eq!(bias.len(), b.shape()[1], "one bias per column of C");
    product_on(isa, c, ldc, a, Rhs::Dense(b), Start::Rows(bias))
}

/// [`matmul`] with a packed right-hand side: the same bits as `B`'s dense copy gives, each panel
/// of `B` unpacked just before the micro-kernel reads it.
///
/// # Panics
/// As [`matmul`].
pub fn matmul_packed(c: &mut [f32], ldc: usize, a: MatRef<'_>, b: &PackedMatrix, init: Init) {
    matmul_packed_on(Isa::active(), c, ldc, a, b, init)
}

/// [`matmul_packed`] on a given instruction set (which must be available).
pub fn matmul_packed_on(isa: Isa, c: &mut [f32], ldc: usize, a: MatRef<'_>, b: &PackedMatrix, init: Init) {
    product_on(isa, c, ldc, a, Rhs::Packed(b), start_of(init))
}

/// The [`Start`] of an [`Init`].
fn start_of(init: Init) -> Start<'static> {
    match init {
        Init::Zero => Start::Zero,
        Init::Accumulate => Start::Current,
    }
}

/// The right-hand side of a product.
#[derive(Clone, Copy)]
enum Rhs<'a> {
    Dense(MatRef<'a>),
    Packed(&'a PackedMatrix),
}

impl Rhs<'_> {
    fn shape(&self) -> [usize; 2] {
        match self {
            Rhs::Dense(b) => b.shape(),
            Rhs::Packed(b) => b.shape(),
        }
    }
}

/// Panics unless `a · b` is a product and `C` holds `m × n` at stride `ldc`, on an available `isa`.
pub(crate) fn check_shapes(isa: Isa, c: &[f32], ldc: usize, a: MatRef<'_>, [k2, n]: [usize; 2]) {
    let [m, k] = a.shape();
    assert_eq!(k, k2, "inner dimensions differ: {m}×{k} · {k2}×{n}");
    assert!(ldc >= n, "row stride {ldc} below the width {n}");
    assert!(
        m == 0 || n == 0 || c.len() >= (m - 1) * ldc + n,
        "C has {} elements, needs {m}×{n} at stride {ldc}",
        c.len(),
    );
    assert!(isa.is_available(), "{isa} is not available on this CPU");
}

fn product_on(isa: Isa, c: &mut [f32], ldc: usize, a: MatRef<'_>, b: Rhs<'_>, start: Start<'_>) {
    let ([m, k], [_, n]) = (a.shape(), b.shape());
    check_shapes(isa, c, ldc, a, b.shape());
    if m == 0 || n == 0 {
        return;
    }
    let fill = |c: &mut [f32], f: &dyn Fn(&mut [f32])| c.chunks_mut(ldc).take(m).for_each(|row| f(&mut row[..n]));
    match (start, b) {
        (Start::Zero, _) if k == 0 => fill(c, &|row| row.fill(0.0)),
        (Start::Rows(bias), _) if k == 0 => fill(c, &|row| row.copy_from_slice(bias)),
        (_, _) if k == 0 => {}
        (_, Rhs::Dense(b)) if unpacked::suits(isa, &a, &b) => {
            // SAFETY: `C` covers `m × n` at stride `ldc` (asserted above); the CPU has `isa`.
            unsafe { unpacked::product(isa, c.as_mut_ptr(), ldc, a, b, start) }
        }
        (Start::Zero, _) => packed_product_on(isa, c, ldc, a, b, Init::Zero),
        (Start::Current, _) => packed_product_on(isa, c, ldc, a, b, Init::Accumulate),
        (Start::Rows(bias), _) => {
            fill(c, &|row| row.copy_from_slice(bias));
            packed_product_on(isa, c, ldc, a, b, Init::Accumulate)
        }
    }
}

/// [`product_on`] through packed panels whatever the size (`C` checked by the caller, `k > 0`).
fn packed_product_on(isa: Isa, c: &mut [f32], ldc: usize, a: MatRef<'_>, b: Rhs<'_>, init: Init) {
    let ([m, k], [_, n]) = (a.shape(), b.shape());
    let (mr, nr) = shape_of(isa);
    // A product only a few columns wide wastes most of each `NR`-wide panel: compute its
    // transpose instead, `Cᵀ = Bᵀ·Aᵀ`, whose elements are the same chains (`a·b = b·a` exactly).
    let out = Out {
        at: c.as_mut_ptr(),
        row_stride: ldc,
        col_stride: 1,
    };
    let (a, b, out, m, n) = match b {
        Rhs::Dense(b) if n < nr / 2 && m > n => {
            let transposed = Out {
                row_stride: 1,
                col_stride: ldc,
                ..out
            };
            (b.t(), Rhs::Dense(a.t()), transposed, n, m)
        }
        _ => (a, b, out, m, n),
    };
    // A few rows (decoding) make a product that streams its weights from memory: worth
    // splitting once each thread reads enough of them.
    let worth_splitting = match m >= 16 {
        true => m * n * k >= PARALLEL_WORK,
        false => n * k >= PARALLEL_READ,
    };
    let threads = if worth_splitting { team::threads() } else { 1 };
    // Each task packs the whole of the operand the split does not divide: split rows when B is
    // the smaller one to copy, columns otherwise.
    let by_rows = threads > 1 && m >= 2 * mr * threads && (n < m || n < 2 * nr * threads);
    if threads > 1 && !by_rows && n >= 2 * nr * threads {
        let band = n.div_ceil(threads).next_multiple_of(nr);
        team::run(n.div_ceil(band), &|t| {
            let (j0, j1) = (t * band, ((t + 1) * band).min(n));
            // SAFETY: each task writes only columns `j0..j1` of `C`, so no two tasks touch the
            // same element, and `C` covers `m × n` (asserted above).
            unsafe { run(isa, out, a, b, init, 0..m, j0..j1) }
        });
    } else if by_rows {
        let band = m.div_ceil(threads).next_multiple_of(mr);
        team::run(m.div_ceil(band), &|t| {
            let (i0, i1) = (t * band, ((t + 1) * band).min(m));
            // SAFETY: as above, with disjoint row bands.
            unsafe { run(isa, out, a, b, init, i0..i1, 0..n) }
        });
    } else {
        // SAFETY: `C` covers `m × n` (asserted above).
        unsafe { run(isa, out, a, b, init, 0..m, 0..n) }
    }
}

/// Multiply-adds from which a product is split across threads (~40 µs of work on one core).
const PARALLEL_WORK: usize = 1 << 21;
/// Elements of `B` from which a product of fewer than 16 rows is split across threads. Handing
/// half of a product to a [helper](crate::team) costs under a microsecond; on a 2-vCPU Xeon
/// (AVX-512) a packed one-row product of 256 × 256 ran 4.1 µs alone and 4.5 µs split, of 256 × 512
/// 7.8 and 6.3 µs, of 576 × 1536 50 and 28 µs.
const PARALLEL_READ: usize = 1 << 17;

/// The inner-dimension block: how many steps a micro-kernel runs before its tile goes back to `C`.
const KC: usize = 256;
/// The inner-dimension block for `k`: at most [`KC`], in as few blocks as that allows, of about
/// equal length (a multiple of 32, a packed matrix's group), so that no block is a short one
/// whose tile loads and stores cost as much as its steps (576 = 3 × 192, not 256 + 256 + 64).
fn kc_step(k: usize) -> usize {
    let blocks = k.div_ceil(KC);
    k.div_ceil(blocks).next_multiple_of(32).min(k)
}

/// Rows of `A` packed at once (a multiple of every `MR`).
const MC: usize = 96;
/// Columns of `B` packed at once (a multiple of every `NR`).
const NC: usize = 2048;
/// Up to how many rows of `A` a packed `B` is unpacked into registers only, on AVX2 and on
/// AVX-512 (twice the registers, each twice as wide). Above, its panels are unpacked into
/// memory once for all rows.
const REGISTER_ROWS: usize = 8;
const ZMM_ROWS: usize = 16;
/// Up to how many rows of `A` a row-major `B` is read in place rather than packed.
const DIRECT_B_ROWS: usize = 128;

/// `(MR, NR)` of each instruction set's main micro-kernel, the one `C` of many rows runs (few
/// rows run wider, lower tiles: see [`Job::avx512`] and [`Job::avx2`]).
fn shape_of(isa: Isa) -> (usize, usize) {
    match isa {
        Isa::Scalar => (4, 4),
        Isa::Avx2 => (6, 16),
        Isa::Avx512 => (12, 32),
    }
}

/// Where `C` is: element `(i, j)` at `at + i·row_stride + j·col_stride`.
#[derive(Clone, Copy)]
struct Out {
    at: *mut f32,
    row_stride: usize,
    col_stride: usize,
}
// SAFETY: tasks given the same `Out` write disjoint elements (see `matmul_on`).
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

/// The product restricted to rows `rows` and columns `cols` of `C`, on `isa`.
///
/// # Safety
/// `out` addresses an `m × n` matrix that no one else writes in that region.
unsafe fn run(
    isa: Isa,
    out: Out,
    a: MatRef<'_>,
    b: Rhs<'_>,
    init: Init,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
) {
    let job = Job {
        out,
        a,
        b,
        init,
        rows,
        cols,
        isa,
        wide: isa >= Isa::Avx2,
    };
    #[cfg(target_arch = "x86_64")]
    if let Rhs::Packed(b) = job.b
        && job.a.col_stride == 1
    {
        // SAFETY: the product's instruction set, which the CPU has.
        match isa {
            Isa::Avx512 if job.rows.len() <= ZMM_ROWS => return unsafe { job.packed_in_zmm(b) },
            Isa::Avx2 if job.rows.len() <= REGISTER_ROWS => return unsafe { job.packed_in_registers(b) },
            _ => {}
        }
    }
    match isa {
        // SAFETY: the caller checked that the CPU has the level (`matmul_on`).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { job.avx512() },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { job.avx2() },
        _ => job.scalar(),
    }
}

struct Job<'a> {
    out: Out,
    a: MatRef<'a>,
    b: Rhs<'a>,
    init: Init,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    /// The product's instruction set (the CPU has it): which intrinsic micro-kernels may run.
    isa: Isa,
    /// Whether the CPU has AVX2 and FMA and the product may use them: for unpacking a packed
    /// `B`, the register path and the 6 × 16 intrinsic kernel (the same values either way).
    wide: bool,
}

impl Job<'_> {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,fma")]
    fn avx512(&self) {
        // Every tile 32 columns wide, in intrinsics ([`micro_kernel`]); fewer rows run lower
        // tiles, which waste less of themselves on padding. Measured on a 2-core Xeon: 8 × 32 at
        // 16 rows 108 GFLOP/s a core, 4 × 32 87, 12 × 32 66 (the 4 × 64 tile this replaced,
        // compiled from generic code, 28).
        let rows = self.rows.len();
        match rows {
            0..2 => self.blocked::<1, 32>(),
            2 => self.blocked::<2, 32>(),
            3..8 => self.blocked::<4, 32>(),
            _ if rows <= DIRECT_B_ROWS => self.blocked::<8, 32>(),
            _ => self.blocked::<12, 32>(),
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn avx2(&self) {
        // Six rows by 16 columns (the intrinsic kernel: 12 accumulators, 2 panel loads and a
        // broadcast in the 16 registers, 6 broadcasts per 2 loads of `B`); fewer rows run
        // a row or two by 32 columns, which waste less of themselves on padding.
        match self.rows.len() {
            0..2 => self.blocked::<1, 32>(),
            2..6 => self.blocked::<2, 32>(),
            _ => self.blocked::<6, 16>(),
        }
    }

    /// A packed `B` under a few rows of a row-major `A`: each run of `B`'s columns unpacked
    /// into registers and multiplied into every row at once ([`RegisterRun`]), never stored;
    /// columns that are not whole runs (a ragged end) go through [`Job::blocked`].
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn packed_in_registers(&self, b: &PackedMatrix) {
        let mut c0 = self.cols.start;
        while c0 < self.cols.end {
            let fits = |width: usize| c0 + width <= self.cols.end;
            // Two rows of 32 columns or four of 16: at most 8 accumulators and 4 unpacked
            // vectors in the 16 registers.
            let width = match self.rows.len() < 4 && fits(32) && RegisterRun::fits::<4>(b, c0) {
                true => 32,
                false if fits(16) && RegisterRun::fits::<2>(b, c0) => 16,
                false => {
                    // A ragged end: the usual way.
                    let rest = Job {
                        rows: self.rows.clone(),
                        cols: c0..self.cols.end,
                        ..*self
                    };
                    return rest.avx2();
                }
            };
            let mut i0 = self.rows.start;
            while i0 < self.rows.end {
                let rows = match (self.rows.end - i0, width) {
                    (1, _) => 1,
                    (2 | 3, _) | (_, 32) => 2,
                    _ => 4,
                };
                match (rows, width) {
                    (1, 32) => self.register_tile::<1, 4>(b, i0, c0),
                    (2, 32) => self.register_tile::<2, 4>(b, i0, c0),
                    (1, _) => self.register_tile::<1, 2>(b, i0, c0),
                    (2, _) => self.register_tile::<2, 2>(b, i0, c0),
                    _ => self.register_tile::<4, 2>(b, i0, c0),
                }
                i0 += rows;
            }
            c0 += width;
        }
    }

    /// [`Job::packed_in_registers`] with AVX-512, whose 32 registers hold sixteen rows by 16
    /// columns or eight by a whole group of 32 (16 accumulators). Each tile's rows of `A` are
    /// first copied one step after another (`[k][rows]`), so every broadcast reads from one
    /// place rather than from one row pointer per row.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,fma")]
    fn packed_in_zmm(&self, b: &PackedMatrix) {
        let k = self.a.cols;
        let (mut a_pack, b_pack) = SCRATCH.take();
        let mut i0 = self.rows.start;
        while i0 < self.rows.end {
            let rows = (self.rows.end - i0).min(ZMM_ROWS);
            a_pack.resize(k * rows, 0.0);
            for i in 0..rows {
                let row = self.a.row(i0 + i).expect("a row-major A");
                for (p, &value) in row.iter().enumerate() {
                    a_pack[p * rows + i] = value;
                }
            }
            let a = &a_pack[..k * rows];
            macro_rules! rows {
                ($($mr:literal)*) => {
                    match rows {
                        $($mr => self.zmm_rows::<$mr>(b, i0, a),)*
                        _ => unreachable!("1 to {ZMM_ROWS} rows"),
                    }
                };
            }
            rows!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);
            i0 += rows;
        }
        SCRATCH.set((a_pack, b_pack));
    }

    /// Rows `i0..i0 + MR` of `C` over the job's columns: runs of 32 columns under eight rows,
    /// of 16 above; a ragged end the usual way. `a` holds those rows of `A` as `[k][MR]`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,fma")]
    fn zmm_rows<const MR: usize>(&self, b: &PackedMatrix, i0: usize, a: &[f32]) {
        let mut c0 = self.cols.start;
        while c0 < self.cols.end {
            let fits = |width: usize| c0 + width <= self.cols.end;
            if MR <= 8 && fits(32) && RegisterRun::fits_avx512::<2>(b, c0) {
                self.zmm_tile::<MR, 2>(b, i0, c0, a);
                c0 += 32;
            } else if fits(16) && RegisterRun::fits_avx512::<1>(b, c0) {
                self.zmm_tile::<MR, 1>(b, i0, c0, a);
                c0 += 16;
            } else {
                let rest = Job {
                    rows: i0..i0 + MR,
                    cols: c0..self.cols.end,
                    ..*self
                };
                return rest.avx512();
            }
        }
    }

    /// Rows `i0..i0 + MR`, columns `c0..c0 + 16·NV` of `C` by [`RegisterRun::multiply_avx512`].
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,fma")]
    fn zmm_tile<const MR: usize, const NV: usize>(&self, b: &PackedMatrix, i0: usize, c0: usize, a: &[f32]) {
        use std::arch::x86_64::*;
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        if self.init == Init::Accumulate {
            for (i, acc) in acc.iter_mut().enumerate() {
                for (v, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: the 16 elements lie inside the job's region of `C` (`run`'s contract).
                    *acc = unsafe { _mm512_loadu_ps(self.c_lanes::<16>(i0 + i, c0 + 16 * v).as_ptr()) };
                }
            }
        }
        RegisterRun { b, c0 }.multiply_avx512::<MR, NV>(a, &mut acc);
        for (i, acc) in acc.iter().enumerate() {
            for (v, acc) in acc.iter().enumerate() {
                let mut lanes = [0.0f32; 16];
                // SAFETY: `lanes` holds 16 values; the stores as above.
                unsafe {
                    _mm512_storeu_ps(lanes.as_mut_ptr(), *acc);
                    self.set_c_lanes(i0 + i, c0 + 16 * v, lanes);
                }
            }
        }
    }

    /// Elements `(i, j..j + L)` of `C` (whatever its column stride), for a register tile.
    ///
    /// # Safety
    /// They lie inside the job's region of `C`, which only this job writes (`run`'s contract).
    #[inline(always)]
    unsafe fn c_lanes<const L: usize>(&self, i: usize, j: usize) -> [f32; L] {
        // SAFETY: the caller's.
        std::array::from_fn(|l| unsafe { *self.c_at(i, j + l) })
    }

    /// Writes `lanes` to elements `(i, j..j + L)` of `C`.
    ///
    /// # Safety
    /// As [`Job::c_lanes`].
    #[inline(always)]
    unsafe fn set_c_lanes<const L: usize>(&self, i: usize, j: usize, lanes: [f32; L]) {
        for (l, value) in lanes.into_iter().enumerate() {
            // SAFETY: the caller's.
            unsafe { *self.c_at(i, j + l) = value };
        }
    }

    /// Where element `(i, j)` of `C` is.
    ///
    /// # Safety
    /// As [`Job::c_lanes`], for the one element.
    #[inline(always)]
    unsafe fn c_at(&self, i: usize, j: usize) -> *mut f32 {
        // SAFETY: the caller's.
        unsafe { self.out.at.add(i * self.out.row_stride + j * self.out.col_stride) }
    }

    /// Rows `i0..i0 + MR`, columns `c0..c0 + 8·NV` of `C` by [`RegisterRun::multiply`].
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn register_tile<const MR: usize, const NV: usize>(&self, b: &PackedMatrix, i0: usize, c0: usize) {
        use std::arch::x86_64::*;
        let a: [&[f32]; MR] = std::array::from_fn(|i| self.a.row(i0 + i).expect("a row-major A"));
        let mut acc = [[_mm256_setzero_ps(); NV]; MR];
        if self.init == Init::Accumulate {
            for (i, acc) in acc.iter_mut().enumerate() {
                for (v, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: the 8 elements lie inside the job's region of `C` (`run`'s contract).
                    *acc = unsafe { _mm256_loadu_ps(self.c_lanes::<8>(i0 + i, c0 + 8 * v).as_ptr()) };
                }
            }
        }
        RegisterRun { b, c0 }.multiply::<MR, NV>(a, &mut acc);
        for (i, acc) in acc.iter().enumerate() {
            for (v, acc) in acc.iter().enumerate() {
                let mut lanes = [0.0f32; 8];
                // SAFETY: `lanes` holds 8 values; the stores as above.
                unsafe {
                    _mm256_storeu_ps(lanes.as_mut_ptr(), *acc);
                    self.set_c_lanes(i0 + i, c0 + 8 * v, lanes);
                }
            }
        }
    }

    fn scalar(&self) {
        if self.rows.len() < 4 {
            self.blocked::<1, 8>()
        } else {
            self.blocked::<4, 4>()
        }
    }

    /// The blocked loops around an `MR × NR` micro-kernel.
    ///
    /// A dense `B` is packed unless it is row-major and `A` short: then its panels are read in
    /// place (packing would cost more than the few rows reuse), all but a ragged last one. A
    /// packed `B` is unpacked in blocks, or, under a short `A`, 32 panels at a time just before
    /// its tiles read it (from the closest cache).
    #[inline(always)]
    fn blocked<const MR: usize, const NR: usize>(&self) {
        let a = &self.a;
        let k = a.cols;
        let few_rows = self.rows.len() <= DIRECT_B_ROWS;
        let in_place = match self.b {
            Rhs::Dense(b) if b.col_stride == 1 && few_rows => Some(b),
            _ => None,
        };
        let nc_step = match self.b {
            Rhs::Packed(_) if few_rows => 32 * NR,
            _ => NC,
        };
        let kc_max = kc_step(k);
        let b_pack_len = if in_place.is_some() {
            NR
        } else {
            nc_step.min(self.cols.len().next_multiple_of(NR))
        };
        let (mut a_pack, mut b_pack) = SCRATCH.take();
        // Packing writes every element it later reads, so reused memory needs no clearing.
        a_pack.resize(MC.min(self.rows.len()).next_multiple_of(MR) * kc_max, 0.0);
        b_pack.resize(kc_max * b_pack_len, 0.0);
        for jc in self.cols.clone().step_by(nc_step) {
            let nc = nc_step.min(self.cols.end - jc);
            for pc in (0..k).step_by(kc_max) {
                let kc = kc_max.min(k - pc);
                let from_zero = pc == 0 && self.init == Init::Zero;
                match (in_place, self.b) {
                    (None, Rhs::Dense(b)) => pack_b::<NR>(&mut b_pack, &b, pc, kc, jc, nc, self.wide),
                    (None, Rhs::Packed(b)) => unpack_b::<NR>(&mut b_pack, b, pc, kc, jc, nc, self.wide),
                    (Some(b), _) if !nc.is_multiple_of(NR) => {
                        let last = nc / NR * NR;
                        pack_b::<NR>(&mut b_pack, &b, pc, kc, jc + last, nc - last, self.wide);
                    }
                    (Some(_), _) => {}
                }
                for ic in self.rows.clone().step_by(MC) {
                    let mc = MC.min(self.rows.end - ic);
                    pack_a::<MR>(&mut a_pack, a, ic, mc, pc, kc, self.wide);
                    for jr in (0..nc).step_by(NR) {
                        let b_panel = match in_place {
                            Some(b) if jr + NR <= nc => Panel {
                                // SAFETY: row `pc`, column `jc + jr` is inside B.
                                at: unsafe { b.ptr().add(pc * b.row_stride + jc + jr) },
                                stride: b.row_stride,
                            },
                            _ => {
                                let offset = if in_place.is_some() { 0 } else { jr * kc };
                                Panel {
                                    at: b_pack[offset..][..kc * NR].as_ptr(),
                                    stride: NR,
                                }
                            }
                        };
                        for ir in (0..mc).step_by(MR) {
                            let a_panel = &a_pack[ir * kc..][..kc * MR];
                            let out = &self.out;
                            let tile = Tile {
                                // SAFETY: `(ic + ir, jc + jr)` is inside the job's region of `C`.
                                at: unsafe { out.at.add((ic + ir) * out.row_stride + (jc + jr) * out.col_stride) },
                                row_stride: out.row_stride,
                                col_stride: out.col_stride,
                                rows: MR.min(mc - ir),
                                cols: NR.min(nc - jr),
                            };
                            // The tile below, or the top of the next panel's column.
                            let next = match (ir + MR < mc, jr + NR < nc) {
                                (true, _) => Some((ic + ir + MR, jc + jr, MR.min(mc - ir - MR))),
                                (false, true) => Some((ic, jc + jr + NR, MR.min(mc))),
                                (false, false) => None,
                            };
                            let next = match next {
                                Some((i, j, rows)) if out.col_stride == 1 => NextTile {
                                    at: out.at.wrapping_add(i * out.row_stride + j),
                                    stride: out.row_stride,
                                    rows,
                                },
                                _ => NextTile::NONE,
                            };
                            // SAFETY: the tile lies inside the job's region (rows and cols are
                            // clipped); the panel holds `kc` rows of `NR` values.
                            unsafe { tile.update::<MR, NR>(kc, a_panel, b_panel, from_zero, next, self.isa) };
                        }
                    }
                }
            }
        }
        SCRATCH.set((a_pack, b_pack));
    }
}

thread_local! {
    /// Each thread's packing buffers for `A` and `B`, kept between products.
    static SCRATCH: std::cell::Cell<(Vec<f32>, Vec<f32>)> = const { std::cell::Cell::new((Vec::new(), Vec::new())) };
}

/// An `MR × NR` (or smaller, at the edges) tile of `C`.
struct Tile {
    at: *mut f32,
    row_stride: usize,
    col_stride: usize,
    rows: usize,
    cols: usize,
}

impl Tile {
    /// Continues every element's chain through `kc` more steps: loads the tile (or starts from
    /// zero), runs the micro-kernel, stores it.
    ///
    /// # Safety
    /// The tile's `rows × cols` elements are writable; `b` is as [`micro_kernel`] needs.
    #[inline(always)]
    unsafe fn update<const MR: usize, const NR: usize>(
        &self,
        kc: usize,
        a: &[f32],
        b: Panel,
        from_zero: bool,
        next: NextTile,
        isa: Isa,
    ) {
        if self.col_stride == 1 && self.cols == NR && self.rows == MR {
            // A whole tile: the micro-kernel loads and stores it in place.
            let c = TileAt {
                at: self.at,
                stride: self.row_stride,
                load: !from_zero,
            };
            // SAFETY: the tile's `MR` rows of `NR` elements are `C`'s (the caller's contract).
            unsafe { micro_kernel::<MR, NR>(kc, a, b, c, next, isa) };
            return;
        }
        // An edge tile (or a transposed `C`): through a full-size copy.
        let mut acc = [[0.0f32; NR]; MR];
        if !from_zero {
            // SAFETY (both loads): the tile's elements are readable (the caller's contract).
            if self.col_stride == 1 && self.cols == NR {
                // A whole row at a time, as one fixed-size copy (vector moves, not a call to
                // `memmove` per row, which cost ~15 % of a product with K = 704).
                for (i, row) in acc.iter_mut().enumerate().take(self.rows) {
                    *row = unsafe { *(self.at(i, 0) as *const [f32; NR]) };
                }
            } else if self.col_stride == 1 {
                for (i, row) in acc.iter_mut().enumerate().take(self.rows) {
                    let src = unsafe { std::slice::from_raw_parts(self.at(i, 0), self.cols) };
                    row[..self.cols].copy_from_slice(src);
                }
            } else {
                for (j, column) in (0..self.cols).map(|j| (j, unsafe { self.at(0, j) })) {
                    for (i, row) in acc.iter_mut().enumerate().take(self.rows) {
                        row[j] = unsafe { *column.add(i * self.row_stride) };
                    }
                }
            }
        }
        let copy = TileAt {
            at: acc.as_mut_ptr().cast(),
            stride: NR,
            load: !from_zero,
        };
        // SAFETY: `copy` is `acc`; the rest is the caller's contract.
        unsafe { micro_kernel::<MR, NR>(kc, a, b, copy, next, isa) };
        // SAFETY (both stores): as above.
        if self.col_stride == 1 && self.cols == NR {
            for (i, row) in acc.iter().enumerate().take(self.rows) {
                unsafe { *(self.at(i, 0) as *mut [f32; NR]) = *row };
            }
        } else if self.col_stride == 1 {
            for (i, row) in acc.iter().enumerate().take(self.rows) {
                let dst = unsafe { std::slice::from_raw_parts_mut(self.at(i, 0), self.cols) };
                dst.copy_from_slice(&row[..self.cols]);
            }
        } else {
            for (j, column) in (0..self.cols).map(|j| (j, unsafe { self.at(0, j) })) {
                for (i, row) in acc.iter().enumerate().take(self.rows) {
                    unsafe { *column.add(i * self.row_stride) = row[j] };
                }
            }
        }
    }

    /// Element `(i, j)` of the tile.
    ///
    /// # Safety
    /// `(i, j)` is inside the tile.
    #[inline(always)]
    unsafe fn at(&self, i: usize, j: usize) -> *mut f32 {
        // SAFETY: the caller's contract.
        unsafe { self.at.add(i * self.row_stride + j * self.col_stride) }
    }
}

/// The contract, written plainly: each element's chain of fused multiply-adds in order.
pub fn matmul_reference(c: &mut [f32], ldc: usize, a: MatRef<'_>, b: MatRef<'_>, init: Init) {
    let ([m, k], [_, n]) = (a.shape(), b.shape());
    for i in 0..m {
        for j in 0..n {
            let mut acc = match init {
                Init::Zero => 0.0,
                Init::Accumulate => c[i * ldc + j],
            };
            for p in 0..k {
                acc = a.at(i, p).mul_add(b.at(p, j), acc);
            }
            c[i * ldc + j] = acc;
        }
    }
}

#[cfg(test)]
mod tests;
