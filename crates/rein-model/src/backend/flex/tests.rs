//! Flex's kernels against burn's generic ops.

use burn::tensor::backend::Backend as _;
use burn::tensor::{Bool, Distribution, Int, Tensor, TensorPrimitive};

use super::*;

/// A weight found equal to a packed matrix is answered from memory while it is the same
/// storage; a changed weight (a new tensor, or a write to a shared one, which burn-flex
/// copies first) is compared again, and a different packed matrix is never taken for it.
#[test]
fn a_verified_weight_is_remembered_until_it_changes() {
    let (rows, cols, block) = (64usize, 40usize, 32usize);
    let codes: Vec<i8> = (0..rows * cols).map(|i| (i % 15) as i8 - 7).collect();
    let scales: Vec<f32> = (0..rows.div_ceil(block) * cols)
        .map(|i| 0.01 * (i % 7 + 1) as f32)
        .collect();
    let packed = Arc::new(PackedMatrix::new([rows, cols], block, &codes, scales.clone(), None).unwrap());
    let dense = || tensor(packed.to_dense(), &[rows, cols]);
    let weight = dense();
    assert!(Flex::equals_packed(weight.clone(), &packed));
    assert!(VerifiedWeights::remembers(&weight, &packed));
    assert!(Flex::equals_packed(weight.clone(), &packed), "answered again");
    // Equal values in other storage: compared, equal.
    assert!(Flex::equals_packed(dense(), &packed));
    // A write to the shared weight copies it: the result is another storage, compared.
    let changed = Flex::float_add_scalar(weight.clone(), 1.0.into());
    assert!(!VerifiedWeights::remembers(&changed, &packed));
    assert!(!Flex::equals_packed(changed, &packed));
    assert!(
        Flex::equals_packed(weight.clone(), &packed),
        "the original is unchanged"
    );
    // The same values under another packed matrix with other scales: not equal.
    let other = Arc::new(
        PackedMatrix::new(
            [rows, cols],
            block,
            &codes,
            scales.iter().map(|s| 2.0 * s).collect(),
            None,
        )
        .unwrap(),
    );
    assert!(!Flex::equals_packed(weight, &other));
}

fn random<const D: usize>(shape: [usize; D], seed: u64) -> Tensor<Flex, D> {
    let device = Default::default();
    Flex::seed(&device, seed);
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), &device)
}

fn raw<const D: usize>(x: &Tensor<Flex, D>) -> FlexTensor {
    x.clone().into_primitive().tensor()
}

