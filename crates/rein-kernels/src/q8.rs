//! Products with a [`PackedMatrix`] whose activations are first quantised to 8 bits, as
//! llama.cpp quantises them for its integer dot products: a faster product that is *not* the
//! exact one (rollouts' `sampler.precision = "q8"`).
//!
//! Each row `a` of `A` is cut into the blocks of `B`'s scales (`block` steps of the inner
//! dimension) and each block quantised:
//!
//! ```text
//! d = max|aₖ| / 127,   qₖ = round(aₖ · (1/d))   (half away from zero; q = 0 when d = 0)
//! ```
//!
//! Then, with `Iᵦ = Σₖ qₖ · codeₖ` over the block's steps (integers: exact in any order),
//! every output is
//!
//! ```text
//! y = y₀;  for each block β, in order:  y ← fma(sᵦ, d·Iᵦ, y);  y ← fma(oᵦ, d·Σqₖ, y)  (with offsets)
//! ```
//!
//! each `·` one `f32` rounding. Only the integer sums differ in how they are computed (VNNI's
//! `vpdpbusd`, AVX2's `vpmaddubsw`, plain loops), so every instruction set gives the same bits
//! here too — not the exact product's bits, which is the price of the speed.
//!
//! The integer dot products want four consecutive steps of one column in one 32-bit lane, not
//! the columns side by side of the exact path's layout, so the codes are copied once into that
//! order the first time a matrix meets a q8 product ([`crate::packed::quads`]): a second copy,
//! as large as the codes, held only by matrices that have been used so.

use crate::init::Init;
use crate::isa::Isa;
use crate::mat_ref::MatRef;
use crate::packed::quads::Quads;
use crate::packed::{GROUP, PackedMatrix};

/// The instructions a q8 product's integer dot products run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Vnni,
}

impl Kernel {
    fn on(isa: Isa) -> Kernel {
        #[cfg(target_arch = "x86_64")]
        {
            if isa == Isa::Avx512
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vnni")
            {
                return Kernel::Vnni;
            }
            if isa >= Isa::Avx2 {
                return Kernel::Avx2;
            }
        }
        let _ = isa;
        Kernel::Portable
    }
}

/// One row of `A`, quantised block by block (see the module docs).
struct QuantRow {
    /// `q`, padded with zeros to whole blocks.
    codes: Vec<i8>,
    /// `d` per block.
    scales: Vec<f32>,
    /// `Σq` per block.
    sums: Vec<i32>,
    /// `d · Σq` per block.
    scaled_sums: Vec<f32>,
}

impl QuantRow {
    /// Row `r` of `a`.
    fn new(a: MatRef<'_>, r: usize, block: usize) -> Self {
        match a.row(r) {
            Some(values) => Self::of(values, block),
            None => Self::of(&(0..a.shape()[1]).map(|p| a.at(r, p)).collect::<Vec<_>>(), block),
        }
    }

    fn of(values: &[f32], block: usize) -> Self {
        let k = values.len();
        let blocks = k.div_ceil(block);
        let mut row = QuantRow {
            codes: vec![0; blocks * block],
            scales: Vec::with_capacity(blocks),
            sums: Vec::with_capacity(blocks),
            scaled_sums: Vec::with_capacity(blocks),
        };
        let chunks = values.chunks(block).zip(row.codes.chunks_mut(block));
        for (values, codes) in chunks {
            // The largest magnitude by its bits (`|v|`'s bits order as `|v|` does), so that a NaN,
            // whose bits are above infinity's, stays the maximum and reaches every output as it
            // would the exact product's; and a loop that vectorises.
            let amax = f32::from_bits(values.iter().map(|v| v.to_bits() & 0x7FFF_FFFF).max().unwrap_or(0));
            let d = amax / 127.0;
            let inverse = match d > 0.0 && (1.0 / d).is_finite() {
                true => 1.0 / d,
                false => 0.0,
            };
            let mut sum = 0i32;
            for (&v, code) in values.iter().zip(codes.iter_mut()) {
                let q = round_half_away(v * inverse);
                *code = q as i8;
                sum += q;
            }
            row.scales.push(d);
            row.sums.push(sum);
            row.scaled_sums.push(d * sum as f32);
        }
        row
    }

