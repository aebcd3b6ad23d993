//! Every product path against the plain reference, bit for bit.

use proptest::prelude::*;

use super::*;

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        })
        .collect()
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Checks every available instruction set against the reference, bit for bit.
fn check(m: usize, k: usize, n: usize, transpose_a: bool, transpose_b: bool, init: Init, seed: u64) {
    let a_data = values(m * k + 3, seed);
    let b_data = values(k * n + 5, seed + 1);
    let a = if transpose_a {
        MatRef::new(&a_data, 3, [m, k], [1, m]).unwrap()
    } else {
        MatRef::new(&a_data, 3, [m, k], [k, 1]).unwrap()
    };
    let b = if transpose_b {
        MatRef::new(&b_data, 5, [k, n], [1, k]).unwrap()
    } else {
        MatRef::new(&b_data, 5, [k, n], [n, 1]).unwrap()
    };
    let ldc = n + 2;
    let start = values(m * ldc, seed + 2);
    let mut expected = start.clone();
    matmul_reference(&mut expected, ldc, a, b, init);
    for isa in Isa::available() {
        let mut c = start.clone();
        matmul_on(isa, &mut c, ldc, a, b, init);
        assert_eq!(bits(&c), bits(&expected), "{isa}: {m}×{k}·{k}×{n}, {init:?}");
        // Small products run unpacked: the packed panels must give the same bits for them too.
        if k > 0 {
            let mut c = start.clone();
            packed_product_on(isa, &mut c, ldc, a, Rhs::Dense(b), init);
            assert_eq!(bits(&c), bits(&expected), "{isa} packed: {m}×{k}·{k}×{n}, {init:?}");
        }
    }
    // Rows starting from a bias: the bits of the bias written into every row, then accumulated.
    let bias = values(n, seed + 3);
    let mut expected = start.clone();
    expected.chunks_mut(ldc).for_each(|row| row[..n].copy_from_slice(&bias));
    matmul_reference(&mut expected, ldc, a, b, Init::Accumulate);
    for isa in Isa::available() {
        let mut c = start.clone();
        matmul_bias_on(isa, &mut c, ldc, a, b, &bias);
        assert_eq!(bits(&c), bits(&expected), "{isa} with a bias: {m}×{k}·{k}×{n}");
    }
}

#[test]
fn every_instruction_set_gives_the_reference_bits() {
    for (m, k, n) in [
        (1, 1, 1),
        (3, 7, 5),
        (13, 300, 37),
        (64, 256, 704),
        (7, 600, 33),
        (200, 40, 3),
        // Twelve-row tiles, whole and at the edges, over several inner blocks.
        (150, 600, 70),
        (300, 520, 64),
        // Decoding shapes: few-row tiles, `B` read in place and split across threads.
        (2, 40, 70),
        (5, 576, 600),
        (16, 576, 600),
        (100, 30, 130),
        // Small MLPs' products, unpacked: every tile height, masked last vectors.
        (256, 64, 64),
        (64, 256, 64),
        (257, 4, 65),
        (11, 9, 50),
        (4, 33, 24),
        (9, 5, 40),
    ] {
        for init in [Init::Zero, Init::Accumulate] {
            check(m, k, n, false, false, init, (m * k * n) as u64);
            check(m, k, n, true, true, init, (m + k + n) as u64);
        }
    }
}

#[test]
fn a_row_does_not_depend_on_the_rest_of_the_batch() {
    let (k, n) = (300, 70);
    let a_data = values(64 * k, 7);
    let b_data = values(k * n, 8);
    let b = MatRef::row_major(&b_data, k, n).unwrap();
    let mut batch = vec![0.0; 64 * n];
    matmul(&mut batch, n, MatRef::row_major(&a_data, 64, k).unwrap(), b, Init::Zero);
    for row in [0, 17, 63] {
        let mut single = vec![0.0; n];
        let a = MatRef::row_major(&a_data[row * k..(row + 1) * k], 1, k).unwrap();
        matmul(&mut single, n, a, b, Init::Zero);
        assert_eq!(bits(&single), bits(&batch[row * n..(row + 1) * n]), "row {row}");
    }
}

