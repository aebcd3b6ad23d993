//! ggml's storage types and their dequantisation to f32, block by block, after the block
//! layouts of ggml-quants.c (and gguf-py's `quants.py`, which the fixtures come from).
//!
//! A block of `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1` and `Q8_0` holds 32 elements; a block of a
//! K-quant (`Q4_K`, `Q5_K`, `Q6_K`) holds 256 in sub-blocks of 32 (16 for `Q6_K`), each with its
//! own 6- or 8-bit scale. Scales are f16.

use half::{bf16, f16};

/// Elements per K-quant super-block.
const QK_K: usize = 256;

/// The ggml element types rein reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// 4-bit, one scale per 32: `d · (q − 8)`.
    Q4_0,
    /// 4-bit, scale and minimum per 32: `d · q + m`.
    Q4_1,
    /// 5-bit, one scale per 32: `d · (q − 16)`.
    Q5_0,
    /// 5-bit, scale and minimum per 32: `d · q + m`.
    Q5_1,
    /// 8-bit, one scale per 32: `d · q`.
    Q8_0,
    /// 4-bit K-quant: 8 sub-blocks of 32 with 6-bit scales and minimums.
    Q4K,
    /// 5-bit K-quant: as `Q4_K` plus one high bit per element.
    Q5K,
    /// 6-bit K-quant: 16 sub-blocks of 16 with 8-bit scales.
    Q6K,
}

/// ggml's type ids (ggml.h `enum ggml_type`) with their names, for the ones rein reads.
const IDS: [(u32, GgmlType, &str); 11] = [
    (0, GgmlType::F32, "F32"),
    (1, GgmlType::F16, "F16"),
    (2, GgmlType::Q4_0, "Q4_0"),
    (3, GgmlType::Q4_1, "Q4_1"),
    (6, GgmlType::Q5_0, "Q5_0"),
    (7, GgmlType::Q5_1, "Q5_1"),
    (8, GgmlType::Q8_0, "Q8_0"),
    (12, GgmlType::Q4K, "Q4_K"),
    (13, GgmlType::Q5K, "Q5_K"),
    (14, GgmlType::Q6K, "Q6_K"),
    (30, GgmlType::Bf16, "BF16"),
];

/// Names of the ggml types rein does not read, for error messages.
const OTHER_NAMES: [(u32, &str); 18] = [
    (9, "Q8_1"),
    (10, "Q2_K"),
    (11, "Q3_K"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (20, "IQ4_NL"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (23, "IQ4_XS"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
];

impl GgmlType {
    /// The type with ggml id `id`, if rein reads it.
    pub fn from_id(id: u32) -> Option<Self> {
        IDS.iter().find(|(i, _, _)| *i == id).map(|(_, t, _)| *t)
    }

    /// ggml's name (`Q4_K`).
    pub fn name(self) -> &'static str {
        IDS.iter().find(|(_, t, _)| *t == self).map_or("?", |(_, _, n)| n)
    }

    /// The name of ggml type `id`, known or not.
    pub fn name_of(id: u32) -> &'static str {
        IDS.iter()
            .map(|(i, _, n)| (*i, *n))
            .chain(OTHER_NAMES)
            .find(|(i, _)| *i == id)
            .map_or("unknown", |(_, n)| n)
    }

    /// The supported names, for error messages.
    pub fn supported() -> String {
        IDS.iter().map(|(_, _, n)| *n).collect::<Vec<_>>().join(", ")
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => 32,
            GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::Bf16 => 2,
            GgmlType::Q4_0 => 2 + 16,
            GgmlType::Q4_1 => 2 + 2 + 16,
            GgmlType::Q5_0 => 2 + 4 + 16,
            GgmlType::Q5_1 => 2 + 2 + 4 + 16,
            GgmlType::Q8_0 => 2 + 32,
            GgmlType::Q4K => 2 + 2 + 12 + QK_K / 2,
            GgmlType::Q5K => 2 + 2 + 12 + QK_K / 8 + QK_K / 2,
            GgmlType::Q6K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
        }
    }

    /// The elements stored in `bytes` (whole blocks), as f32.
    pub fn dequantize(self, bytes: &[u8]) -> Vec<f32> {
        let mut out = vec![0.0; bytes.len() / self.block_bytes() * self.block_size()];
        let blocks = bytes.chunks_exact(self.block_bytes());
        let outputs = out.chunks_exact_mut(self.block_size());
        for (block, out) in blocks.zip(outputs) {
            match self {
                GgmlType::F32 => out[0] = f32::from_le_bytes([block[0], block[1], block[2], block[3]]),
                GgmlType::F16 => out[0] = half(block, 0),
                GgmlType::Bf16 => out[0] = bf16::from_le_bytes([block[0], block[1]]).to_f32(),
                GgmlType::Q4_0 => nibbles(&block[2..18], |j, q| out[j] = half(block, 0) * (q as f32 - 8.0)),
                GgmlType::Q4_1 => {
                    let (d, m) = (half(block, 0), half(block, 2));
                    nibbles(&block[4..20], |j, q| out[j] = d * q as f32 + m);
                }
                GgmlType::Q5_0 => {
                    let high = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
                    let d = half(block, 0);
                    nibbles(&block[6..22], |j, q| {
                        out[j] = d * ((q | (((high >> j) & 1) << 4) as u8) as f32 - 16.0);
                    });
                }
                GgmlType::Q5_1 => {
                    let (d, m) = (half(block, 0), half(block, 2));
                    let high = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
                    nibbles(&block[8..24], |j, q| {
                        out[j] = d * (q | (((high >> j) & 1) << 4) as u8) as f32 + m;
                    });
                }
                GgmlType::Q8_0 => {
                    let d = half(block, 0);
                    for (o, &q) in out.iter_mut().zip(&block[2..34]) {
                        *o = d * f32::from(q as i8);
                    }
                }
                GgmlType::Q4K => k_quant(block, &block[16..], None, out),
                GgmlType::Q5K => k_quant(block, &block[48..], Some(&block[16..48]), out),
                GgmlType::Q6K => q6_k(block, out),
            }
        }
        out
    }
}

