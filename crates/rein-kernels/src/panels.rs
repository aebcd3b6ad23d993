//! Packing the operands of a matrix product into the micro-kernel's panels: `A` into `MR`-high
//! row panels, `B` into `NR`-wide column panels (from a row- or column-major view), and a packed
//! `B`'s codes back into panels. Wide panels go through the register transposes of
//! [`crate::interleave`].

use crate::interleave::interleave;
use crate::mat_ref::MatRef;
use crate::packed::PackedMatrix;

/// Packs `A[i0..i0+mc, p0..p0+kc]` as `MR`-row panels, each `kc` columns of `MR` values (rows
/// past the block are zero).
#[inline(always)]
pub(crate) fn pack_a<const MR: usize>(
    pack: &mut [f32],
    a: &MatRef<'_>,
    i0: usize,
    mc: usize,
    p0: usize,
    kc: usize,
    wide: bool,
) {
    let base = a.ptr();
    for (panel, ir) in (0..mc).step_by(MR).enumerate() {
        let dst = &mut pack[panel * MR * kc..][..MR * kc];
        let rows = MR.min(mc - ir);
        let first = i0 + ir;
        if a.col_stride == 1 {
            // Row-major: each row is contiguous along k.
            let mut row_starts: [*const f32; MR] = [std::ptr::null(); MR];
            for (i, start) in row_starts.iter_mut().enumerate().take(rows) {
                // Row `first + i`, columns `p0..p0 + kc`, lie inside A.
                *start = base.wrapping_add((first + i) * a.row_stride + p0);
            }
            // SAFETY: each of the `rows` streams holds `kc` values of A; `dst` holds `MR·kc`.
            unsafe { interleave::<MR>(dst, &row_starts[..rows], kc, wide) };
        } else if a.row_stride == 1 {
            // Column-major (a transposed view): each column's `rows` values are contiguous.
            for (p, column) in dst.chunks_exact_mut(MR).enumerate() {
                // SAFETY: rows `first..first + rows` of column `p0 + p` lie inside A.
                let src = unsafe { std::slice::from_raw_parts(base.add((p0 + p) * a.col_stride + first), rows) };
                match <&[f32; MR]>::try_from(src) {
                    // A whole panel's column as one array, copied inline: a `memcpy` call per
                    // column of 12 values was 10% of a TD3 update (`∂W = xᵀ·∂y` packs one per
                    // row of the batch).
                    Ok(src) => column.copy_from_slice(src),
                    Err(_) => {
                        column[..rows].copy_from_slice(src);
                        column[rows..].fill(0.0);
                    }
                }
            }
        } else {
            for (p, column) in dst.chunks_exact_mut(MR).enumerate() {
                for (i, v) in column.iter_mut().enumerate() {
                    *v = if i < rows {
                        // SAFETY: `(first + i, p0 + p)` is inside A, whose extent `MatRef::new` checked.
                        unsafe { *base.add((first + i) * a.row_stride + (p0 + p) * a.col_stride) }
                    } else {
                        0.0
                    };
                }
            }
        }
    }
}

/// Packs `B[p0..p0+kc, j0..j0+nc]` as `NR`-column panels, each `kc` rows of `NR` values
/// (columns past the block are zero).
#[inline(always)]
pub(crate) fn pack_b<const NR: usize>(
    pack: &mut [f32],
    b: &MatRef<'_>,
    p0: usize,
    kc: usize,
    j0: usize,
    nc: usize,
    wide: bool,
) {
    let base = b.ptr();
    for (panel, jr) in (0..nc).step_by(NR).enumerate() {
        let dst = &mut pack[panel * NR * kc..][..NR * kc];
        let cols = NR.min(nc - jr);
        let first = j0 + jr;
        if b.col_stride == 1 {
            // Row-major: each row's `cols` values are contiguous.
            for (p, row) in dst.chunks_exact_mut(NR).enumerate() {
                // SAFETY: columns `first..first + cols` of row `p0 + p` lie inside B.
                let src = unsafe { std::slice::from_raw_parts(base.add((p0 + p) * b.row_stride + first), cols) };
                row[..cols].copy_from_slice(src);
                row[cols..].fill(0.0);
            }
        } else if b.row_stride == 1 {
            // Column-major (a transposed view): each column is contiguous along k.
            let mut column_starts: [*const f32; NR] = [std::ptr::null(); NR];
            for (j, start) in column_starts.iter_mut().enumerate().take(cols) {
                // Column `first + j`, rows `p0..p0 + kc`, lie inside B.
                *start = base.wrapping_add((first + j) * b.col_stride + p0);
            }
            // SAFETY: each of the `cols` streams holds `kc` values of B; `dst` holds `NR·kc`.
            unsafe { interleave::<NR>(dst, &column_starts[..cols], kc, wide) };
        } else {
            for (p, row) in dst.chunks_exact_mut(NR).enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = if j < cols {
                        // SAFETY: `(p0 + p, first + j)` is inside B.
                        unsafe { *base.add((p0 + p) * b.row_stride + (first + j) * b.col_stride) }
                    } else {
                        0.0
                    };
                }
            }
        }
    }
}

/// [`pack_b`] for a packed `B`: its elements unpacked into `NR`-column panels.
#[inline(always)]
pub(crate) fn unpack_b<const NR: usize>(
    pack: &mut [f32],
    b: &PackedMatrix,
    p0: usize,
    kc: usize,
    j0: usize,
    nc: usize,
    wide: bool,
) {
    for (panel, jr) in (0..nc).step_by(NR).enumerate() {
        let dst = &mut pack[panel * NR * kc..][..NR * kc];
        if b.unpack_panel::<NR>(p0, kc, j0 + jr, dst, wide) {
            continue;
        }
        let cols = NR.min(nc - jr);
        for (p, row) in dst.chunks_exact_mut(NR).enumerate() {
            b.unpack_row(p0 + p, j0 + jr, &mut row[..cols]);
            row[cols..].fill(0.0);
        }
    }
}
