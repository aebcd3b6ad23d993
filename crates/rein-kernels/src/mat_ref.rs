//! [`MatRef`], a strided read-only view of an `f32` matrix: what the products read.

/// A read-only view of an `f32` matrix: element `(r, c)` is `data[offset + r·row_stride +
/// c·col_stride]`.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) offset: usize,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) row_stride: usize,
    pub(crate) col_stride: usize,
}

/// A view that would read outside its slice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a {rows}×{cols} view at offset {offset} with strides ({row_stride}, {col_stride}) reads past its {len} elements"
)]
pub struct OutOfBounds {
    rows: usize,
    cols: usize,
    offset: usize,
    row_stride: usize,
    col_stride: usize,
    len: usize,
}

impl<'a> MatRef<'a> {
    /// A view of `rows × cols` elements of `data`.
    pub fn new(
        data: &'a [f32],
        offset: usize,
        [rows, cols]: [usize; 2],
        [row_stride, col_stride]: [usize; 2],
    ) -> Result<Self, OutOfBounds> {
        let last = if rows == 0 || cols == 0 {
            Some(offset)
        } else {
            (rows - 1)
                .checked_mul(row_stride)
                .and_then(|r| (cols - 1).checked_mul(col_stride).and_then(|c| r.checked_add(c)))
                .and_then(|x| x.checked_add(offset))
        };
        match last {
            Some(last) if rows == 0 || cols == 0 || last < data.len() => Ok(Self {
                data,
                offset,
                rows,
                cols,
                row_stride,
                col_stride,
            }),
            _ => Err(OutOfBounds {
                rows,
                cols,
                offset,
                row_stride,
                col_stride,
                len: data.len(),
            }),
        }
    }

    /// A row-major `rows × cols` matrix.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Result<Self, OutOfBounds> {
        Self::new(data, 0, [rows, cols], [cols, 1])
    }

    /// The same elements, transposed (no copy).
    pub fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// `[rows, cols]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    /// Element `(r, c)`.
    pub fn at(&self, r: usize, c: usize) -> f32 {
        self.data[self.offset + r * self.row_stride + c * self.col_stride]
    }

    /// Row `r` as a slice, when its elements are contiguous.
    pub fn row(&self, r: usize) -> Option<&'a [f32]> {
        (self.col_stride == 1 || self.cols <= 1).then(|| &self.data[self.offset + r * self.row_stride..][..self.cols])
    }

    pub(crate) fn ptr(&self) -> *const f32 {
        self.data[self.offset..].as_ptr()
    }
}
