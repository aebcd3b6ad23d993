//! Products with a few rows of `A` that unpack each run of a packed `B` into vector registers and
//! multiply it into every row at once, never storing the unpacked values (decoding's few rows,
//! where unpacking costs more than multiplying). One loop over blocks and rows of `B`
//! ([`multiply_runs`]) serves both instruction sets; [`Lanes`] is what differs between them: the
//! register width, and how a run of nibbles or bytes becomes registers of codes.

use std::arch::x86_64::*;

use super::{Codes, GROUP, PackedMatrix};

/// `8 · NV` (AVX2) or `16 · NV` (AVX-512) columns of a packed matrix, multiplied into `MR` rows.
pub(crate) struct RegisterRun<'a> {
    pub(crate) b: &'a PackedMatrix,
    /// The first column, a multiple of the run's width when `B` holds nibbles.
    pub(crate) c0: usize,
}

impl RegisterRun<'_> {
    /// Whether columns `c0..c0 + 8·NV` are whole runs [`RegisterRun::multiply`] reads: inside the
    /// matrix and, for nibbles, 16 or 32 of them from a multiple of that width.
    pub(crate) fn fits<const NV: usize>(b: &PackedMatrix, c0: usize) -> bool {
        match NV {
            2 => b.one_group::<16>(c0),
            4 => b.one_group::<32>(c0),
            _ => false,
        }
    }

    /// `acc[i][v] ← fma(a[i][p], b[p][c0 + 8v + lane], acc[i][v])` for every row `p` of `B`, in
    /// order: element `(p, c)` unpacked as [`PackedMatrix::unpack_panel`] does (`scale · code`,
    /// then `+ offset`, each rounded once). `a` holds `MR` rows of `B`'s row count.
    ///
    /// # Panics
    /// When the columns do not fit ([`RegisterRun::fits`]) or a row of `a` is too short.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn multiply<const MR: usize, const NV: usize>(&self, a: [&[f32]; MR], acc: &mut [[__m256; NV]; MR]) {
        let (b, c0) = (self.b, self.c0);
        assert!(Self::fits::<NV>(b, c0), "columns {c0}.. of {b:?} in runs of {}", 8 * NV);
        let a = a.map(|row| &row[..b.rows]);
        let a = |p: usize| a.map(|row| row[p]);
        // SAFETY: this function runs only where the CPU has AVX2 and FMA, all `__m256`'s lanes use.
        unsafe {
            match b.exact_products {
                true => multiply_runs::<_, MR, NV, true>(b, c0, a, acc),
                false => multiply_runs::<_, MR, NV, false>(b, c0, a, acc),
            }
        }
    }

    /// Whether columns `c0..c0 + 16·NV` are whole runs [`RegisterRun::multiply_avx512`] reads:
    /// half a group (`NV = 1`) or a whole one (`NV = 2`), inside the matrix.
    pub(crate) fn fits_avx512<const NV: usize>(b: &PackedMatrix, c0: usize) -> bool {
        match NV {
            1 => b.one_group::<16>(c0),
            2 => b.one_group::<32>(c0),
            _ => false,
        }
    }

    /// [`RegisterRun::multiply`] sixteen lanes at a time, with AVX-512's 32 registers room for
    /// up to sixteen rows: each run of codes is unpacked once for all of them, the same chains
    /// in the same order. `a` holds the `MR` rows of `A` one step after another (`[k][MR]`).
    ///
    /// # Panics
    /// When the columns do not fit ([`RegisterRun::fits_avx512`]) or `a` is too short.
    #[target_feature(enable = "avx512f,fma")]
    pub(crate) fn multiply_avx512<const MR: usize, const NV: usize>(&self, a: &[f32], acc: &mut [[__m512; NV]; MR]) {
        let (b, c0) = (self.b, self.c0);
        assert!(
            Self::fits_avx512::<NV>(b, c0),
            "columns {c0}.. of {b:?} in runs of {}",
            16 * NV
        );
        let a = &a[..b.rows * MR];
        let step = |p: usize| -> [f32; MR] { a[p * MR..][..MR].try_into().expect("MR values") };
        // SAFETY: this function runs only where the CPU has AVX-512F and FMA, all `__m512`'s lanes use.
        unsafe {
            match b.exact_products {
                true => multiply_runs::<_, MR, NV, true>(b, c0, step, acc),
                false => multiply_runs::<_, MR, NV, false>(b, c0, step, acc),
            }
        }
    }
}

/// One instruction set's vector registers of `f32`, as [`multiply_runs`] uses them.
///
/// # Safety
/// Every method needs the CPU features of its implementation.
trait Lanes: Copy {
    /// Lanes per register.
    const WIDTH: usize;

    /// The first [`Lanes::WIDTH`] values of `values`.
    unsafe fn load(values: &[f32]) -> Self;

    /// Every lane `x`.
    unsafe fn splat(x: f32) -> Self;

    /// `scale · code`, then `+ offset`: two roundings (as the dense copy was made), or, with
    /// `EXACT` (`scale · code` known to round to itself), one fused multiply-add: the same bits.
    unsafe fn value<const EXACT: bool>(code: Self, scale: Self, offset: Option<Self>) -> Self;

