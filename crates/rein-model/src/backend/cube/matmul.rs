//! Matrix products in full f32 on CubeCL backends.
//!
//! burn-cuda 0.21 multiplies through cubek-matmul's `Auto` strategy, which tries a tensor-core
//! kernel first and stages f32 inputs as TF32 (a 10-bit mantissa): products land ~1e-3 off
//! (relative), and a model's logits ~1e-3 off transformers'. PyTorch's default is full f32
//! (`allow_tf32 = False` for matmul), and rein's parity bounds are set for it. So rein's products
//! on CUDA go through cubek-matmul's `SimpleUnit` strategy instead (the one `Auto` falls back to
//! where no tensor core applies): each unit multiplies and accumulates in f32. Other dtypes
//! (bf16, f16) keep burn's own product, tensor cores and all.

use burn::tensor::DType;
use burn::tensor::ops::FloatTensor;
use burn_cubecl::kernel::matmul::init_matmul_output;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use crate::backend::{CudaMatmul, LinearKernels};
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::matmul::launch::Strategy;
use cubek::std::InputBinding;

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> LinearKernels for CubeBackend<R, F, I, BT> {
    /// In full f32: burn's own product stages f32 inputs as TF32 on tensor cores.
    fn matmul(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        matmul(a, b)
    }
}

/// `a · b`, batched over the leading dimensions as burn's matmul is, as
/// [`crate::backend::set_cuda_matmul`] chose: through cuBLAS on CUDA where it opens; else in
/// full f32 when both are f32 (other dtypes: burn's product), or burn's TF32 product.
///
/// # Panics
/// If the kernel cannot be set up for these tensors, as burn's own matmul does.
fn matmul<R: CubeRuntime>(a: CubeTensor<R>, b: CubeTensor<R>) -> CubeTensor<R> {
    let choice = crate::backend::cuda_matmul();
    #[cfg(feature = "cuda")]
    let (a, b) = match choice {
        CudaMatmul::Cublas => match super::cublas::matmul(a, b) {
            Ok(out) => return out,
            Err(operands) => operands,
        },
        _ => (a, b),
    };
    let dtype = a.dtype;
    if dtype != DType::F32 || b.dtype != DType::F32 || choice == CudaMatmul::Tf32 {
        return burn_cubecl::kernel::matmul::matmul(a, b, None, Default::default(), dtype)
            .expect("burn's matmul launches for these tensors");
    }
    let out = init_matmul_output(&a, &b, dtype);
    let client = out.client.clone();
    let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: dtype.into(),
        rhs: dtype.into(),
        out: dtype.into(),
    });
    let strategy = Strategy::SimpleUnit(Default::default());
    let launched = cubek::matmul::launch::launch_ref(
        &strategy,
        &client,
        InputBinding::new(a.binding(), dtype.into()),
        InputBinding::new(b.binding(), dtype.into()),
        out.clone().binding(),
        &mut dtypes,
    );
    if let Err(e) = launched {
        panic!("full-f32 matmul ({strategy}) could not launch: {e:?}");
    }
    out
}
