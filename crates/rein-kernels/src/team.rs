//! A team of helper threads that share a job with the thread that posts it, handing work over in
//! well under a microsecond while jobs come one after another: the products split across threads
//! here, and rein-model's and rein-sampler's other split work (element-wise and row-wise
//! kernels, attention, decoding shards, sampling) and the two critics of SAC and TD3.
//!
//! Decoding calls products of 20 µs or less hundreds of times per token. Through rayon, each
//! split from outside its pool queues the job, wakes a worker and puts the caller to sleep on a
//! latch until the pool is done: two wake-ups, ~13 µs on a 2-vCPU VM (`examples/team_speed.rs`:
//! 13.4 µs for an empty `rayon::join`, 0.3 µs here). Here the caller posts the job and takes
//! tasks itself, and the helpers, which spin for a while after each job before they sleep, take
//! the rest; a helper still asleep costs nothing, since the caller then runs its tasks too.
//!
//! A split only decides which thread computes which elements, never an element's order, so
//! results are the same whoever runs a task (the contract in [`mod@crate::matmul`]).

use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

/// How long an idle helper spins (first with `pause`, then yielding its core to anything else
/// runnable) before it sleeps: longer than the gaps between a decoding step's products.
const SPIN: Duration = Duration::from_millis(2);
/// The first part of [`SPIN`], pure `pause` spinning; after it each round also yields.
const HOT_SPIN: Duration = Duration::from_micros(100);

/// How many threads work split from this thread runs on: the caller's thread plus the team's
/// helpers (rayon's thread count, so `RAYON_NUM_THREADS` rules both), or 1 from a thread of
/// rayon's pool, from a helper, or from a caller running one of its team's tasks (their work is
/// already split).
pub fn threads() -> usize {
    if rayon::current_thread_index().is_some() || IN_TEAM.get() {
        1
    } else {
        rayon::current_num_threads()
    }
}

/// Runs `task(0)`, …, `task(tasks − 1)`, each once, on this thread and the team's helpers, and
/// returns when all have run. When another thread is using the team, on rayon's threads instead.
/// A task's panic is resumed here after every task has finished.
pub fn run(tasks: usize, task: &(dyn Fn(usize) + Sync)) {
    let team = TEAM.get_or_init(|| Team::start(rayon::current_num_threads().saturating_sub(1)));
    let _caller = match team.caller.try_lock() {
        Ok(guard) => guard,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => {
            use rayon::prelude::*;
            return (0..tasks).into_par_iter().for_each(task);
        }
    };
    IN_TEAM.set(true);
    let ran = catch_unwind(AssertUnwindSafe(|| team.shared.run(tasks, task)));
    IN_TEAM.set(false);
    if let Err(panic) = ran {
        resume_unwind(panic);
    }
}

/// `f(item)` for each of `items`, split as [`run`] splits tasks (all on this thread when
/// [`threads`] is 1).
pub fn for_each<T: Send>(items: Vec<T>, f: impl Fn(T) + Sync) {
    if threads() < 2 || items.len() < 2 {
        return items.into_iter().for_each(f);
    }
    let items: Vec<Mutex<Option<T>>> = items.into_iter().map(|item| Mutex::new(Some(item))).collect();
    run(items.len(), &|i| {
        let item = items[i].lock().unwrap_or_else(|p| p.into_inner()).take();
        f(item.expect("the team runs each task once"));
    });
}

/// `(a(), b())`, as `rayon::join`: `b` on a helper while this thread runs `a` (or both here
/// when the helper is busy or asleep). From a thread of rayon's pool it is `rayon::join`; from a
/// helper, or from inside another join, both run here, one after the other.
pub fn join<A: Send, B: Send>(a: impl FnOnce() -> A + Send, b: impl FnOnce() -> B + Send) -> (A, B) {
    if rayon::current_thread_index().is_some() {
        return rayon::join(a, b);
    }
    if IN_TEAM.get() {
        return (a(), b());
    }
    let (a, b) = (Once::new(a), Once::new(b));
    run(2, &|i| match i {
        0 => a.call(),
        _ => b.call(),
    });
    (a.result(), b.result())
}

/// A function called once, from whichever thread takes its task, and its result.
struct Once<F, R>(Mutex<(Option<F>, Option<R>)>);

impl<F: FnOnce() -> R, R> Once<F, R> {
    fn new(f: F) -> Self {
        Self(Mutex::new((Some(f), None)))
    }

    fn call(&self) {
        let f = self.0.lock().unwrap_or_else(|p| p.into_inner()).0.take();
        let r = f.map(|f| f());
        self.0.lock().unwrap_or_else(|p| p.into_inner()).1 = r;
    }

