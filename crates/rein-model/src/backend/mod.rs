//! The backends rein's modules run on: any burn backend, plus rein's fused kernels where a
//! backend has a faster path than its generic ops.
//!
//! Each family of kernels is a trait in its own file, and [`ReinBackend`] is their union. A
//! trait's default methods compose burn's own ops, so any backend qualifies with empty `impl`s
//! (the CubeCL ones do for the families `cube/` has no kernel for). Beside each trait sit Flex's kernels, the autodiff version with the
//! family's own backward, and the tests against burn's ops:
//!
//! - `tanh.rs`: burn-flex computes `tanh` with libm's scalar `tanhf` and burn's autodiff
//!   recomputes it in the backward pass; with 64-wide PPO networks that was over half of each
//!   update. Here it is one vectorised pass, and its autodiff version keeps the output.
//! - `norm.rs` (RMSNorm), `rope.rs`, `glu.rs` (SwiGLU and GeGLU gates): one pass each instead of
//!   two to ten burn ops.
//! - `attention/`: decoding and prefill read the key/value cache in place instead of copying its
//!   filled prefix and repeating it per query head, write their output in the layout the next
//!   projection reads, and write the cache in place; whole-sequence attention (training and
//!   scoring) has a backward that recomputes each query's weights and writes `∂q`, `∂k`, `∂v` in
//!   one pass per sequence.
//! - `linear.rs`: one `gemm` call with the bias folded in, on both cores from a smaller size
//!   than burn-flex's matmul uses them, and products that read quantised weights in place.
//! - `lora.rs`: a LoRA layer `x·W + b + (s·x·A)·B` as one op, its update accumulated into the
//!   base product's output, forward and backward.
//! - `cube/` (CUDA and wgpu, through CubeCL): RMSNorm, RoPE, the gates, attention (over the
//!   cache, and of packed sequences with its backward) and the head's log-probabilities as
//!   `#[cube]` kernels, and matrix products in full f32, where burn-cuda's own use TF32.
//! - `head.rs` (every backend): the chosen tokens' log-probabilities and the entropies from the
//!   hidden states and the head, a few rows of logits at a time, recomputed in the backward
//!   pass: never `[rows, vocab]` logits.
//!
//! These are what decoding a token and a training step spend their time on.

mod attention;
#[cfg(feature = "cube")]
mod cube;
mod flex;
mod glu;
mod head;
mod linear;
mod lora;
mod norm;
mod rope;
mod tanh;
#[cfg(test)]
mod testing;

pub use attention::{AttentionKernels, PackedSequences, Scoring};
pub use glu::GluKernels;
pub use head::{HeadKernels, Logits};
pub use linear::{LinearKernels, affine, held_in};
pub use lora::LoraKernels;
pub use norm::NormKernels;
pub use rope::RopeKernels;
pub use tanh::TanhKernels;
pub(crate) use tanh::tanh_f32;

pub(crate) use linear::{linear, linear_in};

use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::{Autodiff, NodeId};

/// A burn backend with rein's fused kernels, one trait per family of ops. Each trait's defaults
/// use burn's own ops, so any backend qualifies with empty `impl`s.
pub trait ReinBackend:
    burn::tensor::backend::Backend
    + TanhKernels
    + LinearKernels
    + LoraKernels
    + NormKernels
    + RopeKernels
    + GluKernels
    + AttentionKernels
    + HeadKernels
{
    /// Into how many shards, each decoded by its own thread with its own key/value cache, to
    /// split a decoding batch of `rows` sequences. One (the default) on backends that
    /// parallelise each op themselves.
    fn decode_shards(rows: usize) -> usize {
        let _ = rows;
        1
    }
}

impl<B: ReinBackend, C: CheckpointStrategy> ReinBackend for Autodiff<B, C> {}

/// How CUDA multiplies matrices ([`LinearKernels::matmul`], and so every product of a
/// model). The CPU is unaffected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CudaMatmul {
    /// cuBLAS, opened at run time: f32 in full f32 (TF32 off, PyTorch's default), bf16 and f16
    /// on tensor cores accumulating in f32. Where cuBLAS cannot be opened (said once on
    /// stderr), or on another CubeCL runtime, [`CudaMatmul::FullF32`].
    #[default]
    Cublas,
    /// Full f32, one output tile per unit (cubek-matmul's `SimpleUnit`): PyTorch's default
    /// precision, the one rein's parity bounds hold for. (cubek's double-buffered `DoubleUnit`
    /// measured half as fast on an H100.) Other dtypes take burn's own product.
    FullF32,
    /// burn-cuda's own product: tensor cores with f32 inputs staged as TF32 (10-bit mantissa),
    /// as PyTorch with `allow_tf32 = True`. Products ~1e-3 off (relative).
    Tf32,
}

static CUDA_MATMUL: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Sets how CUDA multiplies matrices, process-wide.
pub fn set_cuda_matmul(kind: CudaMatmul) {
    CUDA_MATMUL.store(kind as u8, Ordering::Relaxed);
}

/// How CUDA multiplies matrices now ([`set_cuda_matmul`]).
pub fn cuda_matmul() -> CudaMatmul {
    match CUDA_MATMUL.load(Ordering::Relaxed) {
        1 => CudaMatmul::FullF32,
        2 => CudaMatmul::Tf32,
        _ => CudaMatmul::Cublas,
    }
}

/// cuBLAS's version, or why it cannot be opened (the library path, and what to install): what
/// [`CudaMatmul::Cublas`] runs on.
#[cfg(feature = "cuda")]
pub fn cublas_library() -> Result<&'static str, &'static str> {
    cube::cublas_library()
}

/// How many products this process has launched through cuBLAS (CubeCL's profiler sees only its
/// own kernels).
#[cfg(feature = "cuda")]
pub fn cublas_calls() -> u64 {
    cube::cublas_calls()
}

/// Set: every kernel of [`ReinBackend`] on Flex takes its default, burn's generic ops.
static GENERIC_OPS: AtomicBool = AtomicBool::new(false);

/// Makes Flex compute every kernel of [`ReinBackend`] with burn's generic ops, as the backends
/// without rein's kernels do (CUDA), instead of rein's fused CPU kernels; process-wide. This
/// is how the CPU tests check the path a GPU run takes: same model, same results within
/// rounding. Not for speed: the generic ops are several times slower.
pub fn use_generic_ops(on: bool) {
    GENERIC_OPS.store(on, Ordering::Relaxed);
}

/// Whether [`use_generic_ops`] is on.
pub fn generic_ops() -> bool {
    GENERIC_OPS.load(Ordering::Relaxed)
}

/// A [`ReinBackend`] that records gradients, whose inner backend is a [`ReinBackend`] too.
pub trait ReinAutodiffBackend: ReinBackend + burn::tensor::backend::AutodiffBackend<InnerBackend: ReinBackend> {}

impl<B: burn::tensor::backend::AutodiffBackend<InnerBackend: ReinBackend> + ReinBackend> ReinAutodiffBackend for B {}

pub(super) fn float<B: burn::tensor::backend::Backend, const D: usize>(x: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

/// Registers the gradients of a two-input op's inputs, those that track gradients.
pub(super) fn register_inputs<B: ReinBackend, const N: usize>(
    inputs: [Option<NodeId>; N],
    grads: &mut Gradients,
    values: [FloatTensor<B>; N],
) {
    for (id, grad) in inputs.into_iter().zip(values) {
        if let Some(id) = id {
            grads.register::<B>(id, grad);
        }
    }
}
