//! rein's CPU kernels: matrix products and reductions whose every output is computed by the same
//! operations in the same order on every instruction set.
//!
//! **Architecture invariant:** this crate works on plain `f32` slices. It knows nothing about
//! burn, tensors, models or plugins; `rein-model` adapts burn's tensors to it.
//!
//! # Reproducibility
//!
//! A kernel may run on AVX-512, AVX2 or plain scalar code ([`isa`]; `REIN_CPU` caps it), on one
//! thread or several, in cache blocks of any size. None of that changes a result: each output
//! element is one fixed sequence of IEEE operations (for a product, one chain of fused
//! multiply-adds in order — see [`matmul`]), and the vector width only decides how many
//! *different* elements are computed at once. So the same inputs give the same bits on any
//! x86-64 CPU, and a row's result never depends on the other rows of its batch.
//!
//! A weight matrix may also be kept the way a quantised model file stores it ([`packed`]):
//! products with it give the bits of its dense copy while reading a fraction of the bytes.

mod init;
mod interleave;
pub mod isa;
mod layout;
mod mat_ref;
pub mod matmul;
mod micro_kernel;
pub mod packed;
mod panels;
mod q8;
pub mod team;
mod unpacked;

pub use isa::Isa;
pub use layout::transposed;
pub use matmul::{Init, MatRef, matmul, matmul_bias, matmul_packed};
pub use packed::{PackError, PackedMatrix};
pub use q8::matmul_packed_q8;
