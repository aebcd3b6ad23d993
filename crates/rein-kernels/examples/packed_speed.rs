//! Times decoding's products (1 and 16 rows by a 576 × 1536 matrix: one token, and one token of
//! each of a GRPO group's 16 sequences) with the matrix dense, packed, and packed with the
//! activations quantised to 8 bits (not exact). `K=… N=…` in the environment choose another shape,
//! `CODES=bytes` codes that need a byte each (Q8_0, Q5_0, Q6_K; nibbles otherwise, as Q4_0/1 and
//! Q4_K), `BLOCK=16` Q6_K's blocks of 16 rows (32 otherwise).
use std::time::Instant;

use rein_kernels::{Init, MatRef, PackedMatrix, matmul, matmul_packed, matmul_packed_q8};

fn main() {
    let dims = |v: &str, d: usize| std::env::var(v).ok().and_then(|s| s.parse().ok()).unwrap_or(d);
    let (k, n, block) = (dims("K", 576), dims("N", 1536), dims("BLOCK", 32));
    let bytes = std::env::var("CODES").is_ok_and(|c| c == "bytes");
    let codes: Vec<i8> = match bytes {
        true => (0..k * n).map(|i| (i * 37 % 255) as i8).collect(),
        false => (0..k * n).map(|i| (i * 7 % 16) as i8).collect(),
    };
    // Scales with an f16's 11 significant bits, as a GGUF block's are.
    let f16_precision = |x: f32| f32::from_bits(x.to_bits() & 0xFFFF_E000);
    let scales: Vec<f32> = (0..k.div_ceil(block) * n)
        .map(|i| f16_precision(0.001 * (i % 13) as f32))
        .collect();
    let offsets = (!bytes).then(|| scales.clone());
    let packed = PackedMatrix::new([k, n], block, &codes, scales, offsets).unwrap();
    println!(
        "{k} × {n}, {} codes, blocks of {block}",
        if bytes { "byte" } else { "nibble" }
    );
    let dense = packed.to_dense();
    let b = MatRef::row_major(&dense, k, n).unwrap();
    for m in [1, 16, 256] {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 97) as f32 * 0.01).collect();
        let a = MatRef::row_major(&a, m, k).unwrap();
        let mut c = vec![0.0; m * n];
        for name in ["dense", "packed", "packed q8"] {
            let reps = 2000 / m;
            let start = Instant::now();
            for _ in 0..reps {
                match name {
                    "dense" => matmul(&mut c, n, a, b, Init::Zero),
                    "packed" => matmul_packed(&mut c, n, a, &packed, Init::Zero),
                    _ => matmul_packed_q8(&mut c, n, a, &packed, Init::Zero),
                }
            }
            let per = start.elapsed().as_secs_f64() / reps as f64;
            println!(
                "{m} row(s), {name}: {:.1} µs per product ({:.2} GB/s of dense weights)",
                per * 1e6,
                (k * n * 4) as f64 / per / 1e9
            );
        }
    }
}
