//! GFLOP/s of the products a SmolLM2-135M LoRA GRPO step runs (training at 3392 rows, the
//! chunked head, decoding with packed weights at 1–16 rows), each layout as the model runs it:
//! `cargo run --release -p rein-kernels --example shape_speed`.
mod timing;

use rein_kernels::{Init, MatRef, PackedMatrix, matmul, matmul_packed};
use timing::best_of;

fn view(data: &[f32], rows: usize, cols: usize, column_major: bool) -> MatRef<'_> {
    match column_major {
        true => MatRef::new(data, 0, [rows, cols], [1, rows]).unwrap(),
        false => MatRef::row_major(data, rows, cols).unwrap(),
    }
}

fn main() {
    // (name, m, k, n, A column-major, B column-major)
    let dense = [
        ("gate fwd", 3392, 576, 1536, false, false),
        ("down dX", 3392, 1536, 576, false, true),
        ("o fwd", 3392, 576, 576, false, false),
        ("o dX", 3392, 576, 576, false, true),
        ("head chunk", 341, 576, 49152, false, true),
        ("head dX", 341, 49152, 576, false, false),
        ("lora B dX", 3392, 16, 1536, false, true),
        ("lora dA", 576, 3392, 16, true, false),
        ("lora xA", 3392, 576, 16, false, false),
    ];
    for (name, m, k, n, ta, tb) in dense {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect();
        let mut c = vec![0.0f32; m * n];
        let flop = 2.0 * (m * n * k) as f64;
        let runs = (4e9 / flop).clamp(3.0, 2000.0) as usize;
        let t = best_of(runs, || {
            matmul(&mut c, n, view(&a, m, k, ta), view(&b, k, n, tb), Init::Zero)
        });
        println!(
            "{name:>12} {m}×{k}×{n}: {:.1} GFLOP/s ({:.1} µs)",
            flop / t / 1e9,
            t * 1e6
        );
    }
    for m in [1, 2, 4, 8, 16] {
        for (name, k, n) in [("gate", 576, 1536), ("down", 1536, 576), ("head", 576, 49152)] {
            let codes: Vec<i8> = (0..k * n).map(|i| (i * 7 % 16) as i8).collect();
            let scales: Vec<f32> = (0..k / 32 * n).map(|i| 0.001 * (i % 13) as f32).collect();
            let packed = PackedMatrix::new([k, n], 32, &codes, scales.clone(), Some(scales)).unwrap();
            let a: Vec<f32> = (0..m * k).map(|i| (i % 5) as f32).collect();
            let mut c = vec![0.0f32; m * n];
            let flop = 2.0 * (m * n * k) as f64;
            let runs = (2e9 / flop).clamp(3.0, 2000.0) as usize;
            let av = MatRef::row_major(&a, m, k).unwrap();
            let t = best_of(runs, || matmul_packed(&mut c, n, av, &packed, Init::Zero));
            println!(
                "packed {name:>6} {m}×{k}×{n}: {:.1} GFLOP/s ({:.1} µs)",
                flop / t / 1e9,
                t * 1e6
            );
        }
    }
    // Decoding streams every weight from memory once per token: many copies, none cached.
    for m in [1, 2, 4, 16] {
        let (k, n) = (576, 1536);
        let copies = 100;
        let matrices: Vec<PackedMatrix> = (0..copies)
            .map(|c| {
                let codes: Vec<i8> = (0..k * n).map(|i| ((i + c) * 7 % 16) as i8).collect();
                let scales: Vec<f32> = (0..k / 32 * n).map(|i| 0.001 * ((i + c) % 13) as f32).collect();
                PackedMatrix::new([k, n], 32, &codes, scales.clone(), Some(scales)).unwrap()
            })
            .collect();
        let bytes: usize = matrices.iter().map(PackedMatrix::bytes).sum();
        let a: Vec<f32> = (0..m * k).map(|i| (i % 5) as f32).collect();
        let mut c = vec![0.0f32; m * n];
        let av = MatRef::row_major(&a, m, k).unwrap();
        let t = best_of(3, || {
            for b in &matrices {
                matmul_packed(&mut c, n, av, b, Init::Zero);
            }
        }) / copies as f64;
        println!(
            "packed from memory {m}×{k}×{n}: {:.1} µs, {:.1} GB/s of packed bytes",
            t * 1e6,
            bytes as f64 / copies as f64 / t / 1e9
        );
    }
}
