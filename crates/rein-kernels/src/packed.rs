//! Matrices kept as small integer codes with a scale (and an offset) per block of rows, the way
//! llama.cpp's quantised files store weights: element `(r, c)` is
//!
//! ```text
//! w[r][c] = s[r / block][c] · q[r][c]              (no offsets)
//! w[r][c] = s[r / block][c] · q[r][c] + o[r / block][c]
//! ```
//!
//! each operation one IEEE `f32` rounding, in that order — exactly how a GGUF file's tensors are
//! dequantised at conversion. So a product with a [`PackedMatrix`] ([`crate::matmul::matmul_packed`])
//! unpacks each panel of `B` into the same `f32` values a dense copy holds and runs the same
//! micro-kernel over them: the same bits as the dense product, reading 4 to 8 bits per element
//! from memory instead of 32.
//!
//! When every `scale · code` is an `f32` exactly (a GGUF block's scale is an `f16`: 11
//! significant bits, and a 4- or 8-bit code adds at most 8), the first rounding is no rounding,
//! and decoding's register path computes `scale · code + offset` in one fused multiply-add: the
//! same bits, one instruction fewer per element ([`products_exact`]).
//!
//! Codes that all fit in 16 consecutive integers are kept as nibbles, others as bytes. Both, and
//! the scales and offsets, are stored a group of 32 columns at a time, each group's rows one
//! after another: a product walks down a few columns through every row, so what it reads next
//! is what lies next in memory (a row-major layout made decoding read 16 bytes from each 768-byte
//! row, at 3.9 GB/s).

use rayon::prelude::*;

use crate::mat_ref::MatRef;

pub(crate) mod quads;
#[cfg(target_arch = "x86_64")]
mod register_run;

#[cfg(target_arch = "x86_64")]
pub(crate) use register_run::RegisterRun;

/// A row-major `rows × cols` matrix of block-scaled integer codes (see the module docs).
#[derive(Clone, PartialEq)]
pub struct PackedMatrix {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) block: usize,
    codes: Codes,
    /// `[groups][rows.div_ceil(block)][GROUP]` (see [`PackedMatrix::scale_at`]).
    pub(crate) scales: Vec<f32>,
    /// As `scales`, when elements have an offset.
    pub(crate) offsets: Option<Vec<f32>>,
    /// Whether `scale · code` is an `f32` exactly for every scale and code (see
    /// [`products_exact`]), so that `scale · code + offset` rounds once: one fused multiply-add
    /// gives the element's bits.
    exact_products: bool,
    /// The codes in the order of integer dot products, once a q8 product has asked for them.
    quad_codes: quads::QuadCodes,
}

#[derive(Clone, PartialEq)]
enum Codes {
    /// Two codes per byte, `code = nibble + low`: each row of a group of 32 columns is 16 bytes
    /// whose low nibbles are its first 16 columns and high nibbles its last 16, so 16
    /// neighbouring columns unpack from 16 neighbouring bytes with one shift
    /// ([`PackedMatrix::nibble_at`]).
    Nibbles { bytes: Vec<u8>, low: i8 },
    /// One signed byte per code, each row of a group 32 bytes ([`PackedMatrix::byte_at`]).
    Bytes(Vec<i8>),
}

/// Columns stored together (see the module docs).
pub(crate) const GROUP: usize = 32;

/// Why [`PackedMatrix::new`] refused its parts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a packed {rows}×{cols} matrix in blocks of {block} rows: {reason}")]
pub struct PackError {
    rows: usize,
    cols: usize,
    block: usize,
    reason: String,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedMatrix")
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("block", &self.block)
            .field("bits", &self.bits())
            .field("offsets", &self.offsets.is_some())
            .finish()
    }
}