    /// Step `4j..4j + 4`'s codes as one little-endian `i32`.
    #[inline(always)]
    fn quad(&self, j: usize) -> i32 {
        let codes: [i8; 4] = self.codes[4 * j..4 * j + 4].try_into().expect("four codes");
        i32::from_le_bytes(codes.map(|q| q as u8))
    }
}

/// `x.round()` (halves away from zero) as an integer, for `|x| < 2³¹` (0 for NaN), without the
/// `roundf` call `f32::round` is on CPUs below SSE4.1: the truncation `t` is one instruction and
/// `x − t` is exact.
#[inline(always)]
fn round_half_away(x: f32) -> i32 {
    let t = x as i32;
    let fraction = x - t as f32;
    t + i32::from(fraction >= 0.5) - i32::from(fraction <= -0.5)
}

/// `C ← C₀ + A·B` with each row of `A` first quantised to 8 bits per block of `B`'s scales, as
/// llama.cpp quantises activations, and integer dot products, on the active instruction set
/// ([`Isa::active`]): faster than [`crate::matmul_packed`] and not exact (see the module docs
/// for the definition, the same bits on every instruction set). Matrices whose blocks are not
/// whole quads of rows ([`PackedMatrix::reads_q8`]) get the exact product.
///
/// # Panics
/// As [`crate::matmul`].
pub fn matmul_packed_q8(c: &mut [f32], ldc: usize, a: MatRef<'_>, b: &PackedMatrix, init: Init) {
    let isa = Isa::active();
    crate::matmul::check_shapes(isa, c, ldc, a, b.shape());
    product(isa, c, ldc, a, b, init)
}

/// [`matmul_packed_q8`] on `isa` (which must be available), `C` checked by the caller.
fn product(isa: Isa, c: &mut [f32], ldc: usize, a: MatRef<'_>, b: &PackedMatrix, init: Init) {
    let ([m, k], n) = (a.shape(), b.cols);
    if !b.reads_q8() || m == 0 || n == 0 || k == 0 {
        return crate::matmul::matmul_packed_on(isa, c, ldc, a, b, init);
    }
    let rows: Vec<QuantRow> = (0..m).map(|r| QuantRow::new(a, r, b.block)).collect();
    let (kernel, groups) = (Kernel::on(isa), n.div_ceil(GROUP));
    // Decoding's few rows split by what they read; more rows by what they compute.
    let worth_splitting = match m >= 16 {
        true => m * n * k >= PARALLEL_Q8_WORK,
        false => n * k >= PARALLEL_Q8,
    };
    let tasks = if worth_splitting {
        crate::team::threads().min(groups)
    } else {
        1
    };
    let out = SharedOut(c.as_mut_ptr());
    let run = |task: usize| {
        for g in groups * task / tasks..groups * (task + 1) / tasks {
            for chunk in rows.chunks(4).enumerate() {
                // SAFETY: each task writes only its own groups' columns of rows of `C`, which
                // the caller checked it covers.
                unsafe { multiply_group(kernel, &out, ldc, b, g, chunk, init) };
            }
        }
    };
    match tasks {
        1 => run(0),
        _ => crate::team::run(tasks, &run),
    }
}

/// Elements of `B` from which a q8 product of fewer than 16 rows is split across threads. On a
/// 2-vCPU Xeon (VNNI) one-row products ran, alone and split: 576 × 576 8.3 and 10.6 µs,
/// 576 × 960 12.2 and 9.4 µs, 576 × 1536 17.7 and 12.0 µs, 1536 × 576 20.8 and 15.7 µs.
const PARALLEL_Q8: usize = 1 << 19;

/// Multiply-adds from which a q8 product of 16 rows or more is split across threads. On the
/// 2-vCPU Xeon a 576 × 1536 product took 157 µs alone and 98 µs split at 16 rows.
const PARALLEL_Q8_WORK: usize = 1 << 21;

/// `C`'s first element, shared by tasks that write disjoint columns.
struct SharedOut(*mut f32);

// SAFETY: tasks write disjoint elements through it (see `product`).
unsafe impl Sync for SharedOut {}