/// A block's elements as integer codes with a scale (and an offset) per sub-block, such that
/// element `e` of [`GgmlType::dequantize`] is exactly `scale · code` (`+ offset`), each one `f32`
/// rounding: what [`rein_kernels::PackedMatrix`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Codes {
    /// Elements per scale.
    pub sub_block: usize,
    /// Whether elements have an offset.
    pub offsets: bool,
}

impl GgmlType {
    /// How this type's blocks split into codes, or `None` for the float types.
    pub fn codes(self) -> Option<Codes> {
        let (sub_block, offsets) = match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => return None,
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => (32, false),
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => (32, true),
            GgmlType::Q6K => (16, false),
        };
        Some(Codes { sub_block, offsets })
    }

    /// The codes of one block (`block_size` of them), its sub-blocks' scales and, when the type
    /// has them, offsets (see [`GgmlType::codes`]; a float type writes nothing).
    pub fn block_codes(self, block: &[u8], codes: &mut [i8], scales: &mut [f32], offsets: &mut [f32]) {
        let code = |q: u8, bias: i16| (i16::from(q) - bias) as i8;
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => {}
            GgmlType::Q4_0 => {
                scales[0] = half(block, 0);
                nibbles(&block[2..18], |j, q| codes[j] = code(q, 8));
            }
            GgmlType::Q4_1 => {
                (scales[0], offsets[0]) = (half(block, 0), half(block, 2));
                nibbles(&block[4..20], |j, q| codes[j] = code(q, 0));
            }
            GgmlType::Q5_0 => {
                let high = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
                scales[0] = half(block, 0);
                nibbles(&block[6..22], |j, q| {
                    codes[j] = code(q | (((high >> j) & 1) << 4) as u8, 16)
                });
            }
            GgmlType::Q5_1 => {
                let high = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
                (scales[0], offsets[0]) = (half(block, 0), half(block, 2));
                nibbles(&block[8..24], |j, q| {
                    codes[j] = code(q | (((high >> j) & 1) << 4) as u8, 0)
                });
            }
            GgmlType::Q8_0 => {
                scales[0] = half(block, 0);
                for (c, &q) in codes.iter_mut().zip(&block[2..34]) {
                    *c = q as i8;
                }
            }
            GgmlType::Q4K | GgmlType::Q5K => {
                let (qs, high) = match self {
                    GgmlType::Q5K => (&block[48..], Some(&block[16..48])),
                    _ => (&block[16..], None),
                };
                let (d, dmin) = (half(block, 0), half(block, 2));
                for sub in 0..8 {
                    let (sc, m) = scale_min(&block[4..16], sub);
                    // `scale · q − min` is `scale · q + (−min)`, bit for bit.
                    (scales[sub], offsets[sub]) = (d * sc, -(dmin * m));
                    let group = &qs[(sub / 2) * 32..][..32];
                    for l in 0..32 {
                        let mut q = (group[l] >> ((sub % 2) * 4)) & 0x0F;
                        if let Some(high) = high {
                            q |= ((high[l] >> sub) & 1) << 4;
                        }
                        codes[sub * 32 + l] = q as i8;
                    }
                }
            }
            GgmlType::Q6K => {
                let ql = &block[..QK_K / 2];
                let qh = &block[QK_K / 2..QK_K / 2 + QK_K / 4];
                let sc = &block[QK_K / 2 + QK_K / 4..QK_K / 2 + QK_K / 4 + QK_K / 16];
                let d = half(block, QK_K / 2 + QK_K / 4 + QK_K / 16);
                for (scale, &s) in scales.iter_mut().zip(sc) {
                    *scale = d * f32::from(s as i8);
                }
                for (e, c) in codes.iter_mut().enumerate().take(QK_K) {
                    let (h, chunk, l) = (e / 128, (e % 128) / 32, e % 32);
                    let low = (ql[h * 64 + (chunk % 2) * 32 + l] >> ((chunk / 2) * 4)) & 0x0F;
                    let high = (qh[h * 32 + l] >> (2 * chunk)) & 0x03;
                    *c = code(low | (high << 4), 32);
                }
            }
        }
    }
}

