//! Products through cuBLAS on CUDA, on CubeCL's own buffers and stream.
//!
//! cuBLAS is opened at run time (as NVRTC is), from the library path: a CUDA toolkit's, or
//! PyTorch's `nvidia-cublas` wheel. Each product is one `cublasGemmStridedBatchedEx` call
//! ([`super::gemm_plan`] maps burn's row-major, strided, batched tensors onto it), on the CUDA
//! stream the output's memory belongs to, so it runs in order with CubeCL's kernels with no
//! sync (that stream is what rein's patch of cubecl-cuda exposes).
//!
//! - f32 computes in full f32 (`CUBLAS_COMPUTE_32F`, no TF32): PyTorch's default precision.
//! - bf16 and f16 multiply on tensor cores and accumulate in f32, writing their own dtype.
//! - Results repeat run to run on one GPU: one handle per stream (so its workspace is its
//!   own), the default algorithm, atomics off. cuBLAS picks its kernel by shape, never by
//!   timing.
//!
//! Where cuBLAS cannot be opened, or a layout has no plan, the caller keeps CubeCL's product.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use burn::tensor::DType;
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::kernel::matmul::init_matmul_output;
use burn_cubecl::tensor::CubeTensor;
use cubecl_cuda::CudaRuntime;
use cudarc::cublas::sys;

use super::gemm_plan::{GemmPlan, NoPlan, plan};

/// Products launched through cuBLAS in this process.
static CALLS: AtomicU64 = AtomicU64::new(0);

/// How many products this process has launched through cuBLAS: launches CubeCL's profiler does
/// not see.
pub fn calls() -> u64 {
    CALLS.load(Ordering::Relaxed)
}

/// cuBLAS's version (`"12.8.4"`), or why it could not be opened; looked up once per process.
pub fn library() -> Result<&'static str, &'static str> {
    static OPENED: OnceLock<Result<String, String>> = OnceLock::new();
    OPENED.get_or_init(open).as_deref().map_err(String::as_str)
}

fn open() -> Result<String, String> {
    // SAFETY: only dlopen of the candidate names; no symbol is called if none opens.
    if !unsafe { sys::is_culib_present() } {
        let mut seen = std::collections::HashSet::new();
        let mut names = cudarc::get_lib_name_candidates("cublas");
        names.retain(|name| name.starts_with("libcublas.so") && seen.insert(name.clone()));
        return Err(format!(
            "cuBLAS could not be opened: none of {} is on the library path. Install a CUDA toolkit, \
             or the nvidia-cublas wheel PyTorch installs (pip install nvidia-cublas-cu12 for CUDA \
             12), and add its lib folder to LD_LIBRARY_PATH",
            names.join(", ")
        ));
    }
    let part = |property| {
        let mut value = 0;
        // SAFETY: writes one int; the library is open.
        let status = unsafe { sys::cublasGetProperty(property, &mut value) };
        (status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS).then_some(value)
    };
    use sys::libraryPropertyType_t::{MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL};
    match (part(MAJOR_VERSION), part(MINOR_VERSION), part(PATCH_LEVEL)) {
        (Some(major), Some(minor), Some(patch)) => Ok(format!("{major}.{minor}.{patch}")),
        _ => Err("cuBLAS opened but did not report its version: a broken installation".into()),
    }
}

/// `value` as a `U` when `T` is `U` (the same type behind a type parameter), else back.
fn cast<T: 'static, U: 'static>(value: T) -> Result<U, T> {
    let mut slot = Some(value);
    match (&mut slot as &mut dyn std::any::Any).downcast_mut::<Option<U>>() {
        Some(same) => Ok(same.take().expect("filled above")),
        None => Err(slot.expect("not taken")),
    }
}

/// `a · b` through cuBLAS when `R` is CUDA, cuBLAS opened, the dtype is f32, bf16 or f16 and
/// the layout has a plan (after a contiguous copy if that gives one); the operands back
/// otherwise, for CubeCL's product.
#[expect(clippy::result_large_err, reason = "the operands go back by value, as they came")]
pub(super) fn matmul<R: CubeRuntime>(
    a: CubeTensor<R>,
    b: CubeTensor<R>,
) -> Result<CubeTensor<R>, (CubeTensor<R>, CubeTensor<R>)> {
    type Cuda = CubeTensor<CudaRuntime>;
    let (a, b) = cast::<(CubeTensor<R>, CubeTensor<R>), (Cuda, Cuda)>((a, b))?;
    let back = |a: Cuda, b: Cuda| {
        cast::<(Cuda, Cuda), (CubeTensor<R>, CubeTensor<R>)>((a, b))
            .map_err(|_| ())
            .expect("R is CUDA")
    };
    if let Err(why) = library() {
        static SAID: OnceLock<()> = OnceLock::new();
        SAID.get_or_init(|| eprintln!("rein: {why}. Products run on CubeCL's kernels instead."));
        return Err(back(a, b));
    }
    if a.dtype != b.dtype || data_type(a.dtype).is_none() {
        return Err(back(a, b));
    }
    let layout = |a: &Cuda, b: &Cuda| plan(a.meta.shape(), a.meta.strides(), b.meta.shape(), b.meta.strides());
    let (a, b, planned) = match layout(&a, &b) {
        Err(NoPlan::Layout) => {
            let (a, b) = (into_contiguous(a), into_contiguous(b));
            let planned = layout(&a, &b);
            (a, b, planned)
        }
        planned => (a, b, planned),
    };
    let Ok(planned) = planned else {
        return Err(back(a, b));
    };
    match gemm(&a, &b, &planned) {
        Some(out) => Ok(cast::<Cuda, CubeTensor<R>>(out).map_err(|_| ()).expect("R is CUDA")),
        None => Err(back(a, b)),
    }
}