/// Columns `32g..` of the rows `chunk` (rows `4·i..`) of `C`.
///
/// # Safety
/// `out` covers those rows and columns at stride `ldc`, and no other thread touches them.
unsafe fn multiply_group(
    kernel: Kernel,
    out: &SharedOut,
    ldc: usize,
    b: &PackedMatrix,
    g: usize,
    (i, chunk): (usize, &[QuantRow]),
    init: Init,
) {
    let width = GROUP.min(b.cols - g * GROUP);
    let mut tile = [[0.0f32; GROUP]; 4];
    let at = |r: usize| (4 * i + r) * ldc + g * GROUP;
    if init == Init::Accumulate {
        for (r, row) in tile.iter_mut().enumerate().take(chunk.len()) {
            // SAFETY: inside `C` (the caller's promise).
            unsafe { std::ptr::copy_nonoverlapping(out.0.add(at(r)), row.as_mut_ptr(), width) };
        }
    }
    match kernel {
        Kernel::Portable => portable(b, g, chunk, &mut tile),
        // SAFETY: `Kernel::on` chose these only where the CPU has their features.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { avx2::tile(b, g, chunk, &mut tile) },
        #[cfg(target_arch = "x86_64")]
        Kernel::Vnni => unsafe { vnni::tile(b, g, chunk, &mut tile) },
    }
    for (r, row) in tile.iter().enumerate().take(chunk.len()) {
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), out.0.add(at(r)), width) };
    }
}

/// Asks for the bytes [`PREFETCH_BYTES`] past the start of `run` (a quad of codes, or a
/// block's scales) to be brought into the cache: a product of a few rows reads each code
/// once, in order, and waits on memory for most of its time.
#[inline(always)]
fn prefetch_ahead<T>(run: &[T]) {
    crate::micro_kernel::prefetch(run.as_ptr().cast::<u8>().wrapping_add(PREFETCH_BYTES).cast(), 1);
}

/// How far ahead [`prefetch_ahead`] asks. Four times the exact path's distance: its codes go
/// by faster. Decoding SmolLM2 at batch 1 on a 2-vCPU Xeon took ~15% less time with 4–8 KiB
/// than with 1 KiB.
const PREFETCH_BYTES: usize = 4096;

/// The scales (and offsets) of block `β` of group `g`: 32 columns each.
fn block_scales(b: &PackedMatrix, g: usize, beta: usize) -> (&[f32], Option<&[f32]>) {
    let at = (g * b.rows.div_ceil(b.block) + beta) * GROUP;
    (
        &b.scales[at..at + GROUP],
        b.offsets.as_ref().map(|o| &o[at..at + GROUP]),
    )
}

/// `y ← fma(s, d·I, y)`, then `y ← fma(o, d·Σq, y)`: the float part of a block (module docs).
#[inline(always)]
fn add_block(y: f32, dot: i32, row: &QuantRow, beta: usize, scale: f32, offset: Option<f32>) -> f32 {
    let y = scale.mul_add(row.scales[beta] * dot as f32, y);
    match offset {
        Some(o) => o.mul_add(row.scaled_sums[beta], y),
        None => y,
    }
}

