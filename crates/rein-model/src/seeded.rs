//! Seeding burn's random initialisation without races.
//!
//! burn keeps one random generator per backend, shared by every thread: two runs in one
//! process (parallel tests, a server and a trainer) that seed it and then initialise a model
//! could interleave and draw each other's numbers. [`seeded`] makes "seed, then initialise" one
//! step: at most one thread is inside it at a time.

use std::sync::Mutex;

use crate::Backend;

static INIT: Mutex<()> = Mutex::new(());

/// Seeds `B`'s generator with `seed` and runs `init` before any other thread can use it.
pub fn seeded<B: Backend, T>(device: &B::Device, seed: u64, init: impl FnOnce() -> T) -> T {
    let _alone = INIT.lock().unwrap_or_else(|e| e.into_inner());
    B::seed(device, seed);
    init()
}