    fn result(self) -> R {
        let (_, r) = self.0.into_inner().unwrap_or_else(|p| p.into_inner());
        r.expect("the team runs each task once")
    }
}

thread_local! {
    /// Whether this thread is one of the team's helpers, or a caller whose job the team runs.
    static IN_TEAM: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

static TEAM: OnceLock<Team> = OnceLock::new();

struct Team {
    /// Held by the one thread whose job the team runs.
    caller: Mutex<()>,
    shared: &'static Shared,
}

impl Team {
    fn start(helpers: usize) -> Team {
        let shared: &'static Shared = Box::leak(Box::default());
        for i in 0..helpers {
            // A helper that cannot start leaves its tasks to the caller.
            let _ = std::thread::Builder::new()
                .name(format!("rein-kernels-{i}"))
                .spawn(move || shared.help());
        }
        Team {
            caller: Mutex::new(()),
            shared,
        }
    }
}

/// What the caller and the helpers share. A job's fields are written only while `epoch` is odd
/// and no helper is `inside` (the caller sets the one, then waits for the other: a Dekker
/// hand-shake in `SeqCst`), and read only by helpers inside an even epoch.
#[derive(Default)]
struct Shared {
    epoch: AtomicU64,
    inside: AtomicUsize,
    job: UnsafeCell<Job>,
    /// The next task to take, and how many have finished.
    next: AtomicUsize,
    done: AtomicUsize,
    /// Whether a task panicked (later tasks of the job are then skipped), and the first panic.
    failed: AtomicBool,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Helpers asleep, and what wakes them.
    sleepers: AtomicUsize,
    asleep: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written and read under the protocol described on `Shared`.
unsafe impl Sync for Shared {}

#[derive(Default)]
struct Job {
    tasks: usize,
    task: Option<&'static (dyn Fn(usize) + Sync)>,
}

impl Shared {
    fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        let writing = self.epoch.fetch_add(1, SeqCst) + 1;
        debug_assert!(!writing.is_multiple_of(2));
        wait_until(|| self.inside.load(SeqCst) == 0);
        // SAFETY: the epoch is odd and no helper is inside, so none reads the job. The task's
        // lifetime is extended to 'static for the helpers; every call of it has returned before
        // this function does (`done` counts them), and helpers that come later find no task left.
        unsafe {
            *self.job.get() = Job {
                tasks,
                task: Some(std::mem::transmute::<
                    &(dyn Fn(usize) + Sync),
                    &'static (dyn Fn(usize) + Sync),
                >(task)),
            };
        }
        self.next.store(0, SeqCst);
        self.done.store(0, SeqCst);
        self.failed.store(false, SeqCst);
        self.epoch.fetch_add(1, SeqCst);
        if self.sleepers.load(SeqCst) > 0 {
            let _asleep = self.asleep.lock().unwrap_or_else(|p| p.into_inner());
            self.wake.notify_all();
        }
        // SAFETY: this thread wrote the job above and nobody writes it before this returns.
        self.take_tasks(unsafe { &*self.job.get() });
        wait_until(|| self.done.load(SeqCst) >= tasks);
        if let Some(panic) = self.panic.lock().unwrap_or_else(|p| p.into_inner()).take() {
            resume_unwind(panic);
        }
    }

    /// Takes and runs the job's tasks until none is left.
    fn take_tasks(&self, job: &Job) {
        let Some(task) = job.task else { return };
        loop {
            let i = self.next.fetch_add(1, SeqCst);
            if i >= job.tasks {
                return;
            }
            if !self.failed.load(SeqCst)
                && let Err(panic) = catch_unwind(AssertUnwindSafe(|| task(i)))
            {
                self.failed.store(true, SeqCst);
                self.panic
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(panic);
            }
            self.done.fetch_add(1, SeqCst);
        }
    }

    /// A helper's life: wait for a new even epoch, take its tasks, repeat.
    fn help(&self) -> ! {
        IN_TEAM.set(true);
        let mut seen = self.epoch.load(SeqCst);
        loop {
            let epoch = self.wait_past(seen);
            self.inside.fetch_add(1, SeqCst);
            if self.epoch.load(SeqCst) == epoch {
                // SAFETY: inside an even epoch, which the caller does not leave while we are.
                self.take_tasks(unsafe { &*self.job.get() });
                seen = epoch;
            }
            self.inside.fetch_sub(1, SeqCst);
        }
    }

    /// The first even epoch other than `seen`: spinning, then yielding, then asleep.
    fn wait_past(&self, seen: u64) -> u64 {
        let posted = |epoch: u64| epoch != seen && epoch.is_multiple_of(2);
        loop {
            let start = Instant::now();
            while start.elapsed() < SPIN {
                for _ in 0..64 {
                    let epoch = self.epoch.load(SeqCst);
                    if posted(epoch) {
                        return epoch;
                    }
                    std::hint::spin_loop();
                }
                if start.elapsed() >= HOT_SPIN {
                    std::thread::yield_now();
                }
            }
            let asleep = self.asleep.lock().unwrap_or_else(|p| p.into_inner());
            self.sleepers.fetch_add(1, SeqCst);
            if !posted(self.epoch.load(SeqCst)) {
                drop(self.wake.wait(asleep).unwrap_or_else(|p| p.into_inner()));
            }
            self.sleepers.fetch_sub(1, SeqCst);
        }
    }
}

/// Returns once `ready()`: spinning at first, then yielding the core (the thread it waits for may
/// need it).
fn wait_until(ready: impl Fn() -> bool) {
    let start = Instant::now();
    while !ready() {
        match start.elapsed() < HOT_SPIN {
            true => std::hint::spin_loop(),
            false => std::thread::yield_now(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_exactly_once() {
        for tasks in [0, 1, 2, 3, 7, 64] {
            for _ in 0..200 {
                let runs: Vec<AtomicU32> = (0..tasks).map(|_| AtomicU32::new(0)).collect();
                run(tasks, &|i| {
                    runs[i].fetch_add(1, SeqCst);
                });
                assert!(runs.iter().all(|r| r.load(SeqCst) == 1), "{tasks} tasks");
            }
        }
    }

    #[test]
    fn tasks_run_after_the_helpers_fell_asleep() {
        let sum = AtomicUsize::new(0);
        std::thread::sleep(SPIN * 3);
        run(4, &|i| {
            sum.fetch_add(i + 1, SeqCst);
        });
        assert_eq!(sum.load(SeqCst), 10);
    }

    #[test]
    fn callers_on_several_threads_each_get_all_their_tasks() {
        std::thread::scope(|s| {
            for t in 0..4 {
                s.spawn(move || {
                    for _ in 0..300 {
                        let sum = AtomicUsize::new(0);
                        run(5, &|i| {
                            sum.fetch_add(i * 10 + t, SeqCst);
                        });
                        assert_eq!(sum.load(SeqCst), 100 + 5 * t);
                    }
                });
            }
        });
    }

    #[test]
    fn for_each_hands_each_item_to_one_task() {
        let mut rows = vec![0u32; 64];
        for_each(rows.chunks_mut(8).enumerate().collect(), |(i, chunk)| {
            chunk.iter_mut().for_each(|x| *x += i as u32 + 1);
        });
        let expected: Vec<u32> = (0..64).map(|j| j / 8 + 1).collect();
        assert_eq!(rows, expected);
    }

    #[test]
    fn join_returns_both_results_from_any_thread() {
        let work = |x: u64| (0..1000).fold(x, |h, i| h.wrapping_mul(31).wrapping_add(i));
        assert_eq!(join(|| work(1), || work(2)), (work(1), work(2)));
        assert_eq!(rayon::join(|| join(|| 1, || 2), || 3), ((1, 2), 3));
        assert_eq!(join(|| join(|| 'a', || 'b'), || join(|| 4, || 5)), (('a', 'b'), (4, 5)));
    }

    #[test]
    fn a_panicking_task_panics_the_caller_and_leaves_the_team_working() {
        let caught = catch_unwind(AssertUnwindSafe(|| {
            run(3, &|i| {
                if i == 0 {
                    panic!("task 0 fails");
                }
            })
        }));
        let message = caught.expect_err("the panic reaches the caller");
        assert_eq!(message.downcast_ref::<&str>(), Some(&"task 0 fails"));
        // The team still works afterwards.
        let sum = AtomicUsize::new(0);
        run(2, &|i| {
            sum.fetch_add(i + 1, SeqCst);
        });
        assert_eq!(sum.load(SeqCst), 3);
    }

    #[test]
    fn helpers_and_rayon_threads_do_not_split_again() {
        assert_eq!(rayon::join(threads, || 0).0, 1);
        let nested = AtomicUsize::new(usize::MAX);
        run(2, &|_| {
            nested.fetch_min(threads(), SeqCst);
        });
        assert_eq!(nested.load(SeqCst), 1);
        assert!(!IN_TEAM.get());
    }
}