impl PackedMatrix {
    /// A `rows × cols` matrix from its codes (row-major), one scale per block of `block` rows of
    /// each column (`[rows.div_ceil(block)][cols]`, row-major) and, optionally, one offset each.
    pub fn new(
        [rows, cols]: [usize; 2],
        block: usize,
        codes: &[i8],
        scales: Vec<f32>,
        offsets: Option<Vec<f32>>,
    ) -> Result<Self, PackError> {
        let error = |reason: String| PackError {
            rows,
            cols,
            block,
            reason,
        };
        if block == 0 {
            return Err(error("blocks must hold at least one row".into()));
        }
        if codes.len() != rows * cols {
            return Err(error(format!("{} codes, expected {}", codes.len(), rows * cols)));
        }
        let per_block = rows.div_ceil(block) * cols;
        if scales.len() != per_block {
            return Err(error(format!("{} scales, expected {per_block}", scales.len())));
        }
        if let Some(offsets) = &offsets
            && offsets.len() != per_block
        {
            return Err(error(format!("{} offsets, expected {per_block}", offsets.len())));
        }
        let low = codes.iter().copied().min().unwrap_or(0);
        let high = codes.iter().copied().max().unwrap_or(0);
        let groups = cols.div_ceil(GROUP);
        let widest = i16::from(low).unsigned_abs().max(i16::from(high).unsigned_abs());
        let exact_products = products_exact(&scales, u32::from(widest));
        let mut m = Self {
            rows,
            cols,
            block,
            codes: Codes::Bytes(Vec::new()),
            scales: vec![0.0; groups * rows.div_ceil(block) * GROUP],
            offsets: offsets
                .as_ref()
                .map(|_| vec![0.0; groups * rows.div_ceil(block) * GROUP]),
            exact_products,
            quad_codes: quads::QuadCodes::default(),
        };
        m.codes = if i16::from(high) - i16::from(low) < 16 {
            let mut bytes = vec![0u8; groups * rows * GROUP / 2];
            for (r, row) in codes.chunks_exact(cols.max(1)).enumerate().take(rows) {
                for (c, &code) in row.iter().enumerate() {
                    let (at, shift) = m.nibble_at(r, c);
                    bytes[at] |= ((i16::from(code) - i16::from(low)) as u8) << shift;
                }
            }
            Codes::Nibbles { bytes, low }
        } else {
            let mut bytes = vec![0i8; groups * rows * GROUP];
            for (r, row) in codes.chunks_exact(cols.max(1)).enumerate().take(rows) {
                for (c, &code) in row.iter().enumerate() {
                    bytes[m.byte_at(r, c)] = code;
                }
            }
            Codes::Bytes(bytes)
        };
        for (b, row) in scales.chunks_exact(cols.max(1)).enumerate() {
            for (c, &scale) in row.iter().enumerate() {
                let at = m.scale_at(b * block, c);
                m.scales[at] = scale;
            }
        }
        if let (Some(given), Some(stored)) = (&offsets, &mut m.offsets) {
            for (b, row) in given.chunks_exact(cols.max(1)).enumerate() {
                for (c, &offset) in row.iter().enumerate() {
                    stored[(c / GROUP * rows.div_ceil(block) + b) * GROUP + c % GROUP] = offset;
                }
            }
        }
        Ok(m)
    }

    /// The byte holding nibble `(r, c)` and its shift.
    fn nibble_at(&self, r: usize, c: usize) -> (usize, u32) {
        (
            (c / GROUP * self.rows + r) * (GROUP / 2) + c % 16,
            ((c % GROUP) / 16) as u32 * 4,
        )
    }

    /// Where byte code `(r, c)` is.
    fn byte_at(&self, r: usize, c: usize) -> usize {
        (c / GROUP * self.rows + r) * GROUP + c % GROUP
    }

    /// Where the scale (and offset) of element `(r, c)` is; those of the columns after `c` up
    /// to the end of its group follow it.
    fn scale_at(&self, r: usize, c: usize) -> usize {
        (c / GROUP * self.rows.div_ceil(self.block) + r / self.block) * GROUP + c % GROUP
    }

    /// `[rows, cols]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    /// Rows per scale.
    pub fn block(&self) -> usize {
        self.block
    }

    /// The codes, row-major (what [`PackedMatrix::new`] took).
    pub fn codes(&self) -> Vec<i8> {
        (0..self.rows)
            .flat_map(|r| (0..self.cols).map(move |c| (r, c)))
            .map(|(r, c)| self.code(r, c) as i8)
            .collect()
    }

    /// The scales, `[rows.div_ceil(block)][cols]` (what [`PackedMatrix::new`] took).
    pub fn scales(&self) -> Vec<f32> {
        self.per_block(&self.scales)
    }

