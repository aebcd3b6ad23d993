//! Phases of a training step, timed and watched.
//!
//! An algorithm reports each phase of its step (`generate`, `reward`, `env`, `forward`,
//! `backward`, `optimizer`; the driver adds `checkpoint`) through [`Phases::enter`]. That
//! gives the run its timings (`time/<phase>_s`, cumulative) and the watchdog its heartbeat: a
//! thread that wakes every second and, when one phase has run longer than
//! `train.stall_timeout_s`, reports the stall — the phase, the step, what it was waiting on —
//! to the driver's handler, which saves the last completed step and passes the stall, as a
//! [`crate::RunError::Stalled`], to the handler the application installed with
//! [`crate::driver::on_stall`] (the `rein` CLI prints it and exits with code 3). A stalled thread cannot be unwound from
//! outside, so this library never ends the process itself: without a handler the error is
//! printed and the stalled thread keeps waiting. Plugin calls end at their own deadlines, so a
//! stall means something else hung: a deadlock, a device, a runaway generation.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// A phase that stopped making progress.
#[derive(Debug, Clone, PartialEq)]
pub struct Stall {
    /// The step it happened in.
    pub step: usize,
    /// The phase (`generate`, `backward`, …).
    pub phase: &'static str,
    /// What the phase was waiting on, as it described itself.
    pub waiting_on: String,
    /// How long it had run.
    pub after: Duration,
}

impl std::fmt::Display for Stall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "step {}: phase `{}` made no progress for {:.0} s (waiting on {}); stopped by the watchdog (`train.stall_timeout_s`)",
            self.step,
            self.phase,
            self.after.as_secs_f64(),
            self.waiting_on
        )
    }
}

/// What the watchdog does with a stall (called once, on its thread).
pub type StallHandler = Box<dyn FnOnce(Stall) + Send>;

/// Where the watchdog writes, at each of its wake-ups, what the run is doing (`status.json`
/// in the run directory, which `rein watch` reads): the stage, step, phase, what the phase
/// waits on and for how long, the process id and the time written.
pub struct StatusFile {
    /// The file.
    pub path: std::path::PathBuf,
    /// The stage the steps belong to (`sft`, `grpo`, …), if the run has several.
    pub stage: Option<&'static str>,
}

impl StatusFile {
    /// Writes `activity` (through a temporary file and a rename: a reader never sees half).
    fn write(&self, activity: &Activity) {
        let seconds = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let status = serde_json::json!({
            "stage": self.stage,
            "step": activity.step,
            "phase": activity.phase,
            "waiting_on": activity.waiting_on,
            "phase_s": activity.since.elapsed().as_secs_f64(),
            "pid": std::process::id(),
            "written_unix_s": seconds,
        });
        let partial = self.path.with_extension("json.partial");
        // The status is a convenience: a failed write must not disturb the run.
        if std::fs::write(&partial, status.to_string()).is_ok() {
            let _ = std::fs::rename(&partial, &self.path);
        }
    }
}

struct Activity {
    step: usize,
    phase: &'static str,
    waiting_on: String,
    since: Instant,
}

struct Shared {
    /// When the run started (earlier, for a resumed run, by the time it had already run).
    started: Instant,
    activity: Mutex<Activity>,
    totals: Mutex<BTreeMap<String, Duration>>,
    done: AtomicBool,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The phases of a run's steps: their cumulative times, and the heartbeat the watchdog reads.
/// Cheap to share by reference with an algorithm.
pub struct Phases {
    shared: Arc<Shared>,
}

/// A phase in progress; ends (and is timed) when dropped.
#[must_use = "a phase lasts as long as its guard"]
pub struct PhaseGuard<'a> {
    phases: &'a Phases,
    phase: &'static str,
    started: Instant,
}

impl Phases {
    /// Phases of a run that has already run for `elapsed`, `totals` of it in each phase (both
    /// zero for a new run).
    pub fn new(elapsed: Duration, totals: BTreeMap<String, Duration>) -> Self {
        let now = Instant::now();
        Self {
            shared: Arc::new(Shared {
                started: now.checked_sub(elapsed).unwrap_or(now),
                activity: Mutex::new(Activity {
                    step: 0,
                    phase: "start",
                    waiting_on: "the run to start".into(),
                    since: Instant::now(),
                }),
                totals: Mutex::new(totals),
                done: AtomicBool::new(false),
            }),
        }
    }

