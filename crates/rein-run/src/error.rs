//! Why a run stops early, as far as the run's machinery knows: the algorithms' own failures
//! are their error types, which convert from this one ([`crate::driver::Trainer::Error`]).

use std::path::PathBuf;

/// Why a run stopped early, in the machinery every algorithm shares.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// A file in the run directory could not be written.
    #[error("run directory: {0}")]
    Io(#[from] std::io::Error),
    /// A loss, gradient or parameter became NaN or infinite. No checkpoint is written after
    /// it, so the last one on disk is good.
    #[error("step {step}: {what} is not finite ({value}); stopping (checkpoints from before this step are kept)")]
    NonFinite {
        /// The step (1-based; for PPO, the update).
        step: usize,
        /// Which quantity or tensor (`policy loss`, `gradient of layers.0.mlp.up.weight`).
        what: String,
        /// Its value (for a tensor, the value that gave it away: a loss or a norm).
        value: f32,
    },
    /// A checkpoint cannot be written or used.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// A run cannot be resumed as asked.
    #[error("cannot resume {run}: {message}")]
    Resume {
        /// The run directory.
        run: PathBuf,
        /// Why.
        message: String,
    },
    /// A stop was requested (Ctrl-C); the state was saved.
    #[error("interrupted after step {step}; saved {checkpoint}; continue with `--resume {run}`")]
    Interrupted {
        /// The last completed step (or update).
        step: usize,
        /// The checkpoint written.
        checkpoint: PathBuf,
        /// The run directory.
        run: PathBuf,
    },
    /// The watchdog stopped the run: a phase made no progress for `train.stall_timeout_s`.
    /// The last completed step was saved first (when the run has a checkpoint directory).
    #[error("{stall}{saved}{}", run.as_ref().map(|r| format!("; continue with `--resume {}`", r.display())).unwrap_or_default())]
    Stalled {
        /// The phase, its step, and what it waited on.
        stall: crate::watchdog::Stall,
        /// What became of the last completed step ("; saved step 4 in …"), or "".
        saved: String,
        /// The run directory to resume.
        run: Option<PathBuf>,
    },
}

impl RunError {
    /// Stops at step `step` when the loss `what` is NaN or infinite.
    pub fn check_loss(step: usize, what: &str, value: f32) -> Result<(), Self> {
        if value.is_finite() {
            return Ok(());
        }
        Err(Self::NonFinite {
            step,
            what: what.into(),
            value,
        })
    }

    /// Stops at step `step` when the gradient norm `norm` is NaN or infinite, naming the
    /// parameter `first_non_finite` finds (the first whose gradient is not finite).
    pub fn check_gradients(
        step: usize,
        norm: f32,
        first_non_finite: impl FnOnce() -> Option<String>,
    ) -> Result<(), Self> {
        if norm.is_finite() {
            return Ok(());
        }
        Err(Self::non_finite_gradient(step, norm, first_non_finite()))
    }

    /// The error of a non-finite gradient norm `norm` at step `step`, naming the first parameter
    /// whose gradient is not finite (`which`) when known.
    pub fn non_finite_gradient(step: usize, norm: f32, which: Option<String>) -> Self {
        let which = which.unwrap_or_else(|| "the parameters".into());
        Self::NonFinite {
            step,
            what: format!("gradient norm (first non-finite: the gradient of `{which}`)"),
            value: norm,
        }
    }
}

/// An algorithm's error, as the driver handles it: anything the machinery raises converts into
/// it, and an error that leaves the run resumable has the last completed step saved first.
pub trait StepError: From<RunError> + std::error::Error + Send + Sync + 'static {
    /// When this error ends the run but leaves it resumable (its inference servers stopped
    /// answering), the slot the driver fills with the checkpoint it saves of the last completed
    /// step; `None` for every other error.
    fn resumable(&mut self) -> Option<&mut Option<PathBuf>> {
        None
    }
}