    /// The offsets, as the scales, if elements have them.
    pub fn offsets(&self) -> Option<Vec<f32>> {
        self.offsets.as_ref().map(|o| self.per_block(o))
    }

    /// `stored` (scales or offsets) as `[rows.div_ceil(block)][cols]`.
    fn per_block(&self, stored: &[f32]) -> Vec<f32> {
        (0..self.rows.div_ceil(self.block))
            .flat_map(|b| (0..self.cols).map(move |c| (b, c)))
            .map(|(b, c)| stored[self.scale_at(b * self.block, c)])
            .collect()
    }

    /// Bits per code: 4 or 8.
    pub fn bits(&self) -> usize {
        match self.codes {
            Codes::Nibbles { .. } => 4,
            Codes::Bytes(_) => 8,
        }
    }

    /// Bytes held, codes, scales and offsets together.
    pub fn bytes(&self) -> usize {
        let codes = match &self.codes {
            Codes::Nibbles { bytes, .. } => bytes.len(),
            Codes::Bytes(codes) => codes.len(),
        };
        codes + 4 * (self.scales.len() + self.offsets.as_ref().map_or(0, Vec::len))
    }

    /// Element `(r, c)`.
    pub fn at(&self, r: usize, c: usize) -> f32 {
        let at = self.scale_at(r, c);
        let value = self.scales[at] * self.code(r, c) as f32;
        match &self.offsets {
            Some(offsets) => value + offsets[at],
            None => value,
        }
    }

    /// Every element, row-major.
    pub fn to_dense(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        for (r, row) in out.chunks_exact_mut(self.cols.max(1)).enumerate().take(self.rows) {
            self.unpack_row(r, 0, row);
        }
        out
    }

    /// Whether every element equals (`==`) the row-major `values`.
    pub fn equals(&self, values: &[f32]) -> bool {
        MatRef::row_major(values, self.rows, self.cols).is_ok_and(|m| self.equals_view(m))
    }

    /// Whether every element equals (`==`) the same element of `m` (rows compared on all of
    /// rayon's threads).
    pub fn equals_view(&self, m: MatRef<'_>) -> bool {
        if m.shape() != self.shape() {
            return false;
        }
        (0..self.rows).into_par_iter().with_min_len(64).all(|r| {
            let mut row = vec![0.0; self.cols];
            self.unpack_row(r, 0, &mut row);
            match m.row(r) {
                Some(expected) => row == expected,
                None => row.iter().enumerate().all(|(c, &v)| v == m.at(r, c)),
            }
        })
    }

    fn code(&self, r: usize, c: usize) -> i32 {
        match &self.codes {
            Codes::Nibbles { bytes, low } => {
                let (at, shift) = self.nibble_at(r, c);
                i32::from((bytes[at] >> shift) & 0x0F) + i32::from(*low)
            }
            Codes::Bytes(codes) => i32::from(codes[self.byte_at(r, c)]),
        }
    }

    /// Writes rows `p0..p0 + kc`, columns `c0..c0 + NR` into `dst` (`kc` rows of `NR`), when
    /// the columns are whole runs of 16 (`false`, writing nothing, otherwise). `wide`: with AVX2
    /// (the CPU must have it), else portable code; the same values either way. The common case
    /// of a product's panels.
    #[inline(always)]
    pub(crate) fn unpack_panel<const NR: usize>(
        &self,
        p0: usize,
        kc: usize,
        c0: usize,
        dst: &mut [f32],
        wide: bool,
    ) -> bool {
        if !NR.is_multiple_of(16) || !c0.is_multiple_of(16) || c0 + NR > self.cols || dst.len() < kc * NR {
            return false;
        }
        // A run of 16 columns from a multiple of 16 lies inside one group.
        for run in 0..NR / 16 {
            let c = c0 + 16 * run;
            for (row, (r, at)) in dst.chunks_exact_mut(NR).zip(self.rows_with_scales(p0, kc, c)) {
                let out: &mut [f32; 16] = (&mut row[16 * run..16 * run + 16]).try_into().expect("16 wide");
                self.unpack_run(r, c, at, out, wide);
            }
        }
        true
    }