    /// Starts phase `phase` of the current step; `waiting_on` says what it does, for a stall
    /// report (`"sampling 64 completions"`).
    pub fn enter(&self, phase: &'static str, waiting_on: impl Into<String>) -> PhaseGuard<'_> {
        let now = Instant::now();
        let step = {
            let mut activity = lock(&self.shared.activity);
            activity.phase = phase;
            activity.waiting_on = waiting_on.into();
            activity.since = now;
            activity.step
        };
        stall_here_for_tests(phase, step);
        PhaseGuard {
            phases: self,
            phase,
            started: now,
        }
    }

    /// Marks the start of step `step` (its work until the first phase counts as `step`).
    pub(crate) fn begin_step(&self, step: usize) {
        let mut activity = lock(&self.shared.activity);
        activity.step = step;
        activity.phase = "step";
        activity.waiting_on = "the algorithm's step".into();
        activity.since = Instant::now();
    }

    /// Time since the run started (resumed runs included).
    pub fn elapsed(&self) -> Duration {
        self.shared.started.elapsed()
    }

    /// Seconds spent in each phase so far (resumed runs included).
    pub fn totals(&self) -> BTreeMap<String, Duration> {
        lock(&self.shared.totals).clone()
    }

    /// The time spent in `phase` so far.
    pub fn total(&self, phase: &str) -> Duration {
        lock(&self.shared.totals).get(phase).copied().unwrap_or_default()
    }

    /// Starts the watchdog thread: it calls `on_stall` once if a phase runs longer than
    /// `timeout`, writes `status` at each wake-up (at least every second), and ends with these
    /// phases.
    pub(crate) fn watch(&self, timeout: Duration, on_stall: StallHandler, status: Option<StatusFile>) {
        let shared = Arc::downgrade(&self.shared);
        let poll = (timeout / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
        if let Some(status) = &status {
            status.write(&lock(&self.shared.activity));
        }
        let spawned = std::thread::Builder::new().name("rein-watchdog".into()).spawn(move || {
            let mut on_stall = Some(on_stall);
            loop {
                std::thread::sleep(poll);
                let Some(shared) = shared.upgrade() else { return };
                if shared.done.load(Ordering::SeqCst) {
                    return;
                }
                let stall = {
                    let activity = lock(&shared.activity);
                    if let Some(status) = &status {
                        status.write(&activity);
                    }
                    let after = activity.since.elapsed();
                    (after > timeout).then(|| Stall {
                        step: activity.step,
                        phase: activity.phase,
                        waiting_on: activity.waiting_on.clone(),
                        after,
                    })
                };
                if let Some(stall) = stall
                    && let Some(handler) = on_stall.take()
                {
                    handler(stall);
                    return;
                }
            }
        });
        if let Err(e) = spawned {
            eprintln!("warning: no watchdog ({e}); a stalled phase will not be reported");
        }
    }
}

impl Drop for Phases {
    fn drop(&mut self) {
        self.shared.done.store(true, Ordering::SeqCst);
    }
}

impl Drop for PhaseGuard<'_> {
    fn drop(&mut self) {
        let elapsed = self.started.elapsed();
        *lock(&self.phases.shared.totals)
            .entry(self.phase.to_string())
            .or_default() += elapsed;
        let mut activity = lock(&self.phases.shared.activity);
        activity.phase = "step";
        activity.waiting_on = format!("the algorithm's step (after `{}`)", self.phase);
        activity.since = Instant::now();
    }
}

/// Fault injection for testing a watchdog: `REIN_TEST_STALL=<phase>@<step>` makes that phase of
/// that step hang forever, as a deadlocked collective or a stuck plugin would. Read once per
/// process; unset (as in every normal run) it costs one comparison per phase.
fn stall_here_for_tests(phase: &str, step: usize) {
    static STALL: OnceLock<Option<String>> = OnceLock::new();
    let Some(spec) = STALL.get_or_init(|| std::env::var("REIN_TEST_STALL").ok()) else {
        return;
    };
    if *spec == format!("{phase}@{step}") {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_timed_cumulatively() {
        let phases = Phases::new(
            Duration::from_secs(3),
            BTreeMap::from([("backward".to_string(), Duration::from_secs(2))]),
        );
        for _ in 0..2 {
            let _g = phases.enter("backward", "a pass");
            std::thread::sleep(Duration::from_millis(5));
        }
        let total = phases.total("backward");
        assert!(
            total >= Duration::from_millis(2010) && total < Duration::from_secs(10),
            "{total:?}"
        );
        assert_eq!(phases.total("generate"), Duration::ZERO);
        assert!(phases.elapsed() >= Duration::from_secs(3));
    }

    #[test]
    fn a_phase_that_outlasts_the_timeout_is_reported_once() {
        let phases = Phases::new(Duration::ZERO, BTreeMap::new());
        let (send, receive) = std::sync::mpsc::channel();
        let path = std::env::temp_dir().join(format!("rein-status-{}.json", std::process::id()));
        let status = StatusFile {
            path: path.clone(),
            stage: Some("grpo"),
        };
        phases.watch(
            Duration::from_millis(100),
            Box::new(move |stall| send.send(stall).unwrap()),
            Some(status),
        );
        phases.begin_step(7);
        let _g = phases.enter("generate", "sampling 64 completions");
        let stall = receive
            .recv_timeout(Duration::from_secs(30))
            .expect("the watchdog fired");
        assert_eq!((stall.step, stall.phase), (7, "generate"));
        assert_eq!(stall.waiting_on, "sampling 64 completions");
        assert!(stall.after >= Duration::from_millis(100));
        assert!(
            stall
                .to_string()
                .starts_with("step 7: phase `generate` made no progress"),
            "{stall}"
        );
        // What the run was doing, as `rein watch` reads it.
        let status: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            (status["stage"].as_str(), status["step"].as_u64()),
            (Some("grpo"), Some(7))
        );
        assert_eq!(status["phase"], "generate");
        assert_eq!(status["pid"].as_u64(), Some(u64::from(std::process::id())));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn phases_that_make_progress_are_not_reported() {
        let phases = Phases::new(Duration::ZERO, BTreeMap::new());
        let (send, receive) = std::sync::mpsc::channel();
        phases.watch(
            Duration::from_secs(5),
            Box::new(move |stall| send.send(stall).unwrap()),
            None,
        );
        for step in 1..=10 {
            phases.begin_step(step);
            let _g = phases.enter("env", "stepping");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(receive.try_recv().is_err());
    }
}
