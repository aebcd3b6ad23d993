//! The one loop every algorithm runs in.
//!
//! An algorithm ([`Trainer`]) knows how to do one update and what its state is. The driver
//! owns everything around the update, the same for PPO, SFT and GRPO:
//!
//! - resuming: the algorithm restores its state from the checkpoint, the driver its own
//!   (step, elapsed time, time per phase, plugin failures so far);
//! - after each step: a check that every parameter is finite (with or without a run
//!   directory), the metrics record with the driver's keys (`time/…`, `plugins/<name>/…`)
//!   appended to `metrics.jsonl`, the progress line;
//! - checkpoints every `train.checkpoint_every` steps, after the last step, and when Ctrl-C or
//!   SIGTERM asks to stop ([`crate::checkpoint::request_stop`]), written atomically;
//! - stopping when the algorithm says it is done (a target reached);
//! - the watchdog ([`crate::watchdog`]): a phase stalled for `train.stall_timeout_s` ends the
//!   run with an error naming it, after saving the last completed step.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rein_core::FailureCounts;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::checkpoint::{Checkpoint, CheckpointDir, Checkpointing, stop_requested};
use crate::progress::Progress;
use crate::run_dir::MetricsWriter;
use crate::watchdog::{Phases, Stall};
use crate::{RunError, StepError};

/// What the application does with a stalled run (set once, by [`on_stall`]).
static STALL_HANDLER: OnceLock<fn(RunError)> = OnceLock::new();

/// Installs what happens after the watchdog stopped a run and saved its last step: `handler`
/// gets the [`RunError::Stalled`] on the watchdog's thread, while the stalled thread is
/// still stuck, so it typically reports the error and ends the process. The first call wins.
pub fn on_stall(handler: fn(RunError)) {
    let _ = STALL_HANDLER.set(handler);
}

/// Hands a stall to the application's handler, or prints it when there is none.
pub(crate) fn report_stall(error: RunError) {
    match STALL_HANDLER.get() {
        Some(handler) => handler(error),
        None => eprintln!("\nerror: {error}"),
    }
}

/// One metrics record: `metrics.jsonl` gets one per step.
pub type Record = serde_json::Map<String, serde_json::Value>;

/// A named part of a checkpoint.
pub type Section = (String, Vec<u8>);

/// The state after a step, captured cheaply (tensors are shared, not copied) and serialised
/// later, possibly on another thread (the watchdog's).
pub type Snapshot = Box<dyn FnOnce() -> Vec<Section> + Send>;

/// What one step produced.
#[derive(Debug, Default)]
pub struct Step {
    /// Its metrics (the driver adds timings and plugin failure counts).
    pub record: Record,
    /// The algorithm is done (a target was reached): no further steps.
    pub done: bool,
    /// The progress line after it (`grpo step 3/20 | reward 0.41 | 4.20 s/step`).
    pub progress: String,
}

/// A training algorithm as the driver runs it (a [`Trainer`]): one update at a time, its state a checkpoint.
pub trait Trainer {
    /// Why a step fails: the algorithm's own error, which the machinery's errors convert into.
    type Error: StepError;

    /// The number of the last step (steps count from 1).
    fn total_steps(&self) -> usize;

    /// Does step `step`: one update. Reports its phases to `phases` (timings and the watchdog)
    /// and stops with an error when its loss or gradient norm is not finite.
    fn step(&mut self, step: usize, phases: &Phases) -> Result<Step, Self::Error>;

    /// The state after the last step, for a checkpoint.
    fn snapshot(&self) -> Snapshot;

    /// Continues from a checkpoint taken after step `checkpoint.step`.
    fn restore(&mut self, checkpoint: &Checkpoint) -> Result<(), Self::Error>;

    /// The path of the first parameter that is NaN or infinite, if any.
    fn non_finite_parameter(&self) -> Option<String>;

    /// Failed plugin calls so far, per plugin (zero counts included), since this algorithm
    /// started (the driver adds the counts of a resumed run's earlier part).
    fn plugin_failures(&self) -> Vec<(String, FailureCounts)> {
        Vec::new()
    }
}

/// How the driver runs an algorithm.
pub struct Driver<'a> {
    /// Where records go (a run's `metrics.jsonl`), if anywhere.
    pub metrics: Option<&'a mut MetricsWriter>,
    /// Where checkpoints go, how often, and the one to continue from.
    pub checkpointing: &'a Checkpointing,
    /// How long one phase may run before the watchdog stops the run.
    pub stall_timeout: Duration,
    /// `stage` of every record (`sft`, `grpo`), when a run has several.
    pub stage: Option<&'static str>,
}

/// What the driver reports when the algorithm is done.
#[derive(Debug, Clone, Default)]
pub struct Driven {
    /// The last step done.
    pub steps: usize,
    /// Wall-clock time of the whole stage, resumed parts included.
    pub elapsed: Duration,
    /// Time in each phase.
    pub phases: BTreeMap<String, Duration>,
    /// The largest of the steps' peak resident memory (`sys/peak_rss_mib`), in MiB.
    pub peak_rss_mib: Option<f64>,
}