    /// Elements `(r, c..c + 16)` into `out`, for `c` a multiple of 16 inside the matrix, their
    /// scales (and offsets) at `at` ([`PackedMatrix::scale_at`]): `scale · code`, then
    /// `+ offset`, each rounded once. `wide`: with AVX2 (the CPU must have it), else straight-line
    /// code over fixed-size arrays that the compiler vectorises; the same values either way.
    #[inline(always)]
    fn unpack_run(&self, r: usize, c: usize, at: usize, out: &mut [f32; 16], wide: bool) {
        let scales: &[f32; 16] = self.scales[at..at + 16].try_into().expect("16 scales");
        let offsets: Option<&[f32; 16]> = self.offsets.as_ref().map(|o| o[at..at + 16].try_into().expect("16"));
        match &self.codes {
            Codes::Nibbles { bytes, low } => {
                let (byte_at, shift) = self.nibble_at(r, c);
                let run: &[u8; 16] = bytes[byte_at..byte_at + 16].try_into().expect("16 bytes");
                let low = f32::from(*low);
                #[cfg(target_arch = "x86_64")]
                if wide {
                    // SAFETY: `wide` only when the CPU has AVX2 (the product's instruction
                    // set). It adds the offsets itself, in registers.
                    unsafe { unpack16_avx2(run, shift, low, scales, offsets, out) };
                    return;
                }
                for j in 0..16 {
                    // `nibble + low` is a small integer: exact in f32 either way round.
                    out[j] = scales[j] * (((i32::from(run[j]) >> shift) & 0x0F) as f32 + low);
                }
            }
            Codes::Bytes(codes) => {
                let codes: &[i8; 16] = codes[self.byte_at(r, c)..][..16].try_into().expect("16 codes");
                #[cfg(target_arch = "x86_64")]
                if wide {
                    // SAFETY: `wide` only when the CPU has AVX2 (the product's instruction set).
                    unsafe { scale_bytes_avx2(codes, scales, out) };
                }
                if !wide {
                    for j in 0..16 {
                        out[j] = scales[j] * f32::from(codes[j]);
                    }
                }
            }
        }
        if let Some(offsets) = offsets {
            for j in 0..16 {
                out[j] += offsets[j];
            }
        }
    }

    /// Rows `p0..p0 + kc`, each with where its scales for the columns from `c0` are
    /// ([`PackedMatrix::scale_at`], without a division per row).
    fn rows_with_scales(&self, p0: usize, kc: usize, c0: usize) -> impl Iterator<Item = (usize, usize)> {
        let (mut at, mut left) = (self.scale_at(p0, c0), self.block - p0 % self.block);
        (p0..p0 + kc).map(move |r| {
            if left == 0 {
                (at, left) = (at + GROUP, self.block);
            }
            left -= 1;
            (r, at)
        })
    }

    /// Whether columns `c0..c0 + NR` are whole runs of 16 inside one group (so their codes,
    /// scales and offsets are each contiguous).
    fn one_group<const NR: usize>(&self, c0: usize) -> bool {
        (NR == 16 || NR == GROUP) && c0.is_multiple_of(NR) && c0 + NR <= self.cols
    }

    /// Writes elements `(r, c0..c0 + out.len())` into `out`: runs of 16 columns inside a group
    /// by [`PackedMatrix::unpack_run`] (portable code, which the caller's target features
    /// vectorise), others one at a time.
    #[inline(always)]
    pub(crate) fn unpack_row(&self, r: usize, c0: usize, out: &mut [f32]) {
        let mut c = 0;
        while c < out.len() {
            let col = c0 + c;
            match out[c..].first_chunk_mut::<16>() {
                Some(run) if self.one_group::<16>(col) => {
                    self.unpack_run(r, col, self.scale_at(r, col), run, false);
                    c += 16;
                }
                _ => {
                    out[c] = self.at(r, col);
                    c += 1;
                }
            }
        }
    }
}

