//! One autodiff graph built and differentiated at a time in a process.
//!
//! burn-autodiff 0.21 keeps every graph of a process in one server, and each `backward()` ends
//! by sweeping all of them for steps nothing refers to any more, including a graph another
//! thread is still building. A step that thread has just created can look unreferenced, gets
//! freed, and its `backward()` then returns no gradient (or part of one) for a parameter that
//! plainly took part in the loss: tracel-ai/burn#5573, seen here as a parallel test's
//! `grad(..)` coming back `None` once in a few hundred runs. burn has no release with a fix.
//!
//! So whoever builds a graph and differentiates it (a trainer's step, a test) holds
//! [`one_graph`] from its first tracked op to the end of its `backward()`. Inference on the inner
//! backend builds no graph and needs no lock. A trainer alone in its process never waits.

use std::sync::{Mutex, MutexGuard};

static GRAPH: Mutex<()> = Mutex::new(());

/// Waits until no other thread is building or differentiating an autodiff graph, and keeps it
/// that way until the guard is dropped. Not reentrant: take it once, at the outermost level.
pub fn one_graph() -> MutexGuard<'static, ()> {
    // A thread that panicked while holding the guard left no graph state behind that matters.
    GRAPH.lock().unwrap_or_else(|e| e.into_inner())
}