/// The driver's own section of a checkpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct DriverState {
    /// The step the checkpoint was taken after (within this stage).
    step: usize,
    /// Bytes of `metrics.jsonl` written by then.
    metrics_len: u64,
    elapsed_s: f64,
    phases_s: BTreeMap<String, f64>,
    /// `[timeouts, traps, errors]` per plugin.
    failures: BTreeMap<String, [u64; 3]>,
}

/// The section name of [`DriverState`].
pub(crate) const DRIVER_SECTION: &str = "driver";

/// How much of `metrics.jsonl` a checkpoint's run had written.
pub fn metrics_len(checkpoint: &Checkpoint) -> Result<u64, RunError> {
    Ok(checkpoint.section_json::<DriverState>(DRIVER_SECTION)?.metrics_len)
}

impl Driver<'_> {
    /// Runs `algorithm` from its first step (or the checkpoint's) to its last or until it is
    /// done.
    pub fn run<A: Trainer>(mut self, algorithm: &mut A) -> Result<Driven, A::Error> {
        let mut state = DriverState::default();
        if let Some(checkpoint) = &self.checkpointing.resume {
            state = checkpoint.section_json(DRIVER_SECTION).map_err(RunError::from)?;
            algorithm.restore(checkpoint)?;
        }
        let phases = Phases::new(
            Duration::from_secs_f64(state.elapsed_s),
            state
                .phases_s
                .iter()
                .map(|(name, s)| (name.clone(), Duration::from_secs_f64(*s)))
                .collect(),
        );
        let failures_before = state.failures.clone();
        // The last completed step's state, for the watchdog to save.
        let latest: Arc<Mutex<Option<(usize, Snapshot)>>> = Arc::new(Mutex::new(None));
        let status = (self.metrics.as_deref()).map(|m| crate::watchdog::StatusFile {
            path: m.dir().join("status.json"),
            stage: self.stage,
        });
        phases.watch(self.stall_timeout, self.stall_handler(latest.clone()), status);
        let total = algorithm.total_steps();
        let mut progress = Progress::new(Some(total as u64));
        let mut last = state.step;
        let mut peak_rss_mib: Option<f64> = None;
        for step in state.step + 1..=total {
            phases.begin_step(step);
            let started = phases.elapsed();
            crate::memory::reset_peak_rss();
            let Step {
                mut record,
                done,
                progress: line,
            } = algorithm
                .step(step, &phases)
                .map_err(|e| self.save_unsaved(e, &latest))?;
            if let Some(mib) = crate::memory::peak_rss_mib() {
                record.insert("sys/peak_rss_mib".into(), json!(mib));
                peak_rss_mib = Some(peak_rss_mib.map_or(mib, |peak| peak.max(mib)));
            }
            if let Some(path) = algorithm.non_finite_parameter() {
                return Err(RunError::NonFinite {
                    step,
                    what: format!("parameter `{path}`"),
                    value: f32::NAN,
                }
                .into());
            }
            last = step;
            let failures = add_failures(&failures_before, algorithm.plugin_failures());
            record.insert("time/step_s".into(), json!((phases.elapsed() - started).as_secs_f64()));
            self.complete(&mut record, &phases, &failures);
            if let Some(metrics) = self.metrics.as_deref_mut() {
                metrics
                    .write(&serde_json::Value::Object(record.clone()))
                    .map_err(RunError::from)?;
            }
            let finished = done || step == total;
            progress.show(step as u64, &line, finished);

            if self.checkpointing.dir.is_some() {
                let state = DriverState {
                    step,
                    metrics_len: self.metrics.as_deref().map_or(0, MetricsWriter::bytes_written),
                    elapsed_s: phases.elapsed().as_secs_f64(),
                    phases_s: seconds(&phases.totals()),
                    failures: failures.iter().map(|(name, f)| (name.clone(), counts(*f))).collect(),
                };
                let snapshot = self.with_driver_state(algorithm.snapshot(), &state);
                self.checkpoint(step, finished, snapshot, &phases, &latest)?;
            }
            if finished {
                break;
            }
        }
        progress.finish();
        Ok(Driven {
            steps: last,
            elapsed: phases.elapsed(),
            phases: phases.totals(),
            peak_rss_mib,
        })
    }

    /// After step `step`: writes a checkpoint when one is due (every `train.checkpoint_every`
    /// steps, after the last, or when a stop was requested, which then ends the run);
    /// otherwise keeps the snapshot for the watchdog or a failing generator to save.
    fn checkpoint(
        &self,
        step: usize,
        finished: bool,
        snapshot: Snapshot,
        phases: &Phases,
        latest: &Mutex<Option<(usize, Snapshot)>>,
    ) -> Result<(), RunError> {
        let Some(dir) = &self.checkpointing.dir else {
            return Ok(());
        };
        let stop = stop_requested();
        let every = self.checkpointing.every;
        if !(stop || finished || (every > 0 && step.is_multiple_of(every))) {
            *latest.lock().unwrap_or_else(|e| e.into_inner()) = Some((step, snapshot));
            return Ok(());
        }
        let _phase = phases.enter("checkpoint", format!("writing the checkpoint of step {step}"));
        let path = self.save(dir, step, snapshot)?;
        if stop {
            return Err(RunError::Interrupted {
                step,
                checkpoint: path,
                run: dir.run().to_path_buf(),
            });
        }
        Ok(())
    }

    /// A step's error; when it leaves the run resumable (the servers are gone), the last
    /// completed step is saved first (when it was not saved already).
    fn save_unsaved<E: StepError>(&self, mut error: E, latest: &Mutex<Option<(usize, Snapshot)>>) -> E {
        if let Some(slot @ None) = error.resumable() {
            let unsaved = latest.lock().unwrap_or_else(|e| e.into_inner()).take();
            *slot = match (&self.checkpointing.dir, unsaved) {
                (Some(dir), Some((done, snapshot))) => self.save(dir, done, snapshot).ok(),
                _ => None,
            };
        }
        error
    }

    /// Adds the driver's keys to a step's record: stage, timings, plugin failures.
    fn complete(&self, record: &mut Record, phases: &Phases, failures: &BTreeMap<String, FailureCounts>) {
        if let Some(stage) = self.stage {
            record.insert("stage".into(), json!(stage));
        }
        for (phase, time) in phases.totals() {
            record.insert(format!("time/{phase}_s"), json!(time.as_secs_f64()));
        }
        record.insert("time/elapsed_s".into(), json!(phases.elapsed().as_secs_f64()));
        for (plugin, f) in failures {
            record.insert(format!("plugins/{plugin}/timeouts"), json!(f.timeouts));
            record.insert(format!("plugins/{plugin}/traps"), json!(f.traps));
            record.insert(format!("plugins/{plugin}/errors"), json!(f.errors));
        }
    }

    /// The algorithm's snapshot plus the driver's state and the run's context sections.
    fn with_driver_state(&self, snapshot: Snapshot, state: &DriverState) -> Snapshot {
        let driver = serde_json::to_vec(state).expect("the driver state serialises");
        let context = self.checkpointing.context.clone();
        Box::new(move || {
            let mut sections = snapshot();
            sections.push((DRIVER_SECTION.to_string(), driver));
            sections.extend(context);
            sections
        })
    }

    fn save(&self, dir: &CheckpointDir, step: usize, snapshot: Snapshot) -> Result<std::path::PathBuf, RunError> {
        Ok(write_snapshot(dir, self.checkpointing.step_offset + step, snapshot)?)
    }

    /// What the watchdog does: save the last completed step (when it was not saved already)
    /// and hand the stall, as a [`RunError::Stalled`], to the application's handler
    /// ([`on_stall`]).
    fn stall_handler(&self, latest: Arc<Mutex<Option<(usize, Snapshot)>>>) -> Box<dyn FnOnce(Stall) + Send> {
        let dir = self.checkpointing.dir.clone();
        let offset = self.checkpointing.step_offset;
        Box::new(move |stall| {
            let saved = latest.lock().unwrap_or_else(|e| e.into_inner()).take();
            let saved = match (&dir, saved) {
                (Some(dir), Some((step, snapshot))) => match write_snapshot(dir, offset + step, snapshot) {
                    Ok(path) => format!("; saved step {step} in {}", path.display()),
                    Err(e) => format!("; could not save step {step}: {e}"),
                },
                (Some(_), None) => "; the newest checkpoint is the last completed step".into(),
                (None, _) => String::new(),
            };
            let run = dir.as_ref().map(|dir| dir.run().to_path_buf());
            report_stall(RunError::Stalled { stall, saved, run });
        })
    }
}