/// The f16 at `block[at..at + 2]`.
fn half(block: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([block[at], block[at + 1]]).to_f32()
}

/// The 32 4-bit values of a 16-byte `Q4_0`-style array: element `j < 16` is the low nibble of
/// byte `j`, element `16 + j` its high nibble.
fn nibbles(qs: &[u8], mut put: impl FnMut(usize, u8)) {
    for (j, &byte) in qs.iter().enumerate() {
        put(j, byte & 0x0F);
        put(j + 16, byte >> 4);
    }
}

/// The 6-bit scale and minimum of sub-block `j` (0..8) from `Q4_K`'s 12 packed bytes: the first
/// four of each sit in bytes 0..4 / 4..8, the last four split between the low/high nibbles of
/// bytes 8..12 and the top two bits of bytes 0..8.
fn scale_min(scales: &[u8], j: usize) -> (f32, f32) {
    let (sc, m) = if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    };
    (f32::from(sc), f32::from(m))
}

/// `Q4_K`: `d, dmin, scales[12], qs[128]`; `Q5_K` has 32 bytes of high bits (`high`, bit `j`
/// of byte `l` for element `l` of sub-block `j`) between the scales and `qs`. The `qs` come in
/// four 32-byte groups; group `g`'s low nibbles are sub-block `2g`, its high nibbles sub-block
/// `2g + 1`. Element = `d · sc · q − dmin · m`.
fn k_quant(block: &[u8], qs: &[u8], high: Option<&[u8]>, out: &mut [f32]) {
    let (d, dmin) = (half(block, 0), half(block, 2));
    let scales = &block[4..16];
    for sub in 0..8 {
        let (sc, m) = scale_min(scales, sub);
        let (scale, min) = (d * sc, dmin * m);
        let group = &qs[(sub / 2) * 32..(sub / 2) * 32 + 32];
        let shift = (sub % 2) * 4;
        for l in 0..32 {
            let mut q = (group[l] >> shift) & 0x0F;
            if let Some(high) = high {
                q |= ((high[l] >> sub) & 1) << 4;
            }
            out[sub * 32 + l] = scale * f32::from(q) - min;
        }
    }
}

/// `Q6_K`: `ql[128], qh[64], scales[16] (i8), d`. Two halves of 128 elements; in half `h`,
/// chunk `c` (0..4, 32 elements each) takes the low (c < 2) or high nibble of
/// `ql[h·64 + (c % 2)·32 + l]` and bits `2c, 2c+1` of `qh[h·32 + l]`. Element =
/// `d · scales[e / 16] · (q − 32)`.
fn q6_k(block: &[u8], out: &mut [f32]) {
    let ql = &block[..QK_K / 2];
    let qh = &block[QK_K / 2..QK_K / 2 + QK_K / 4];
    let scales = &block[QK_K / 2 + QK_K / 4..QK_K / 2 + QK_K / 4 + QK_K / 16];
    let d = half(block, QK_K / 2 + QK_K / 4 + QK_K / 16);
    for (e, o) in out.iter_mut().enumerate() {
        let (h, c, l) = (e / 128, (e % 128) / 32, e % 32);
        let low = (ql[h * 64 + (c % 2) * 32 + l] >> ((c / 2) * 4)) & 0x0F;
        let high = (qh[h * 32 + l] >> (2 * c)) & 0x03;
        let q = i32::from(low | (high << 4)) - 32;
        *o = d * f32::from(scales[e / 16] as i8) * q as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_match_ggml() {
        // ggml's GGML_QUANT_SIZES.
        let sizes = [
            (GgmlType::Q4_0, 32, 18),
            (GgmlType::Q4_1, 32, 20),
            (GgmlType::Q5_0, 32, 22),
            (GgmlType::Q5_1, 32, 24),
            (GgmlType::Q8_0, 32, 34),
            (GgmlType::Q4K, 256, 144),
            (GgmlType::Q5K, 256, 176),
            (GgmlType::Q6K, 256, 210),
            (GgmlType::Bf16, 1, 2),
        ];
        for (kind, size, bytes) in sizes {
            assert_eq!(
                (kind.block_size(), kind.block_bytes()),
                (size, bytes),
                "{}",
                kind.name()
            );
        }
    }

    #[test]
    fn ids_round_trip() {
        for (id, kind, name) in IDS {
            assert_eq!(GgmlType::from_id(id), Some(kind));
            assert_eq!((kind.name(), GgmlType::name_of(id)), (name, name));
        }
        assert_eq!(GgmlType::from_id(11), None);
        assert_eq!(GgmlType::name_of(11), "Q3_K");
    }

    #[test]
    fn q8_0_is_scale_times_signed_byte() {
        let mut block = f16::from_f32(0.5).to_le_bytes().to_vec();
        block.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let values = GgmlType::Q8_0.dequantize(&block);
        assert_eq!(values[0], -8.0);
        assert_eq!(values[31], 7.5);
    }
}
