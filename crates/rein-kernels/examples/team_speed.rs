//! Times handing work to another thread: an empty join through the kernels' team and through
//! rayon from outside its pool, and joins of two equal halves of some busy work against one
//! thread doing both.
use std::hint::black_box;
use std::time::Instant;

use rein_kernels::team::join;

/// Microseconds per call of `f`, over `reps` calls.
fn micros(reps: u32, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..reps {
        f();
    }
    start.elapsed().as_secs_f64() / f64::from(reps) * 1e6
}

fn main() {
    let team = micros(100_000, || {
        black_box(join(|| black_box(1), || black_box(2)));
    });
    let rayon = micros(10_000, || {
        black_box(rayon::join(|| black_box(1), || black_box(2)));
    });
    println!("empty join: team {team:.2} µs, rayon from outside its pool {rayon:.2} µs");
    let work = |n: u64| (0..n).fold(0u64, |h, i| black_box(h.wrapping_mul(31).wrapping_add(i)));
    for n in [1_000, 4_000, 16_000] {
        let one = micros(2_000, || {
            black_box(work(2 * n));
        });
        let two = micros(2_000, || {
            black_box(join(|| work(n), || work(n)));
        });
        println!("two halves of {n} steps: one thread {one:.2} µs, team {two:.2} µs");
    }
}
