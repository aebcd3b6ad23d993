//! What the kernels' tests share: random inputs and comparisons with tolerances.

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend as _;
use burn::tensor::{Distribution, Tensor, TensorPrimitive};
use burn_flex::FlexTensor;

/// The autodiff backend the gradient tests run on.
pub(super) type A = Autodiff<Flex>;

/// Each element of the kernel's result within `tolerance` (relative above 1) of burn's.
pub(super) fn assert_close(what: &str, kernel: &[f32], ops: &[f32], tolerance: f32) {
    assert_eq!(kernel.len(), ops.len(), "{what}");
    for (i, (a, b)) in kernel.iter().zip(ops).enumerate() {
        assert!(
            (a - b).abs() <= tolerance * (1.0 + b.abs()),
            "{what}[{i}]: kernel {a} vs burn ops {b}"
        );
    }
}

/// RoPE tables with equal halves, as `lm::Rope` builds them: `[positions, dim]` cosines and
/// sines.
pub(super) fn rope_tables<B: burn::tensor::backend::Backend>(
    positions: usize,
    dim: usize,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let half = dim / 2;
    let angle = |p: usize, i: usize| p as f32 * (0.3 + i as f32 * 0.7);
    let table = |f: fn(f32) -> f32| {
        let values: Vec<f32> = (0..positions)
            .flat_map(|p| (0..dim).map(move |j| f(angle(p, j % half))))
            .collect();
        Tensor::<B, 2>::from_data(
            burn::tensor::TensorData::new(values, [positions, dim]),
            &Default::default(),
        )
    };
    (table(f32::cos), table(f32::sin))
}

pub(super) fn random<const D: usize>(shape: [usize; D], seed: u64) -> Tensor<Flex, D> {
    let device = Default::default();
    Flex::seed(&device, seed);
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), &device)
}

pub(super) fn raw<const D: usize>(x: &Tensor<Flex, D>) -> FlexTensor {
    x.clone().into_primitive().tensor()
}

pub(super) fn assert_tensors_close(kernel: FlexTensor, ops: FlexTensor) {
    let (a, b) = (
        Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(
            kernel.reshape(vec![kernel.layout().num_elements()].into()),
        )),
        Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(
            ops.reshape(vec![ops.layout().num_elements()].into()),
        )),
    );
    let (a, b) = (
        a.into_data().to_vec::<f32>().unwrap(),
        b.into_data().to_vec::<f32>().unwrap(),
    );
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
            "element {i}: kernel {x} vs burn ops {y}"
        );
    }
}

/// `∂loss/∂values[i]` by central differences, step 1e-2 (f32 inputs, f64 loss).
pub(super) fn central_difference(values: &[f32], i: usize, loss: impl Fn(Vec<f32>) -> f64) -> f32 {
    const STEP: f32 = 1e-2;
    let (mut up, mut down) = (values.to_vec(), values.to_vec());
    up[i] += STEP;
    down[i] -= STEP;
    ((loss(up) - loss(down)) / (2.0 * f64::from(STEP))) as f32
}

/// Standard normal draws from a seed (Box–Muller over a 64-bit LCG), the same on every run
/// whatever else seeds burn's generator concurrently.
pub(super) fn rand_like(seed: u64) -> impl FnMut() -> f32 {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut uniform = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    move || {
        let (u, v) = (uniform(), uniform());
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }
}
