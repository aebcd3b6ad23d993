//! GFLOP/s of rein's matrix product against the `gemm` crate on the shapes rein trains and
//! decodes with, then the rate at which decoding SmolLM2-135M's products stream their weights
//! from memory: `cargo run --release -p rein-kernels --example matmul_speed`.

mod timing;

use rein_kernels::{Init, Isa, MatRef, matmul::matmul_on};
use timing::best_of;

fn main() {
    let shapes = [
        ("decode b=1", 1, 256, 704),
        ("decode b=64", 64, 256, 704),
        ("train fwd", 3328, 256, 704),
        ("train dX", 3328, 704, 256),
        ("train dW", 256, 3328, 704),
        ("lm head", 3328, 256, 512),
        ("square 512", 512, 512, 512),
    ];
    let ppo = [
        ("ppo in", 256, 4, 64),
        ("ppo hidden", 256, 64, 64),
        ("ppo out", 256, 64, 2),
        ("ppo value", 256, 64, 1),
        ("ppo dX out", 256, 2, 64),
        ("ppo dW in", 4, 256, 64),
        ("ppo dW hid", 64, 256, 64),
        ("ppo dW out", 64, 256, 2),
        ("ppo dW val", 64, 256, 1),
    ];
    for (name, m, k, n) in shapes.into_iter().chain(ppo) {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect();
        let mut c = vec![0.0f32; m * n];
        let flop = 2.0 * (m * n * k) as f64;
        let runs = (2e9 / flop).clamp(3.0, 2000.0) as usize;
        let mut line = format!("{name:>12} {m}×{k}×{n}:");
        for isa in Isa::available() {
            let av = if name.contains("dW") {
                MatRef::new(&a, 0, [m, k], [1, m]).unwrap()
            } else {
                MatRef::row_major(&a, m, k).unwrap()
            };
            let bv = MatRef::row_major(&b, k, n).unwrap();
            let t = best_of(runs, || matmul_on(isa, &mut c, n, av, bv, Init::Zero));
            line += &format!(" {isa} {:.1} ({:.1} µs)", flop / t / 1e9, t * 1e6);
        }
        let t = best_of(runs, || unsafe {
            gemm::gemm(
                m,
                n,
                k,
                c.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr(),
                1,
                k as isize,
                b.as_ptr(),
                1,
                n as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                if m * n * k > 1 << 20 {
                    gemm::Parallelism::Rayon(0)
                } else {
                    gemm::Parallelism::None
                },
            )
        });
        line += &format!(" | gemm {:.1} GFLOP/s ({:.1} µs)", flop / t / 1e9, t * 1e6);
        println!("{line}");
    }
    streaming();
}

/// SmolLM2-135M's decoding products (hidden 576, q/k/v 960, gate/up 3072, down 1536, head
/// 49,152) at batch 1 and 16, each over enough distinct weight copies (≥ 1 GB in all) that
/// they come from memory as in a real decoding step, not from cache: GB/s of weights read.
fn streaming() {
    let shapes = [
        ("qkv", 576, 960),
        ("o", 576, 576),
        ("gate_up", 576, 3072),
        ("down", 1536, 576),
        ("head", 576, 49152),
    ];
    for m in [1, 16] {
        for (name, k, n) in shapes {
            let copies = (1_000_000_000 / (4 * k * n)).max(2);
            let weights: Vec<Vec<f32>> = (0..copies)
                .map(|c| (0..k * n).map(|i| ((i + c) % 7) as f32 * 0.1).collect())
                .collect();
            let a: Vec<f32> = (0..m * k).map(|i| (i % 5) as f32).collect();
            let mut c = vec![0.0f32; m * n];
            let av = MatRef::row_major(&a, m, k).unwrap();
            let t = best_of(3, || {
                for w in &weights {
                    let bv = MatRef::row_major(w, k, n).unwrap();
                    matmul_on(Isa::active(), &mut c, n, av, bv, Init::Zero);
                }
            }) / copies as f64;
            println!(
                "{:>12} {m}×{k}×{n}, from memory: {:.1} GB/s of weights, {:.1} GFLOP/s ({:.1} µs)",
                format!("smollm2 {name}"),
                (4 * k * n) as f64 / t / 1e9,
                (2 * m * k * n) as f64 / t / 1e9,
                t * 1e6
            );
        }
    }
}
