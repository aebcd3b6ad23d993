//! What a product's output starts from, for every product of the crate (dense, packed, q8).

/// What `C` starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Init {
    /// Zeros: `C ← A·B`.
    Zero,
    /// Its current values: `C ← C + A·B` (a bias, or a sum over several products).
    Accumulate,
}
