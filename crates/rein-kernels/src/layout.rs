//! Host-side layout changes of weight matrices.
//!
//! Hugging Face stores a linear layer's weight as `[out, in]`, burn as `[in, out]`; a tied LM
//! head is the embeddings' transpose. The matrix kernel reads a row-major right-hand side in
//! place when few rows multiply it (decoding) and repacks a transposed view for every product,
//! so weights are transposed once, here, rather than viewed transposed.

/// The `cols × rows` transpose of a row-major `rows × cols` matrix, in cache-sized tiles.
pub fn transposed<T: Copy + Default>(m: &[T], rows: usize, cols: usize) -> Vec<T> {
    const TILE: usize = 32;
    let mut out = vec![T::default(); m.len()];
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    out[c * rows + r] = m[r * cols + c];
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::transposed;

    #[test]
    fn transposed_moves_every_element_across_ragged_tiles() {
        let (rows, cols) = (37, 70);
        let m: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        let t = transposed(&m, rows, cols);
        for r in 0..rows {
            for c in 0..cols {
                assert_eq!(t[c * rows + r], m[r * cols + c]);
            }
        }
        assert_eq!(transposed(&t, cols, rows), m);
    }
}