/// cuBLAS's name for a dtype it multiplies.
fn data_type(dtype: DType) -> Option<sys::cudaDataType> {
    match dtype {
        DType::F32 => Some(sys::cudaDataType::CUDA_R_32F),
        DType::BF16 => Some(sys::cudaDataType::CUDA_R_16BF),
        DType::F16 => Some(sys::cudaDataType::CUDA_R_16F),
        _ => None,
    }
}

/// Launches the planned product on the output's stream; `None` if a buffer could not be
/// resolved (the device is in error: CubeCL's product will say so).
///
/// # Panics
/// If cuBLAS refuses a product its plan says it accepts, or cannot make a handle.
fn gemm(a: &CubeTensor<CudaRuntime>, b: &CubeTensor<CudaRuntime>, plan: &GemmPlan) -> Option<CubeTensor<CudaRuntime>> {
    let out = init_matmul_output(a, b, a.dtype);
    let client = &out.client;
    // Each resource holds its buffer (and its place in the stream's order) while cuBLAS is
    // given the pointers.
    let (ra, rb, rc) = (
        client.get_resource(a.handle.clone()).ok()?,
        client.get_resource(b.handle.clone()).ok()?,
        client.get_resource(out.handle.clone()).ok()?,
    );
    let stream = rc.resource().stream;
    let dtype = data_type(a.dtype)?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    let op = |transpose| {
        if transpose {
            sys::cublasOperation_t::CUBLAS_OP_T
        } else {
            sys::cublasOperation_t::CUBLAS_OP_N
        }
    };
    // Sizes fit the 32/64-bit integers below: the plan checked them.
    let int = |v: usize| v as i32;
    let (lhs, rhs) = (rb.resource().ptr, ra.resource().ptr);
    with_handle(stream, |handle| {
        // SAFETY: the pointers are live device buffers of the planned extents (held above), on
        // `stream`, which `handle` is bound to; alpha and beta are host f32s (compute 32F).
        let status = unsafe {
            sys::cublasGemmStridedBatchedEx(
                handle,
                op(plan.lhs.transpose),
                op(plan.rhs.transpose),
                int(plan.m),
                int(plan.n),
                int(plan.k),
                (&alpha as *const f32).cast::<c_void>(),
                lhs as *const c_void,
                dtype,
                int(plan.lhs.ld),
                plan.lhs.batch_stride as i64,
                rhs as *const c_void,
                dtype,
                int(plan.rhs.ld),
                plan.rhs.batch_stride as i64,
                (&beta as *const f32).cast::<c_void>(),
                rc.resource().ptr as *mut c_void,
                dtype,
                int(plan.m),
                (plan.m * plan.n) as i64,
                int(plan.batch),
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
            )
        };
        check(status, "cublasGemmStridedBatchedEx");
    });
    CALLS.fetch_add(1, Ordering::Relaxed);
    Some(out)
}

/// A cuBLAS handle bound to one stream, destroyed with its thread.
struct Handle(sys::cublasHandle_t);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by cublasCreate_v2 and used by no one else; a failure at exit is moot.
        let _ = unsafe { sys::cublasDestroy_v2(self.0) };
    }
}

thread_local! {
    /// This thread's handles, one per stream: a handle is not shared between threads, and
    /// never rebound (rebinding resets its workspace, and with it reproducibility).
    static HANDLES: RefCell<HashMap<usize, Handle>> = RefCell::new(HashMap::new());
}

/// Runs `f` with this thread's handle for `stream`, made on first use. CubeCL has just made
/// the device's context current on this thread (resolving the buffers).
fn with_handle(stream: cudarc::driver::sys::CUstream, f: impl FnOnce(sys::cublasHandle_t)) {
    HANDLES.with_borrow_mut(|handles| {
        let handle = handles.entry(stream as usize).or_insert_with(|| {
            let mut raw = std::ptr::null_mut();
            // SAFETY: out-pointer to a handle; the context is current.
            check(unsafe { sys::cublasCreate_v2(&mut raw) }, "cublasCreate_v2");
            let handle = Handle(raw);
            // SAFETY: a live handle and CubeCL's live stream (the same driver type).
            check(
                unsafe { sys::cublasSetStream_v2(raw, stream.cast()) },
                "cublasSetStream_v2",
            );
            let math = sys::cublasMath_t::CUBLAS_DEFAULT_MATH;
            // SAFETY: a live handle.
            check(unsafe { sys::cublasSetMathMode(raw, math) }, "cublasSetMathMode");
            let atomics = sys::cublasAtomicsMode_t::CUBLAS_ATOMICS_NOT_ALLOWED;
            // SAFETY: a live handle.
            check(
                unsafe { sys::cublasSetAtomicsMode(raw, atomics) },
                "cublasSetAtomicsMode",
            );
            handle
        });
        f(handle.0);
    });
}

/// Panics with cuBLAS's status where a call failed.
fn check(status: sys::cublasStatus_t, call: &str) {
    assert!(
        status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS,
        "{call} failed: {status:?}"
    );
}
