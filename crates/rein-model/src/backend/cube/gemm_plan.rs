//! How a row-major, batched product `a · b` of burn tensors maps onto one column-major BLAS
//! call (cuBLAS's `GemmStridedBatchedEx`), reading both operands where they lie: transposed
//! views and broadcast batches included, no copy.
//!
//! Row-major `C = a · b` is, read column-major, `Cᵀ = bᵀ · aᵀ`. A row-major matrix read
//! column-major with its row stride as leading dimension is its own transpose, so `b` becomes
//! BLAS's `A` and `a` its `B`, each untransposed ("N") when its rows are contiguous and
//! transposed ("T") when its columns are (a transposed view). Pure host logic: the tests
//! execute each plan as BLAS would, on the CPU.

/// One operand as the BLAS call reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Operand {
    /// BLAS's `op`: transposed ("T") or not ("N").
    pub transpose: bool,
    /// BLAS's leading dimension, in elements.
    pub ld: usize,
    /// Elements from one matrix of the batch to the next (0: one matrix for every batch).
    pub batch_stride: usize,
}

/// One strided, batched BLAS product `C = op(A) · op(B)`, every size in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GemmPlan {
    /// Rows of BLAS's `C`: the columns of the row-major product.
    pub m: usize,
    /// Columns of BLAS's `C`: the rows of the row-major product.
    pub n: usize,
    /// The inner dimension.
    pub k: usize,
    /// BLAS's `A`: the row-major `b`.
    pub lhs: Operand,
    /// BLAS's `B`: the row-major `a`.
    pub rhs: Operand,
    /// The output, contiguous: `ldc = m`, one `m × n` matrix after the other.
    pub batch: usize,
}

/// Why a product has no plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoPlan {
    /// An operand's layout is neither row- nor column-contiguous, or its batch dimensions do not
    /// collapse to one stride: a contiguous copy has a plan.
    Layout,
    /// Batches broadcast partly (`[2, 1, …] · [1, 3, …]`), a size is zero, or one is past
    /// BLAS's 32-bit sizes: no copy helps.
    Unsupported,
}

/// The plan of `a · b` for tensors of these shapes and strides (same rank ≥ 2, batch dimensions
/// broadcast as burn's `matmul` does).
pub(crate) fn plan(
    a_shape: &[usize],
    a_strides: &[usize],
    b_shape: &[usize],
    b_strides: &[usize],
) -> Result<GemmPlan, NoPlan> {
    let rank = a_shape.len();
    if rank < 2 || b_shape.len() != rank || a_strides.len() != rank || b_strides.len() != rank {
        return Err(NoPlan::Unsupported);
    }
    let (rows, inner, cols) = (a_shape[rank - 2], a_shape[rank - 1], b_shape[rank - 1]);
    if b_shape[rank - 2] != inner {
        return Err(NoPlan::Unsupported);
    }
    let mut out_batch = Vec::with_capacity(rank - 2);
    for (&x, &y) in a_shape[..rank - 2].iter().zip(&b_shape[..rank - 2]) {
        if x != y && x != 1 && y != 1 {
            return Err(NoPlan::Unsupported);
        }
        out_batch.push(x.max(y));
    }
    let batch: usize = out_batch.iter().product();
    let fits = |v: usize| i32::try_from(v).is_ok();
    if [rows, inner, cols, batch].contains(&0) || ![rows, inner, cols, batch].into_iter().all(fits) {
        return Err(NoPlan::Unsupported);
    }
    let lhs = operand(b_shape, b_strides, &out_batch)?;
    let rhs = operand(a_shape, a_strides, &out_batch)?;
    let in_range = |o: &Operand| fits(o.ld) && i64::try_from(o.batch_stride).is_ok();
    if !in_range(&lhs) || !in_range(&rhs) {
        return Err(NoPlan::Unsupported);
    }
    Ok(GemmPlan {
        m: cols,
        n: rows,
        k: inner,
        lhs,
        rhs,
        batch,
    })
}

/// How BLAS reads one row-major operand of `shape` and `strides` over the output's batch.
fn operand(shape: &[usize], strides: &[usize], out_batch: &[usize]) -> Result<Operand, NoPlan> {
    let rank = shape.len();
    let (r, c) = (shape[rank - 2], shape[rank - 1]);
    let (sr, sc) = (strides[rank - 2], strides[rank - 1]);
    let (transpose, ld) = if (c == 1 || sc == 1) && (r == 1 || sr >= c) {
        (false, if r == 1 { c } else { sr })
    } else if (r == 1 || sr == 1) && (c == 1 || sc >= r) {
        (true, if c == 1 { r } else { sc })
    } else {
        return Err(NoPlan::Layout);
    };
    Ok(Operand {
        transpose,
        ld,
        batch_stride: batch_stride(&shape[..rank - 2], &strides[..rank - 2], out_batch)?,
    })
}