#[test]
fn empty_products() {
    let mut c = vec![1.0; 6];
    let a = MatRef::row_major(&[], 2, 0).unwrap();
    let b = MatRef::row_major(&[], 0, 3).unwrap();
    matmul(&mut c, 3, a, b, Init::Accumulate);
    assert_eq!(c, vec![1.0; 6]);
    matmul(&mut c, 3, a, b, Init::Zero);
    assert_eq!(c, vec![0.0; 6]);
}

#[test]
fn views_reading_out_of_bounds_are_refused() {
    let data = [0.0; 10];
    assert!(MatRef::new(&data, 0, [2, 5], [5, 1]).is_ok());
    let err = MatRef::new(&data, 1, [2, 5], [5, 1]).unwrap_err();
    assert!(err.to_string().contains("reads past its 10 elements"), "{err}");
    assert!(MatRef::new(&data, 0, [usize::MAX, 2], [usize::MAX, 1]).is_err());
}

/// A packed `B` gives, on every instruction set, the bits its dense copy gives: with scales of
/// every bit pattern, and with scales of an `f16`'s precision (a GGUF's), whose products with
/// the codes are exact, so that the register path fuses `scale · code + offset`.
fn check_packed(m: usize, k: usize, n: usize, block: usize, range: (i8, i8), offsets: bool, init: Init) {
    let any = crate::packed::tests::sample(k, n, block, range, offsets);
    let f16_scales = crate::packed::tests::with_f16_scales(&any);
    assert!(crate::packed::tests::products_fuse(&f16_scales) && !crate::packed::tests::products_fuse(&any));
    for b in [any, f16_scales] {
        check_packed_matrix(m, k, n, &b, init);
    }
}

fn check_packed_matrix(m: usize, k: usize, n: usize, b: &PackedMatrix, init: Init) {
    let dense = b.to_dense();
    let a_data = values(m * k, (m + k) as u64);
    let a = MatRef::row_major(&a_data, m, k).unwrap();
    let ldc = n + 3;
    let start = values(m * ldc, 5);
    let mut expected = start.clone();
    matmul_reference(&mut expected, ldc, a, MatRef::row_major(&dense, k, n).unwrap(), init);
    for isa in Isa::available() {
        let mut c = start.clone();
        matmul_packed_on(isa, &mut c, ldc, a, b, init);
        assert_eq!(bits(&c), bits(&expected), "{isa}: {m}×{k}·{k}×{n} packed, {init:?}");
    }
}

#[test]
fn packed_products_give_the_dense_bits() {
    for (m, k, n, block) in [
        (1, 64, 96, 32),
        (3, 70, 77, 32),
        (16, 300, 130, 16),
        (1, 576, 700, 32),
        (2, 64, 96, 32),
        (4, 100, 80, 32),
        (4, 64, 64, 32),
        (7, 40, 96, 32),
        (5, 64, 48, 16),
        (200, 96, 50, 32),
        (8, 64, 96, 32),
        (6, 96, 48, 32),
        (8, 48, 80, 16),
        (13, 64, 96, 32),
    ] {
        for (range, offsets) in [((0, 15), true), ((-8, 7), false), ((-128, 127), false), ((0, 31), true)] {
            for init in [Init::Zero, Init::Accumulate] {
                check_packed(m, k, n, block, range, offsets, init);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn any_shape_and_layout_matches_the_reference(
        m in 1usize..40, k in 0usize..300, n in 1usize..80,
        ta: bool, tb: bool, accumulate: bool, seed in 0u64..1000,
    ) {
        let init = if accumulate { Init::Accumulate } else { Init::Zero };
        check(m, k, n, ta, tb, init, seed);
    }
}
