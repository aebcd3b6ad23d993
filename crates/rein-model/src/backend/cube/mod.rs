//! rein's kernels for burn's CubeCL backends (burn-cuda, burn-wgpu): `#[cube]` functions that
//! CubeCL compiles for the device at run time (NVRTC on CUDA, WGSL/SPIR-V on wgpu), one launch
//! where burn's generic ops take several, each with its backward.
//!
//! - `norm.rs`: RMSNorm, one cube per row (three launches backward, `∂w` summed over rows in
//!   a fixed order).
//! - `glu.rs`: the SwiGLU and GeGLU gates and their backward, element-wise, reading the
//!   halves of a fused gate-and-up product through their strides.
//! - `rope.rs`: rotary embedding, reading `x` through its strides (its backward is itself,
//!   rotated the other way).
//! - `attention.rs`: attention over the key/value cache (decoding, prefill), one cube per query
//!   row reading the cache in place.
//! - `packed_attention.rs`: causal attention of packed sequences (training), one launch forward
//!   and two backward, however many sequences.
//! - `softmax.rs`: what the attention kernels share (a score, a running softmax per unit and
//!   their merge in unit order).
//! - `head.rs`: the chosen tokens' log-probabilities and the entropies from rows of logits,
//!   and their backward, one cube per row.
//! - `matmul.rs`: products in full f32, where burn's own stage f32 inputs as TF32; on CUDA
//!   through cuBLAS (`cublas.rs`, laid out by `gemm_plan.rs`) where it can be opened.
//!
//! Every kernel reads and writes the tensors' own dtype (f32, f16, bf16) and computes in f32.
//! The families without a kernel here keep their defaults, burn's generic ops. This module owns
//! the device code and its launches; what each op means, and its autodiff, live in the family's
//! own file beside the CPU kernels.
//!
//! The tests run every kernel on burn-wgpu against burn's ops (values and gradients): on a
//! machine without a GPU, on Mesa's lavapipe (a Vulkan driver on the CPU).

mod attention;
#[cfg(feature = "cuda")]
mod cublas;
#[cfg(any(feature = "cuda", test))]
mod gemm_plan;
mod glu;
mod head;
mod matmul;
mod norm;
mod packed_attention;
mod rope;
mod softmax;
#[cfg(all(test, feature = "wgpu"))]
mod tests;

use burn::tensor::Shape;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::*;

use super::{LoraKernels, ReinBackend, TanhKernels};
#[cfg(feature = "cuda")]
pub(super) use cublas::{calls as cublas_calls, library as cublas_library};

/// Units per cube of the kernels that reduce a row: a power of two, as [`cube_reduce`] needs.
const ROW_UNITS: u32 = 256;

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> ReinBackend for CubeBackend<R, F, I, BT> {}
impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> TanhKernels for CubeBackend<R, F, I, BT> {}
impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> LoraKernels for CubeBackend<R, F, I, BT> {}

#[cfg(all(test, feature = "wgpu"))]
thread_local! {
    /// How many of this module's kernels this thread has launched.
    static LAUNCHES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many of rein's CubeCL kernels the calling thread has launched: what the tests read to
/// know that a family's impl took its kernel, not burn's ops.
#[cfg(all(test, feature = "wgpu"))]
fn fused_launches() -> u64 {
    LAUNCHES.with(std::cell::Cell::get)
}

/// Counts a launch, in the tests ([`fused_launches`]).
fn count_launch() {
    #[cfg(all(test, feature = "wgpu"))]
    LAUNCHES.with(|n| n.set(n.get() + 1));
}

/// A new contiguous tensor of `shape`, on `like`'s device and in its dtype.
fn empty_like<R: CubeRuntime>(like: &CubeTensor<R>, shape: Shape) -> CubeTensor<R> {
    empty_device_contiguous_dtype(like.client.clone(), like.device.clone(), shape, like.dtype)
}

/// The sum (or, with `max`, the maximum) of every unit's `value` in the cube, returned to every
/// unit: a tree over shared memory, so its order is the same on every run. `shared` holds one
/// `f32` per unit and `CUBE_DIM_X` is a power of two.
#[cube]
fn cube_reduce(value: f32, shared: &mut SharedMemory<f32>, #[comptime] max: bool) -> f32 {
    let unit = UNIT_POS_X as usize;
    shared[unit] = value;
    sync_cube();
    let mut stride = (CUBE_DIM_X / 2) as usize;
    while stride > 0 {
        if unit < stride {
            let (a, b) = (shared[unit], shared[unit + stride]);
            if comptime!(max) {
                shared[unit] = select(b > a, b, a);
            } else {
                shared[unit] = a + b;
            }
        }
        sync_cube();
        stride /= 2;
    }
    let total = shared[0];
    sync_cube();
    total
}