/// The tile in plain loops: the definition the vector kernels match bit for bit.
fn portable(b: &PackedMatrix, g: usize, rows: &[QuantRow], tile: &mut [[f32; GROUP]; 4]) {
    let (per_block, base) = (b.quads_per_block(), g * b.quads_per_group());
    let quads = b.quads();
    let stored = |j: usize, c: usize, t: usize| match quads {
        Quads::Nibbles(q) => i32::from((q[(base + j) * 64 + 4 * (c % 16) + t] >> (c / 16 * 4)) & 0x0F),
        Quads::Bytes(q) => i32::from(q[(base + j) * 128 + 4 * c + t]),
    };
    for beta in 0..b.rows.div_ceil(b.block) {
        let (scales, offsets) = block_scales(b, g, beta);
        for (row, y) in rows.iter().zip(tile.iter_mut()) {
            for (c, y) in y.iter_mut().enumerate() {
                let mut dot = b.stored_low() * row.sums[beta];
                for j in beta * per_block..(beta + 1) * per_block {
                    for t in 0..4 {
                        dot += i32::from(row.codes[4 * j + t]) * stored(j, c, t);
                    }
                }
                *y = add_block(*y, dot, row, beta, scales[c], offsets.map(|o| o[c]));
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    //! AVX-512 VNNI: `vpdpbusd` adds four `u8 · i8` products into each 32-bit lane.

    use std::arch::x86_64::*;

    use super::{GROUP, PackedMatrix, Quads, QuantRow, block_scales, prefetch_ahead};

    /// [`super::portable`] sixteen columns per register.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
    pub(super) fn tile(b: &PackedMatrix, g: usize, rows: &[QuantRow], tile: &mut [[f32; GROUP]; 4]) {
        match rows.len() {
            1 => rows_of::<1>(b, g, rows, tile),
            2 => rows_of::<2>(b, g, rows, tile),
            3 => rows_of::<3>(b, g, rows, tile),
            _ => rows_of::<4>(b, g, rows, tile),
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
    fn rows_of<const R: usize>(b: &PackedMatrix, g: usize, rows: &[QuantRow], tile: &mut [[f32; GROUP]; 4]) {
        let rows: &[QuantRow; R] = rows.try_into().expect("R rows");
        let (per_block, base) = (b.quads_per_block(), g * b.quads_per_group());
        let (nibble, flip, quads) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(i8::MIN), b.quads());
        // Bytes are multiplied as `code + 128` (`vpdpbusd` wants one operand unsigned).
        let low = match quads {
            Quads::Nibbles(_) => b.stored_low(),
            Quads::Bytes(_) => -128,
        };
        // SAFETY: `tile` rows are 32 floats, two registers; the quads and scales read are
        // inside their vectors (`quads_per_group` per group, `GROUP` scales per block).
        unsafe {
            let mut y: [[__m512; 2]; R] = std::array::from_fn(|r| {
                [
                    _mm512_loadu_ps(tile[r].as_ptr()),
                    _mm512_loadu_ps(tile[r].as_ptr().add(16)),
                ]
            });
            for beta in 0..b.rows.div_ceil(b.block) {
                let mut dot = [[_mm512_setzero_si512(); 2]; R];
                for j in beta * per_block..(beta + 1) * per_block {
                    add_quad(codes(quads, base + j, nibble, flip), rows, j, &mut dot);
                }
                let (scales, offsets) = block_scales(b, g, beta);
                prefetch_ahead(scales);
                offsets.map(prefetch_ahead);
                for ((row, dot), y) in rows.iter().zip(dot).zip(y.iter_mut()) {
                    let correction = _mm512_set1_epi32(low * row.sums[beta]);
                    let d = _mm512_set1_ps(row.scales[beta]);
                    for h in 0..2 {
                        let dot = _mm512_cvtepi32_ps(_mm512_add_epi32(dot[h], correction));
                        let scale = _mm512_loadu_ps(scales.as_ptr().add(16 * h));
                        y[h] = _mm512_fmadd_ps(scale, _mm512_mul_ps(d, dot), y[h]);
                        if let Some(offsets) = offsets {
                            let offset = _mm512_loadu_ps(offsets.as_ptr().add(16 * h));
                            y[h] = _mm512_fmadd_ps(offset, _mm512_set1_ps(row.scaled_sums[beta]), y[h]);
                        }
                    }
                }
            }
            for (r, y) in y.iter().enumerate() {
                _mm512_storeu_ps(tile[r].as_mut_ptr(), y[0]);
                _mm512_storeu_ps(tile[r].as_mut_ptr().add(16), y[1]);
            }
        }
    }

    /// Quad `at`'s codes as two registers of bytes `vpdpbusd` reads unsigned: the group's first
    /// and last 16 columns, four steps each.
    #[inline(always)]
    unsafe fn codes(quads: &Quads, at: usize, nibble: __m512i, flip: __m512i) -> [__m512i; 2] {
        // SAFETY: the caller's quad is inside the codes; the CPU has AVX-512F and BW.
        unsafe {
            match quads {
                Quads::Nibbles(q) => {
                    prefetch_ahead(&q[at * 64..]);
                    let v = _mm512_loadu_si512(q.as_ptr().add(at * 64).cast());
                    [
                        _mm512_and_si512(v, nibble),
                        _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble),
                    ]
                }
                Quads::Bytes(q) => {
                    prefetch_ahead(&q[at * 128..]);
                    prefetch_ahead(&q[at * 128 + 64..]);
                    let at = q.as_ptr().add(at * 128);
                    [
                        _mm512_xor_si512(_mm512_loadu_si512(at.cast()), flip),
                        _mm512_xor_si512(_mm512_loadu_si512(at.add(64).cast()), flip),
                    ]
                }
            }
        }
    }

    /// `dot[r][h] += codes[h] · q` four steps per lane, `q` quad `j` of row `r`.
    #[inline(always)]
    unsafe fn add_quad<const R: usize>(
        codes: [__m512i; 2],
        rows: &[QuantRow; R],
        j: usize,
        dot: &mut [[__m512i; 2]; R],
    ) {
        for (row, dot) in rows.iter().zip(dot.iter_mut()) {
            // SAFETY: the CPU has AVX-512 VNNI (the caller's promise).
            unsafe {
                let a = _mm512_set1_epi32(row.quad(j));
                dot[0] = _mm512_dpbusd_epi32(dot[0], codes[0], a);
                dot[1] = _mm512_dpbusd_epi32(dot[1], codes[1], a);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! AVX2: `vpmaddubsw` multiplies `u8 · i8` and adds pairs into 16 bits, `vpmaddwd` by ones
    //! adds those pairs into 32 bits. Eight columns per register, two registers (a half group)
    //! per pass.

    use std::arch::x86_64::*;

    use super::{GROUP, PackedMatrix, Quads, QuantRow, block_scales, prefetch_ahead};

    /// [`super::portable`] eight columns per register.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn tile(b: &PackedMatrix, g: usize, rows: &[QuantRow], tile: &mut [[f32; GROUP]; 4]) {
        for (pair, tile) in rows.chunks(2).zip(tile.chunks_mut(2)) {
            for half in 0..2 {
                match pair.len() {
                    1 => half_of::<1>(b, g, half, pair, tile),
                    _ => half_of::<2>(b, g, half, pair, tile),
                }
            }
        }
    }

    /// The 16 columns of `half`: nibbles' low nibbles of bytes `32·half..` are columns
    /// `8·half..`, their high nibbles `16 + 8·half..`; bytes' are columns `16·half..`.
    #[target_feature(enable = "avx2,fma")]
    fn half_of<const R: usize>(b: &PackedMatrix, g: usize, half: usize, rows: &[QuantRow], tile: &mut [[f32; GROUP]]) {
        let rows: &[QuantRow; R] = rows.try_into().expect("R rows");
        let (per_block, base) = (b.quads_per_block(), g * b.quads_per_group());
        let quads = b.quads();
        let columns = match quads {
            Quads::Nibbles(_) => [8 * half, 16 + 8 * half],
            Quads::Bytes(_) => [16 * half, 16 * half + 8],
        };
        // SAFETY: the columns read and written are inside `tile`'s 32 and the block's 32
        // scales; the quads read are inside the group's.
        unsafe {
            let nibble = _mm256_set1_epi8(0x0F);
            let ones = _mm256_set1_epi16(1);
            let mut y: [[__m256; 2]; R] =
                std::array::from_fn(|r| columns.map(|c| _mm256_loadu_ps(tile[r].as_ptr().add(c))));
            for beta in 0..b.rows.div_ceil(b.block) {
                let mut dot = [[_mm256_setzero_si256(); 2]; R];
                for j in beta * per_block..(beta + 1) * per_block {
                    match quads {
                        Quads::Nibbles(q) => {
                            prefetch_ahead(&q[(base + j) * 64 + 32 * half..]);
                            let v = _mm256_loadu_si256(q.as_ptr().add((base + j) * 64 + 32 * half).cast());
                            let codes = [
                                _mm256_and_si256(v, nibble),
                                _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble),
                            ];
                            for (row, dot) in rows.iter().zip(dot.iter_mut()) {
                                let a = _mm256_set1_epi32(row.quad(j));
                                for h in 0..2 {
                                    // Each pair at most 2 · 15 · 127: no saturation.
                                    let pairs = _mm256_maddubs_epi16(codes[h], a);
                                    dot[h] = _mm256_add_epi32(dot[h], _mm256_madd_epi16(pairs, ones));
                                }
                            }
                        }
                        Quads::Bytes(q) => {
                            prefetch_ahead(&q[(base + j) * 128 + 64 * half..]);
                            let at = q.as_ptr().add((base + j) * 128 + 64 * half);
                            let codes = [_mm256_loadu_si256(at.cast()), _mm256_loadu_si256(at.add(32).cast())];
                            for (row, dot) in rows.iter().zip(dot.iter_mut()) {
                                let a = _mm256_set1_epi32(row.quad(j));
                                for h in 0..2 {
                                    // |code| · (±q): each pair at most 2 · 128 · 127, no saturation.
                                    let magnitude = _mm256_abs_epi8(codes[h]);
                                    let pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(a, codes[h]));
                                    dot[h] = _mm256_add_epi32(dot[h], _mm256_madd_epi16(pairs, ones));
                                }
                            }
                        }
                    }
                }
                let (scales, offsets) = block_scales(b, g, beta);
                prefetch_ahead(scales);
                offsets.map(prefetch_ahead);
                for ((row, dot), y) in rows.iter().zip(dot).zip(y.iter_mut()) {
                    let correction = _mm256_set1_epi32(b.stored_low() * row.sums[beta]);
                    let d = _mm256_set1_ps(row.scales[beta]);
                    for h in 0..2 {
                        let dot = _mm256_cvtepi32_ps(_mm256_add_epi32(dot[h], correction));
                        let scale = _mm256_loadu_ps(scales.as_ptr().add(columns[h]));
                        y[h] = _mm256_fmadd_ps(scale, _mm256_mul_ps(d, dot), y[h]);
                        if let Some(offsets) = offsets {
                            let offset = _mm256_loadu_ps(offsets.as_ptr().add(columns[h]));
                            y[h] = _mm256_fmadd_ps(offset, _mm256_set1_ps(row.scaled_sums[beta]), y[h]);
                        }
                    }
                }
            }
            for (r, y) in y.iter().enumerate() {
                for h in 0..2 {
                    _mm256_storeu_ps(tile[r].as_mut_ptr().add(columns[h]), y[h]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packed::tests::{sample, with_f16_scales};

    fn rows(m: usize, k: usize, seed: u32) -> Vec<f32> {
        (0..m * k)
            .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// The module docs' definition, written out from the dense codes.
    fn reference(a: &[f32], [m, k]: [usize; 2], b: &PackedMatrix, c0: &[f32]) -> Vec<f32> {
        let n = b.cols;
        let (codes, scales, offsets) = (b.codes(), b.scales(), b.offsets());
        let view = MatRef::row_major(a, m, k).unwrap();
        let mut out = c0.to_vec();
        for i in 0..m {
            let row = QuantRow::new(view, i, b.block);
            for c in 0..n {
                for beta in 0..k.div_ceil(b.block) {
                    let steps = beta * b.block..k.min((beta + 1) * b.block);
                    let dot: i32 = steps
                        .map(|p| i32::from(row.codes[p]) * i32::from(codes[p * n + c]))
                        .sum();
                    let offset = offsets.as_ref().map(|o| o[beta * n + c]);
                    out[i * n + c] = add_block(out[i * n + c], dot, &row, beta, scales[beta * n + c], offset);
                }
            }
        }
        out
    }

    fn kernels() -> Vec<Isa> {
        Isa::available()
    }

    #[test]
    fn every_instruction_set_gives_the_definitions_bits() {
        let cases = [
            // (m, k, n, block, code range, offsets)
            (1, 64, 32, 32, (0, 15), true),      // Q4_1
            (3, 96, 70, 32, (-8, 7), false),     // Q4_0, a partial group
            (5, 50, 33, 8, (-8, 7), true),       // a partial block
            (2, 64, 96, 32, (-127, 127), false), // Q8_0
            (6, 40, 40, 4, (-128, 127), true),   // bytes at both ends
            (16, 576, 64, 32, (0, 15), true),
            (1, 1024, 2048, 32, (0, 15), true), // split across threads by what it reads
            (32, 256, 2050, 32, (-8, 7), false), // and by what it computes
        ];
        for (m, k, n, block, range, offsets) in cases {
            let b = with_f16_scales(&sample(k, n, block, range, offsets));
            let a = rows(m, k, (m * k + n) as u32);
            let c0 = rows(m, n, 7);
            let expected = reference(&a, [m, k], &b, &c0);
            for isa in kernels() {
                for init in [Init::Accumulate, Init::Zero] {
                    let mut c = c0.clone();
                    product(isa, &mut c, n, MatRef::row_major(&a, m, k).unwrap(), &b, init);
                    let want = match init {
                        Init::Accumulate => expected.clone(),
                        Init::Zero => reference(&a, [m, k], &b, &vec![0.0; m * n]),
                    };
                    let same = c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(
                        same,
                        "{isa}, {m}×{k}·{k}×{n} in blocks of {block}, codes {range:?}, {init:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn q8_products_stay_close_to_the_exact_ones() {
        let b = with_f16_scales(&sample(576, 96, 32, (0, 15), true));
        let a = rows(4, 576, 3);
        let view = MatRef::row_major(&a, 4, 576).unwrap();
        let (mut exact, mut fast) = (vec![0.0; 4 * 96], vec![0.0; 4 * 96]);
        crate::matmul::matmul_packed(&mut exact, 96, view, &b, Init::Zero);
        product(Isa::active(), &mut fast, 96, view, &b, Init::Zero);
        let scale = exact.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
        let worst = exact
            .iter()
            .zip(&fast)
            .map(|(e, f)| (e - f).abs())
            .fold(0.0f32, f32::max);
        // Each activation is off by at most half a step, d/2 = max|a|/254, relatively.
        assert!(worst > 0.0 && worst < 0.02 * scale, "worst error {worst} of {scale}");
    }

    #[test]
    fn rounding_halves_away_from_zero_as_f32_round_does() {
        let edges = [
            0.5,
            -0.5,
            1.5,
            -2.5,
            0.49999997,
            -0.49999997,
            126.5,
            -127.0,
            127.00001,
            0.0,
            -0.0,
        ];
        let mut state = 1u32;
        let random = (0..100_000).map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1 << 24) as f32 * 256.0 - 128.0
        });
        for x in edges.into_iter().chain(random) {
            assert_eq!(round_half_away(x), x.round() as i32, "{x}");
        }
        assert_eq!(round_half_away(f32::NAN), 0);
    }

    #[test]
    fn zero_nan_and_tiny_activations() {
        let b = sample(64, 32, 32, (-8, 7), false);
        for (value, check) in [
            (0.0f32, (|y: f32| y == 0.0) as fn(f32) -> bool),
            (f32::MIN_POSITIVE / 4.0, |y: f32| y == 0.0),
            (f32::NAN, |y: f32| y.is_nan()),
            (f32::INFINITY, |y: f32| y.is_nan()),
        ] {
            let mut a = vec![0.0; 64];
            a[5] = value;
            for isa in kernels() {
                let mut c = vec![0.0; 32];
                product(isa, &mut c, 32, MatRef::row_major(&a, 1, 64).unwrap(), &b, Init::Zero);
                assert!(c.iter().all(|&y| check(y)), "{isa}, a = {value}: {c:?}");
            }
        }
    }

    #[test]
    fn blocks_not_whole_quads_take_the_exact_product() {
        let b = sample(30, 20, 6, (0, 15), true);
        assert!(!b.reads_q8());
        let a = rows(2, 30, 1);
        let view = MatRef::row_major(&a, 2, 30).unwrap();
        let (mut exact, mut fast) = (vec![0.0; 40], vec![0.0; 40]);
        crate::matmul::matmul_packed(&mut exact, 20, view, &b, Init::Zero);
        matmul_packed_q8(&mut fast, 20, view, &b, Init::Zero);
        assert_eq!(exact, fast);
    }
}
