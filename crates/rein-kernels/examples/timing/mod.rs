//! Timing shared by the kernel examples.

use std::time::Instant;

/// The shortest of `runs` timed calls of `f` (after one untimed warm-up call), in seconds.
pub fn best_of(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}