/// Whether `scale · code` is an `f32` exactly (no rounding) for every one of `scales` and every
/// integer code of magnitude up to `widest`: each scale finite, its significand (trailing zeros
/// dropped) and the code's bits together at most `f32`'s 24, and no product overflowing. A GGUF
/// block's scale is an `f16` (11 significant bits), so Q4_0/Q4_1/Q8_0's products always are;
/// Q6_K's `d · sc` times a 6-bit code may not be.
fn products_exact(scales: &[f32], widest: u32) -> bool {
    let code_bits = u32::BITS - widest.leading_zeros();
    scales.iter().all(|&s| {
        let bits = s.to_bits();
        let fraction = bits & 0x7F_FFFF;
        // Normal numbers have the implicit leading one; subnormals are `fraction · 2⁻¹⁴⁹`.
        let significand = if (bits >> 23) & 0xFF == 0 {
            fraction
        } else {
            fraction | 0x80_0000
        };
        let significant_bits = match significand {
            0 => 0,
            m => u32::BITS - m.leading_zeros() - m.trailing_zeros(),
        };
        s.is_finite() && significant_bits + code_bits <= 24 && (s.abs() * widest as f32).is_finite()
    })
}

/// Sixteen elements from the nibbles of `run` (shifted right by `shift`), as
/// [`PackedMatrix::unpack_run`]'s portable loop computes them: `scale · (nibble + low)`, then
/// `+ offset`, each rounded once (a multiply and an add, never fused).
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn unpack16_avx2(
    run: &[u8; 16],
    shift: u32,
    low: f32,
    scales: &[f32; 16],
    offsets: Option<&[f32; 16]>,
    out: &mut [f32; 16],
) {
    use std::arch::x86_64::*;
    // SAFETY: every load and store is of the fixed-size arrays given.
    unsafe {
        let bytes = _mm_loadu_si128(run.as_ptr().cast());
        let count = _mm_cvtsi32_si128(shift as i32);
        let mask = _mm256_set1_epi32(0x0F);
        let low = _mm256_set1_ps(low);
        for half in 0..2 {
            let eight = if half == 0 { bytes } else { _mm_srli_si128::<8>(bytes) };
            let nibbles = _mm256_and_si256(_mm256_srl_epi32(_mm256_cvtepu8_epi32(eight), count), mask);
            let codes = _mm256_add_ps(_mm256_cvtepi32_ps(nibbles), low);
            let mut value = _mm256_mul_ps(_mm256_loadu_ps(scales.as_ptr().add(8 * half)), codes);
            if let Some(offsets) = offsets {
                value = _mm256_add_ps(value, _mm256_loadu_ps(offsets.as_ptr().add(8 * half)));
            }
            _mm256_storeu_ps(out.as_mut_ptr().add(8 * half), value);
        }
    }
}