/// The one stride that walks this operand's batch dimensions in the output's order: 0 when it
/// has one matrix for all, an error when its dimensions do not collapse.
fn batch_stride(shape: &[usize], strides: &[usize], out_batch: &[usize]) -> Result<usize, NoPlan> {
    if shape.iter().product::<usize>() == 1 {
        return Ok(0);
    }
    if shape != out_batch {
        return Err(NoPlan::Unsupported);
    }
    // From the innermost batch dimension out, each (of size > 1) must step over the whole of
    // the ones inside it.
    let mut dims = shape.iter().zip(strides).rev().filter(|(size, _)| **size > 1);
    let (&first_size, &first_stride) = dims.next().expect("a batch of more than one has a dimension > 1");
    let mut expected = first_stride * first_size;
    for (&size, &stride) in dims {
        if stride != expected {
            return Err(NoPlan::Layout);
        }
        expected = stride * size;
    }
    Ok(first_stride)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values for a buffer of `n` elements.
    fn buffer(n: usize, seed: usize) -> Vec<f64> {
        (0..n).map(|i| ((i * 7 + seed * 13) % 23) as f64 - 11.0).collect()
    }

    /// Strides of a tensor of `shape`, its batch dimensions outermost in order: its matrices
    /// stored transposed (`[cols, rows]` in memory) or not, each row (column) `pad` elements
    /// past its width.
    fn strides(shape: &[usize], transposed: bool, pad: usize) -> Vec<usize> {
        let rank = shape.len();
        let (r, c) = (shape[rank - 2], shape[rank - 1]);
        let (mut strides, matrix) = if transposed {
            (vec![1, r + pad], (r + pad) * c)
        } else {
            (vec![c + pad, 1], (c + pad) * r)
        };
        let mut outer = matrix;
        for &size in shape[..rank - 2].iter().rev() {
            strides.insert(0, outer);
            outer *= size;
        }
        strides
    }
    /// The element of a row-major tensor at `index`, through its strides.
    fn at(buf: &[f64], strides: &[usize], index: &[usize]) -> f64 {
        buf[index.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>()]
    }

    /// `a · b` by the definition, batch broadcast as burn does, row-major `[batch…, rows, cols]`.
    fn reference(a: (&[f64], &[usize], &[usize]), b: (&[f64], &[usize], &[usize])) -> Vec<f64> {
        let rank = a.1.len();
        let out_batch: Vec<usize> = (0..rank - 2).map(|d| a.1[d].max(b.1[d])).collect();
        let (rows, inner, cols) = (a.1[rank - 2], a.1[rank - 1], b.1[rank - 1]);
        let mut out = Vec::new();
        let count: usize = out_batch.iter().product();
        for flat in 0..count {
            let mut rest = flat;
            let mut index = vec![0; rank - 2];
            for d in (0..rank - 2).rev() {
                index[d] = rest % out_batch[d];
                rest /= out_batch[d];
            }
            let pick = |shape: &[usize], d: usize| if shape[d] == 1 { 0 } else { index[d] };
            for i in 0..rows {
                for j in 0..cols {
                    let mut sum = 0.0;
                    for l in 0..inner {
                        let mut ia: Vec<usize> = (0..rank - 2).map(|d| pick(a.1, d)).collect();
                        ia.extend([i, l]);
                        let mut ib: Vec<usize> = (0..rank - 2).map(|d| pick(b.1, d)).collect();
                        ib.extend([l, j]);
                        sum += at(a.0, a.2, &ia) * at(b.0, b.2, &ib);
                    }
                    out.push(sum);
                }
            }
        }
        out
    }

    /// The plan executed as column-major BLAS does (`C = op(A)·op(B)`, `ldc = m`), read back
    /// row-major.
    fn execute(plan: &GemmPlan, a: &[f64], b: &[f64]) -> Vec<f64> {
        let read = |buf: &[f64], o: &Operand, p: usize, i: usize, j: usize| {
            let base = p * o.batch_stride;
            if o.transpose {
                buf[base + j + i * o.ld]
            } else {
                buf[base + i + j * o.ld]
            }
        };
        let mut c = vec![0.0; plan.batch * plan.m * plan.n];
        for p in 0..plan.batch {
            for i in 0..plan.m {
                for j in 0..plan.n {
                    c[p * plan.m * plan.n + i + j * plan.m] = (0..plan.k)
                        .map(|l| read(b, &plan.lhs, p, i, l) * read(a, &plan.rhs, p, l, j))
                        .sum();
                }
            }
        }
        c
    }

    /// Plans `a · b` for these layouts and checks the plan computes the product.
    fn check(a_shape: &[usize], a_strides: &[usize], b_shape: &[usize], b_strides: &[usize]) -> GemmPlan {
        let extent =
            |shape: &[usize], strides: &[usize]| 1 + shape.iter().zip(strides).map(|(n, s)| (n - 1) * s).sum::<usize>();
        let a = buffer(extent(a_shape, a_strides), 1);
        let b = buffer(extent(b_shape, b_strides), 2);
        let plan = plan(a_shape, a_strides, b_shape, b_strides).expect("a plan");
        let want = reference((&a, a_shape, a_strides), (&b, b_shape, b_strides));
        assert_eq!(execute(&plan, &a, &b), want, "{plan:?}");
        plan
    }

    #[test]
    fn contiguous_operands_are_read_untransposed() {
        let plan = check(&[3, 4], &[4, 1], &[4, 5], &[5, 1]);
        assert!(!plan.lhs.transpose && !plan.rhs.transpose);
        assert_eq!((plan.m, plan.n, plan.k, plan.lhs.ld, plan.rhs.ld), (5, 3, 4, 5, 4));
    }

    #[test]
    fn transposed_views_are_read_in_place() {
        // `x · wᵀ` with `w` stored `[5, 4]`: burn's view of its transpose has strides [1, 4].
        let plan = check(&[3, 4], &[4, 1], &[4, 5], &[1, 4]);
        assert!(plan.lhs.transpose && !plan.rhs.transpose);
        // Both transposed, and a batch of them.
        let plan = check(&[2, 3, 4], &[12, 1, 3], &[2, 4, 5], &[20, 1, 4]);
        assert!(plan.lhs.transpose && plan.rhs.transpose);
        assert_eq!((plan.batch, plan.lhs.batch_stride, plan.rhs.batch_stride), (2, 20, 12));
    }

    #[test]
    fn rows_padded_past_their_width_keep_their_stride() {
        // The halves of a fused product: views of every other 4 columns of an 8-wide row.
        let plan = check(&[3, 4], &[8, 1], &[4, 2], &[2, 1]);
        assert_eq!(plan.rhs.ld, 8);
    }

    #[test]
    fn a_broadcast_batch_is_read_once_for_all() {
        let plan = check(&[2, 3, 3, 4], &[36, 12, 4, 1], &[1, 1, 4, 5], &[20, 20, 5, 1]);
        assert_eq!((plan.batch, plan.lhs.batch_stride, plan.rhs.batch_stride), (6, 0, 12));
    }

    #[test]
    fn vectors_and_single_rows_have_leading_dimensions_blas_accepts() {
        // Decoding: one row; strides of size-1 dimensions are whatever burn left there.
        let plan = check(&[1, 4], &[0, 1], &[4, 5], &[5, 1]);
        assert!(plan.rhs.ld >= plan.k);
        let plan = check(&[3, 4], &[4, 1], &[4, 1], &[1, 7]);
        assert!(plan.lhs.ld >= 1);
    }

    proptest::proptest! {
        /// Any sizes, batches broadcast on either side or none, each operand transposed or not
        /// and padded or not: the plan computes the product.
        #[test]
        fn every_layout_burn_makes_has_a_plan_that_computes_the_product(
            sizes in proptest::collection::vec(1usize..4, 3),
            batch in proptest::collection::vec(1usize..3, 0..3),
            broadcast in 0usize..3,
            transposed in (proptest::bool::ANY, proptest::bool::ANY),
            pad in (0usize..2, 0usize..2),
        ) {
            let with_batch = |matrix: [usize; 2], keep: bool| {
                let mut shape: Vec<usize> = batch.iter().map(|&n| if keep { n } else { 1 }).collect();
                shape.extend(matrix);
                shape
            };
            let a_shape = with_batch([sizes[0], sizes[1]], broadcast != 1);
            let b_shape = with_batch([sizes[1], sizes[2]], broadcast != 2);
            check(&a_shape, &strides(&a_shape, transposed.0, pad.0), &b_shape, &strides(&b_shape, transposed.1, pad.1));
        }
    }

    #[test]
    fn layouts_without_a_plan_say_whether_a_copy_helps() {
        // Neither rows nor columns contiguous.
        assert_eq!(plan(&[3, 4], &[8, 2], &[4, 5], &[5, 1]), Err(NoPlan::Layout));
        // Batch dimensions permuted: no single stride walks them.
        assert_eq!(
            plan(&[2, 3, 1, 4], &[4, 8, 4, 1], &[2, 3, 4, 5], &[60, 20, 5, 1]),
            Err(NoPlan::Layout)
        );
        // Broadcast in part, an empty product, a mismatch.
        assert_eq!(
            plan(&[2, 1, 3, 4], &[12, 12, 4, 1], &[1, 3, 4, 5], &[60, 20, 5, 1]),
            Err(NoPlan::Unsupported)
        );
        assert_eq!(plan(&[0, 4], &[4, 1], &[4, 5], &[5, 1]), Err(NoPlan::Unsupported));
        assert_eq!(plan(&[3, 4], &[4, 1], &[5, 5], &[5, 1]), Err(NoPlan::Unsupported));
        assert_eq!(plan(&[1 << 31, 1], &[1, 1], &[1, 5], &[5, 1]), Err(NoPlan::Unsupported));
    }
}