fn assert_close(kernel: FlexTensor, ops: FlexTensor) {
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

#[test]
fn rms_norm_matches_burn_ops() {
    let (x, w) = (random([5, 24], 1), random([24], 2));
    assert_close(
        Flex::rms_norm(raw(&x), raw(&w), 1e-6),
        rms_norm_ops::<Flex>(raw(&x), raw(&w), 1e-6),
    );
}

#[test]
fn rope_matches_burn_ops_on_a_transposed_view() {
    let device = Default::default();
    // [batch, seq, heads, dim] viewed as [batch, heads, seq, dim], as the model does.
    let x = random([2, 3, 4, 8], 3).swap_dims(1, 2);
    let (cos, sin) = (random([10, 8], 4), random([10, 8], 5));
    let positions = Tensor::<Flex, 2, Int>::from_data([[0, 1, 2], [4, 7, 9]], &device);
    assert_close(
        Flex::rope(raw(&x), positions.clone().into_primitive(), raw(&cos), raw(&sin)),
        rope_ops::<Flex>(raw(&x), positions.into_primitive(), raw(&cos), raw(&sin)),
    );
}

#[test]
fn cached_attention_matches_burn_ops_with_padding() {
    let device = Default::default();
    // 4 query heads over 2 key/value heads; a cache of capacity 7.
    let (k, v) = (random([3, 2, 7, 8], 7), random([3, 2, 7, 8], 8));
    // Decoding one token, prefilling five, and three more after two cached.
    for (seq, offset) in [(1, 4), (5, 0), (3, 2)] {
        let keys = offset + seq;
        // A transposed view, as the model's queries are.
        let q = random([3, seq, 4, 8], 6 + seq as u64).swap_dims(1, 2);
        let flags: Vec<bool> = (0..3 * keys).map(|i| i % keys < i / keys).collect();
        let padding = Tensor::<Flex, 1, Bool>::from_data(flags.as_slice(), &device).reshape([3, keys]);
        for padding in [None, Some(padding)] {
            let padding = padding.map(Tensor::into_primitive);
            assert_close(
                Flex::cached_attention(raw(&q), raw(&k), raw(&v), offset, padding.clone()),
                cached_attention_ops::<Flex>(raw(&q), raw(&k), raw(&v), offset, padding),
            );
        }
    }
}

#[test]
fn write_cache_matches_slice_assign_and_writes_in_place() {
    let buffer = random([2, 3, 6, 4], 9);
    // A transposed view, as the model's values are.
    let values = random([2, 2, 3, 4], 10).swap_dims(1, 2);
    let expected = write_cache_ops::<Flex>(raw(&buffer), raw(&values), 3);
    let buffer = buffer.into_primitive().tensor();
    let address = buffer.bytes().as_ptr();
    let written = Flex::write_cache(buffer, raw(&values), 3);
    assert_eq!(written.bytes().as_ptr(), address, "the buffer was copied");
    assert_close(written, expected);
}

#[test]
fn linear_matches_burn_ops_on_strided_inputs() {
    let x = random([7, 5], 11);
    let weight = random([3, 5], 12).transpose(); // [5, 3], column-major
    let bias = random([3], 13);
    for bias in [None, Some(raw(&bias))] {
        assert_close(
            Flex::fused_linear(raw(&x), raw(&weight), bias.clone()),
            linear_ops::<Flex>(raw(&x), raw(&weight), bias),
        );
    }
    let big = (random([64, 256], 14), random([256, 300], 15));
    assert_close(
        Flex::fused_linear(raw(&big.0), raw(&big.1), None),
        linear_ops::<Flex>(raw(&big.0), raw(&big.1), None),
    );
}

#[test]
fn swiglu_matches_burn_ops() {
    let (gate, up) = (random([4, 9], 16).mul_scalar(8.0), random([4, 9], 17));
    assert_close(
        Flex::swiglu(raw(&gate), raw(&up)),
        swiglu_ops::<Flex>(raw(&gate), raw(&up)),
    );
    // The two halves of one fused gate-and-up product, read as views.
    let gate_up = random([5, 18], 18).mul_scalar(4.0);
    let (gate, up) = (gate_up.clone().narrow(1, 0, 9), gate_up.narrow(1, 9, 9));
    assert!(!raw(&up).is_contiguous());
    assert_close(
        Flex::swiglu(raw(&gate), raw(&up)),
        swiglu_ops::<Flex>(raw(&gate), raw(&up)),
    );
}

#[test]
fn fast_exp_matches_libm() {
    let mut worst = 0.0f32;
    for i in -87_000..=88_000 {
        let x = i as f32 / 1_000.0;
        worst = worst.max((exp_f32(x) - x.exp()).abs() / x.exp());
    }
    assert!(worst < 3e-7, "max relative error {worst}");
    let tiny = exp_f32(f32::NEG_INFINITY);
    assert!((0.0..1e-37).contains(&tiny), "exp(-∞) = {tiny}");
}

#[test]
fn rational_tanh_matches_libm() {
    let mut worst = 0.0f32;
    for i in -100_000..=100_000 {
        let x = i as f32 / 5_000.0; // [-20, 20]
        worst = worst.max((tanh_f32(x) - x.tanh()).abs());
    }
    assert!(worst < 5e-7, "max error {worst}");
    assert_eq!(tanh_f32(0.0), 0.0);
    assert!(tanh_f32(f32::INFINITY) <= 1.0 && tanh_f32(f32::NEG_INFINITY) >= -1.0);
}