/// `out[j] = scales[j] · codes[j]`, eight at a time.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn scale_bytes_avx2(codes: &[i8; 16], scales: &[f32; 16], out: &mut [f32; 16]) {
    use std::arch::x86_64::*;
    for j in (0..16).step_by(8) {
        // SAFETY: `j + 8 <= 16`: the loads and the store stay inside the arrays.
        unsafe {
            let eight = _mm_loadl_epi64(codes.as_ptr().add(j).cast());
            let codes = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight));
            let value = _mm256_mul_ps(_mm256_loadu_ps(scales.as_ptr().add(j)), codes);
            _mm256_storeu_ps(out.as_mut_ptr().add(j), value);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A deterministic matrix of codes in `range`, scales and (optionally) offsets.
    pub(crate) fn sample(rows: usize, cols: usize, block: usize, range: (i8, i8), offsets: bool) -> PackedMatrix {
        let mut state = (rows * 31 + cols * 7 + block) as u64 | 1;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let span = (i16::from(range.1) - i16::from(range.0) + 1) as u64;
        let codes: Vec<i8> = (0..rows * cols)
            .map(|_| (i16::from(range.0) + (next() % span) as i16) as i8)
            .collect();
        let blocks = rows.div_ceil(block) * cols;
        let mut float = || ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.01;
        let scales = (0..blocks).map(|_| float()).collect();
        let offsets = offsets.then(|| (0..blocks).map(|_| float()).collect());
        PackedMatrix::new([rows, cols], block, &codes, scales, offsets).unwrap()
    }

    /// `m` with each scale cut to an `f16`'s 11 significant bits (a GGUF block's precision).
    pub(crate) fn with_f16_scales(m: &PackedMatrix) -> PackedMatrix {
        let scales = m
            .scales()
            .iter()
            .map(|s| f32::from_bits(s.to_bits() & 0xFFFF_E000))
            .collect();
        PackedMatrix::new(m.shape(), m.block, &m.codes(), scales, m.offsets()).unwrap()
    }

    /// Whether products with `m` unpack `scale · code + offset` in one fused multiply-add.
    pub(crate) fn products_fuse(m: &PackedMatrix) -> bool {
        m.exact_products
    }

    #[test]
    fn products_are_exact_when_scale_and_code_bits_fit_a_significand() {
        let f16_like = 1.0 + 1023.0 / 1024.0; // 11 significant bits
        assert!(products_exact(&[f16_like, -f16_like * 0.25, 0.0], 127)); // 11 + 7 bits
        assert!(products_exact(&[f16_like], 8191)); // 11 + 13 = 24
        assert!(!products_exact(&[f16_like], 8192)); // 11 + 14
        assert!(!products_exact(&[0.1], 15)); // 24 significant bits
        // Counted in full bits, so conservatively: `0.1 · 1` is exact but not claimed.
        assert!(!products_exact(&[0.1], 1));
        assert!(products_exact(&[0.1], 0));
        assert!(products_exact(&[0.375], 2)); // 2 + 2 bits
        // Subnormal scales: a fixed point, exact while the integer product fits 24 bits.
        assert!(products_exact(&[f32::from_bits(0x7FF)], 8191));
        assert!(!products_exact(&[f32::from_bits(0x7FF)], 8192));
        assert!(!products_exact(&[f32::MAX], 2)); // overflows
        assert!(!products_exact(&[f32::INFINITY], 1));
        assert!(!products_exact(&[f32::NAN], 1));
        // Where it says so, a fused multiply-add gives the two-rounding bits.
        let mut state = 9u64;
        for _ in 0..10_000 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let scale = f32::from_bits((state >> 32) as u32 & 0xBFFF_E000); // |s| < 2, 11 bits
            let offset = f32::from_bits((state >> 8) as u32 & 0xBFFF_FFFF);
            let code = (state % 256) as f32 - 128.0;
            assert!(products_exact(&[scale], 128));
            assert_eq!(scale.mul_add(code, offset).to_bits(), (scale * code + offset).to_bits());
        }
    }

    #[test]
    fn nibbles_and_bytes_unpack_to_scale_times_code_plus_offset() {
        for (range, bits) in [((0, 15), 4), ((-8, 7), 4), ((-32, 31), 8), ((-128, 127), 8)] {
            for offsets in [false, true] {
                let m = sample(70, 77, 32, range, offsets);
                assert_eq!(m.bits(), bits);
                let dense = m.to_dense();
                for r in 0..70 {
                    for c in 0..77 {
                        let at = (r / 32) * 77 + c;
                        let (scales, offsets) = (m.scales(), m.offsets());
                        let code = f32::from(m.code(r, c) as i8);
                        assert!(code >= f32::from(range.0) && code <= f32::from(range.1));
                        let mut expected = scales[at] * code;
                        if let Some(o) = &offsets {
                            expected += o[at];
                        }
                        assert_eq!(dense[r * 77 + c].to_bits(), expected.to_bits(), "({r}, {c})");
                        assert_eq!(m.at(r, c).to_bits(), expected.to_bits());
                    }
                }
                assert!(m.equals(&dense));
                let mut other = dense.clone();
                other[5 * 77 + 3] += 1.0;
                assert!(!m.equals(&other));
            }
        }
    }

    #[test]
    fn rows_unpack_from_any_column() {
        let m = sample(20, 96, 16, (0, 15), true);
        let dense = m.to_dense();
        for c0 in [0, 1, 15, 16, 17, 40] {
            let mut out = vec![0.0; 96 - c0];
            m.unpack_row(7, c0, &mut out);
            assert_eq!(out, dense[7 * 96 + c0..8 * 96]);
        }
    }

    #[test]
    fn mismatched_parts_are_refused() {
        let err = PackedMatrix::new([4, 4], 2, &[0; 15], vec![0.0; 8], None).unwrap_err();
        assert!(err.to_string().contains("15 codes, expected 16"), "{err}");
        let err = PackedMatrix::new([4, 4], 2, &[0; 16], vec![0.0; 4], None).unwrap_err();
        assert!(err.to_string().contains("4 scales, expected 8"), "{err}");
        assert!(PackedMatrix::new([4, 4], 0, &[0; 16], vec![], None).is_err());
    }
}