    /// `a · w + acc`, one rounding.
    unsafe fn fma(a: Self, w: Self, acc: Self) -> Self;

    /// The `NV · WIDTH` codes of one row of a nibble group: `run` is the row's 16 bytes, whose
    /// low nibbles are the group's first 16 columns and high nibbles its last 16, the columns
    /// read starting at the nibble `shift` selects; `nibble + low` each.
    unsafe fn nibble_codes<const NV: usize>(run: &[u8], shift: u32, low: f32) -> [Self; NV];

    /// The `NV · WIDTH` codes of `run`, one signed byte each.
    unsafe fn byte_codes<const NV: usize>(run: &[i8]) -> [Self; NV];
}

impl Lanes for __m256 {
    const WIDTH: usize = 8;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load(values: &[f32]) -> Self {
        assert!(values.len() >= 8);
        // SAFETY: eight values, checked above.
        unsafe { _mm256_loadu_ps(values.as_ptr()) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn splat(x: f32) -> Self {
        _mm256_set1_ps(x)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn value<const EXACT: bool>(code: Self, scale: Self, offset: Option<Self>) -> Self {
        match offset {
            Some(offset) if EXACT => _mm256_fmadd_ps(scale, code, offset),
            Some(offset) => _mm256_add_ps(_mm256_mul_ps(scale, code), offset),
            None => _mm256_mul_ps(scale, code),
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fma(a: Self, w: Self, acc: Self) -> Self {
        _mm256_fmadd_ps(a, w, acc)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn nibble_codes<const NV: usize>(run: &[u8], shift: u32, low: f32) -> [Self; NV] {
        assert!(run.len() >= 16 && NV <= 4);
        // SAFETY: 16 bytes, checked above.
        let run = unsafe { _mm_loadu_si128(run.as_ptr().cast()) };
        let zero_low = low == 0.0;
        let (mask, low) = (_mm_set1_epi8(0x0F), _mm256_set1_ps(low));
        let halves = [
            _mm_and_si128(_mm_srl_epi16(run, _mm_cvtsi32_si128(shift as i32)), mask),
            _mm_and_si128(_mm_srli_epi16::<4>(run), mask),
        ];
        // Eight codes a register: each half's low eight bytes, then its high eight.
        std::array::from_fn(|v| {
            let eight = match v % 2 {
                0 => halves[v / 2],
                _ => _mm_srli_si128::<8>(halves[v / 2]),
            };
            let nibbles = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(eight));
            // Codes from 0 (Q4_1's) need no addition: `nibble + 0.0` is `nibble`, bit for bit.
            if zero_low { nibbles } else { _mm256_add_ps(nibbles, low) }
        })
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn byte_codes<const NV: usize>(run: &[i8]) -> [Self; NV] {
        assert!(run.len() >= 8 * NV);
        std::array::from_fn(|v| {
            // SAFETY: `8·v + 8 <= 8·NV`, checked above.
            let eight = unsafe { _mm_loadl_epi64(run.as_ptr().add(8 * v).cast()) };
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight))
        })
    }
}

impl Lanes for __m512 {
    const WIDTH: usize = 16;

    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn load(values: &[f32]) -> Self {
        assert!(values.len() >= 16);
        // SAFETY: sixteen values, checked above.
        unsafe { _mm512_loadu_ps(values.as_ptr()) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn splat(x: f32) -> Self {
        _mm512_set1_ps(x)
    }

    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn value<const EXACT: bool>(code: Self, scale: Self, offset: Option<Self>) -> Self {
        match offset {
            Some(offset) if EXACT => _mm512_fmadd_ps(scale, code, offset),
            Some(offset) => _mm512_add_ps(_mm512_mul_ps(scale, code), offset),
            None => _mm512_mul_ps(scale, code),
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn fma(a: Self, w: Self, acc: Self) -> Self {
        _mm512_fmadd_ps(a, w, acc)
    }

    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn nibble_codes<const NV: usize>(run: &[u8], shift: u32, low: f32) -> [Self; NV] {
        assert!(run.len() >= 16 && NV <= 2);
        // SAFETY: 16 bytes, checked above.
        let run = _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(run.as_ptr().cast()) });
        // Each code is a lookup: `vpermps` reads only the low four bits of each lane's index,
        // so a byte's low nibble indexes the table `nibble + low` as it stands, and its high
        // nibble after one shift (no masking, no conversion, no addition).
        let table = _mm512_add_ps(
            _mm512_setr_ps(0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12., 13., 14., 15.),
            _mm512_set1_ps(low),
        );
        let high = _mm512_srli_epi32::<4>(run);
        // Sixteen codes a register: the low nibbles, then the high (a whole group starts at
        // shift 0).
        let halves = [if shift == 0 { run } else { high }, high];
        std::array::from_fn(|v| _mm512_permutexvar_ps(halves[v], table))
    }

    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn byte_codes<const NV: usize>(run: &[i8]) -> [Self; NV] {
        assert!(run.len() >= 16 * NV);
        std::array::from_fn(|v| {
            // SAFETY: `16·v + 16 <= 16·NV`, checked above.
            let sixteen = unsafe { _mm_loadu_si128(run.as_ptr().add(16 * v).cast()) };
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sixteen))
        })
    }
}

/// `acc[i][v] ← fma(a(p)[i], b[p][c0 + WIDTH·v + lane], acc[i][v])` for every row `p` of `B` in
/// order, each run of codes unpacked once into `NV` registers (`scale · code`, then `+ offset`;
/// `EXACT`: `b`'s products are exact, [`Lanes::value`]) and multiplied into all `MR` rows. The
/// caller has checked that the columns are whole runs.
///
/// # Safety
/// The CPU has the features `L`'s methods need.
#[inline(always)]
unsafe fn multiply_runs<L: Lanes, const MR: usize, const NV: usize, const EXACT: bool>(
    b: &PackedMatrix,
    c0: usize,
    a: impl Fn(usize) -> [f32; MR],
    acc: &mut [[L; NV]; MR],
) {
    let width = L::WIDTH * NV;
    let first = b.scale_at(0, c0);
    for (blk, p0) in (0..b.rows).step_by(b.block).enumerate() {
        let rows = p0..b.rows.min(p0 + b.block);
        // This block's scales and offsets, each the `width` values at `at`.
        let at = first + blk * GROUP;
        prefetch_ahead(&b.scales[at..]);
        if let Some(offsets) = &b.offsets {
            prefetch_ahead(&offsets[at..]);
        }
        // SAFETY (here and below): the caller's CPU has `L`'s features.
        let load = |v: &[f32]| -> [L; NV] { std::array::from_fn(|j| unsafe { L::load(&v[at + L::WIDTH * j..]) }) };
        let scales = load(&b.scales);
        let offsets = b.offsets.as_deref().map(load);
        let offsets = offsets.as_ref();
        match &b.codes {
            Codes::Nibbles { bytes, low } => {
                // A group's rows are 16 bytes apart.
                let (start, shift) = b.nibble_at(p0, c0);
                let runs = bytes[start..start + 16 * rows.len()].chunks_exact(16);
                for (p, run) in rows.zip(runs) {
                    prefetch_ahead(run);
                    let codes = unsafe { L::nibble_codes::<NV>(run, shift, f32::from(*low)) };
                    unsafe { multiply_row::<L, MR, NV, EXACT>(acc, a(p), codes, &scales, offsets) };
                }
            }
            Codes::Bytes(codes) => {
                // A group's rows are `GROUP` bytes apart; the columns start `lane` into each.
                let lane = c0 % GROUP;
                let start = b.byte_at(p0, c0 - lane);
                let runs = codes[start..start + GROUP * rows.len()].chunks_exact(GROUP);
                for (p, run) in rows.zip(runs) {
                    prefetch_ahead(run);
                    let codes = unsafe { L::byte_codes::<NV>(&run[lane..lane + width]) };
                    unsafe { multiply_row::<L, MR, NV, EXACT>(acc, a(p), codes, &scales, offsets) };
                }
            }
        }
    }
}

/// `acc[i][v] ← fma(a[i], w[v], acc[i][v])`, `w` one row's elements from its `codes` and its
/// block's `scales` and `offsets` ([`Lanes::value`]).
///
/// A function that is always inlined, called directly, not from a closure: a closure's body is a
/// function of its own, without the instruction set of the function it sits in, and when one of
/// many rows was too big to inline, none of `L`'s methods could be inlined into it (decoding 16
/// rows on AVX-512 ran each multiply-add as a call, 30× slower).
///
/// # Safety
/// The CPU has the features `L`'s methods need.
#[inline(always)]
unsafe fn multiply_row<L: Lanes, const MR: usize, const NV: usize, const EXACT: bool>(
    acc: &mut [[L; NV]; MR],
    a: [f32; MR],
    codes: [L; NV],
    scales: &[L; NV],
    offsets: Option<&[L; NV]>,
) {
    let mut w = codes;
    for v in 0..NV {
        // SAFETY (here and below): the caller's CPU has `L`'s features.
        w[v] = unsafe { L::value::<EXACT>(codes[v], scales[v], offsets.map(|o| o[v])) };
    }
    for i in 0..MR {
        let a = unsafe { L::splat(a[i]) };
        for v in 0..NV {
            acc[i][v] = unsafe { L::fma(a, w[v], acc[i][v]) };
        }
    }
}

/// Asks for the bytes [`PREFETCH_BYTES`] past the start of `run` (a row of codes, or a block's
/// scales) to be brought into the cache. A packed product of a few rows reads each code once,
/// in order: without the hint, decoding one SmolLM2 token read its packed weights from memory
/// at 5 GB/s on a 2-core Xeon where the same products on cached weights ran 4× faster.
#[inline(always)]
fn prefetch_ahead<T>(run: &[T]) {
    crate::micro_kernel::prefetch(run.as_ptr().cast::<u8>().wrapping_add(PREFETCH_BYTES).cast(), 1);
}

/// How far ahead of the codes a packed product reads [`prefetch_ahead`] asks for.
const PREFETCH_BYTES: usize = 1024;
