//! GFLOP/s of the products one SAC/TD3 update runs on Pendulum (256 rows, 64-unit MLPs), each
//! layout as `FlatMlp` runs it: `cargo run --release -p rein-kernels --example small_speed`.
mod timing;

use rein_kernels::{Init, MatRef, matmul};
use timing::best_of;

fn view(data: &[f32], rows: usize, cols: usize, column_major: bool) -> MatRef<'_> {
    match column_major {
        true => MatRef::new(data, 0, [rows, cols], [1, rows]).unwrap(),
        false => MatRef::row_major(data, rows, cols).unwrap(),
    }
}

fn main() {
    // (name, m, k, n, A column-major, B column-major)
    let shapes = [
        ("hidden fwd", 256, 64, 64, false, false),
        ("hidden dX", 256, 64, 64, false, true),
        ("hidden dW", 64, 256, 64, true, false),
        ("input fwd", 256, 4, 64, false, false),
        ("input dW", 4, 256, 64, true, false),
        ("head fwd", 256, 64, 2, false, false),
        ("head dX", 256, 2, 64, false, true),
        ("head dW", 64, 256, 2, true, false),
        ("critic fwd", 256, 64, 1, false, false),
        ("critic dW", 64, 256, 1, true, false),
        ("wide fwd", 256, 256, 256, false, false),
        ("wide dX", 256, 256, 256, false, true),
        ("wide dW", 256, 256, 256, true, false),
        ("act fwd", 1, 64, 64, false, false),
    ];
    let mut total = 0.0;
    for (name, m, k, n, ta, tb) in shapes {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect();
        let mut c = vec![0.0f32; m * n];
        let flop = 2.0 * (m * n * k) as f64;
        let runs = (2e9 / flop).clamp(3.0, 20000.0) as usize;
        let t = best_of(runs, || {
            matmul(&mut c, n, view(&a, m, k, ta), view(&b, k, n, tb), Init::Accumulate)
        });
        if !name.starts_with("wide") {
            total += t;
        }
        println!(
            "{name:>12} {m}×{k}×{n}: {:.1} GFLOP/s ({:.2} µs)",
            flop / t / 1e9,
            t * 1e6
        );
    }
    println!("64-unit shapes, one of each: {:.2} µs", total * 1e6);
}