/// Serialises `snapshot` and writes it as the checkpoint of step `step` (counted over the
/// whole run, earlier stages included).
fn write_snapshot(
    dir: &CheckpointDir,
    step: usize,
    snapshot: Snapshot,
) -> Result<std::path::PathBuf, crate::checkpoint::CheckpointError> {
    let sections = snapshot();
    let borrowed: Vec<(&str, &[u8])> = sections.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect();
    dir.save(step as u64, &borrowed)
}

fn add_failures(
    before: &BTreeMap<String, [u64; 3]>,
    now: Vec<(String, FailureCounts)>,
) -> BTreeMap<String, FailureCounts> {
    let mut out: BTreeMap<String, FailureCounts> = before
        .iter()
        .map(|(name, [timeouts, traps, errors])| {
            let counts = FailureCounts {
                timeouts: *timeouts,
                traps: *traps,
                errors: *errors,
            };
            (name.clone(), counts)
        })
        .collect();
    for (name, f) in now {
        let entry = out.entry(name).or_default();
        *entry = entry.plus(f);
    }
    out
}

fn counts(f: FailureCounts) -> [u64; 3] {
    [f.timeouts, f.traps, f.errors]
}

fn seconds(totals: &BTreeMap<String, Duration>) -> BTreeMap<String, f64> {
    totals.iter().map(|(name, t)| (name.clone(), t.as_secs_f64())).collect()
}
