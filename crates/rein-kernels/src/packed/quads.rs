//! The codes of a [`PackedMatrix`] copied four inner steps at a time, the order the q8
//! products' integer dot products read ([`crate::q8`]): made the first time a matrix meets such
//! a product, and held only by matrices that have been used so.

use std::sync::OnceLock;

use rayon::prelude::*;

use super::{Codes, GROUP, PackedMatrix};

/// The codes of a [`PackedMatrix`] four inner steps at a time: for each group of 32 columns and
/// each quad of steps (`4j..4j + 4` within a block, blocks padded to whole quads), the 32
/// columns' four codes, each column's four in consecutive bytes (byte `4c + t` is step `t` of
/// column `c`).
#[derive(Clone, Default)]
pub(crate) struct QuadCodes(OnceLock<Quads>);

/// Derived from the codes: two matrices with the same codes are equal whether or not either
/// has made its copy yet.
impl PartialEq for QuadCodes {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

#[derive(Clone)]
pub(crate) enum Quads {
    /// Nibbles `code − low`: 64 bytes per quad, the low nibble of byte `4c + t` column `c`, the
    /// high nibble column `16 + c`.
    Nibbles(Vec<u8>),
    /// Signed codes: 128 bytes per quad, byte `4c + t` column `c`.
    Bytes(Vec<i8>),
}

impl PackedMatrix {
    /// Whether [`crate::matmul_packed_q8`] quantises the activations for this matrix (blocks of
    /// a multiple of 4 rows, as a GGUF's 32); for others it gives the exact product.
    pub fn reads_q8(&self) -> bool {
        self.block.is_multiple_of(4)
    }

    pub(crate) fn quads_per_block(&self) -> usize {
        self.block / 4
    }

    /// Quads per group: every block padded to whole quads.
    pub(crate) fn quads_per_group(&self) -> usize {
        self.rows.div_ceil(self.block) * self.quads_per_block()
    }

    /// The codes in quads (made the first time they are asked for).
    pub(crate) fn quads(&self) -> &Quads {
        self.quad_codes.0.get_or_init(|| {
            let (groups, per_group) = (self.cols.div_ceil(GROUP), self.quads_per_group());
            // The step and column of byte `4c + t` of quad `j` of group `g`, if inside the matrix.
            let position = |g: usize, j: usize, c: usize, t: usize| {
                let (b, within) = (j / self.quads_per_block(), j % self.quads_per_block());
                let (r, col) = (b * self.block + 4 * within + t, g * GROUP + c);
                (r < self.rows.min((b + 1) * self.block) && col < self.cols).then_some((r, col))
            };
            match &self.codes {
                Codes::Nibbles { low, .. } => {
                    let mut bytes = vec![0u8; groups * per_group * 64];
                    bytes.par_chunks_mut(per_group * 64).enumerate().for_each(|(g, group)| {
                        for (i, byte) in group.iter_mut().enumerate() {
                            let (j, c, t) = (i / 64, i % 64 / 4, i % 4);
                            for (half, shift) in [(0, 0), (16, 4)] {
                                if let Some((r, col)) = position(g, j, c + half, t) {
                                    *byte |= ((self.code(r, col) - i32::from(*low)) as u8) << shift;
                                }
                            }
                        }
                    });
                    Quads::Nibbles(bytes)
                }
                Codes::Bytes(_) => {
                    let mut bytes = vec![0i8; groups * per_group * 128];
                    bytes
                        .par_chunks_mut(per_group * 128)
                        .enumerate()
                        .for_each(|(g, group)| {
                            for (i, byte) in group.iter_mut().enumerate() {
                                let (j, c, t) = (i / 128, i % 128 / 4, i % 4);
                                if let Some((r, col)) = position(g, j, c, t) {
                                    *byte = self.code(r, col) as i8;
                                }
                            }
                        });
                    Quads::Bytes(bytes)
                }
            }
        })
    }

    /// What each block's `Σ q·stored` lacks of `Σ q·code`, per unit of `Σq`: nibbles are stored
    /// as `code − low`.
    pub(crate) fn stored_low(&self) -> i32 {
        match self.codes {
            Codes::Nibbles { low, .. } => i32::from(low),
            Codes::Bytes(_) => 0,
        }
    }
}
