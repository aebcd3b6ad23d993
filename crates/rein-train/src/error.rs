//! Why a training run stops early.

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use rein_core::PluginError;

/// Why training stopped early.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrainError {
    /// A plugin failed.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The recipe cannot be trained as written.
    #[error(transparent)]
    Recipe(#[from] rein_recipe::RecipeError),
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
    /// A reward plugin failed and the recipe's `on_error` is `fail`.
    #[error("step {step}: reward failed on prompt {prompt:?}: {error}")]
    Reward {
        /// The training step.
        step: usize,
        /// The prompt of the failing group.
        prompt: String,
        /// The plugin's error (it names the plugin).
        error: Box<PluginError>,
    },
    /// The model or tokenizer cannot be loaded or saved.
    #[error(transparent)]
    Model(#[from] rein_model::lm::LoadError),
    /// A dataset cannot be read.
    #[error(transparent)]
    Data(#[from] crate::lm::DataError),
    /// A multi-turn transcript could not be rendered or extended.
    #[error(transparent)]
    Transcript(#[from] crate::lm::transcript::TranscriptError),
    /// A checkpoint cannot be written or used.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// A run cannot be resumed as asked.
    #[error("cannot resume {run}: {message}")]
    Resume {
        /// The run directory.
        run: std::path::PathBuf,
        /// Why.
        message: String,
    },
    /// A stop was requested (Ctrl-C); the state was saved.
    #[error("interrupted after step {step}; saved {checkpoint}; continue with `--resume {run}`")]
    Interrupted {
        /// The last completed step (or update).
        step: usize,
        /// The checkpoint written.
        checkpoint: std::path::PathBuf,
        /// The run directory.
        run: std::path::PathBuf,
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
        run: Option<std::path::PathBuf>,
    },
    /// The environment's spaces cannot be trained with this algorithm.
    #[error("environment `{plugin}`: {message}")]
    Environment {
        /// The plugin.
        plugin: String,
        /// What is unsupported.
        message: String,
    },
    /// The run cannot be done as asked (data without targets for SFT, a group too small for
    /// RLOO, …).
    #[error("{0}")]
    Unsupported(String),
    /// The generator gave no completions (every inference server stopped answering, or one
    /// answered something unusable); the last completed step is saved when it was not yet.
    #[error("step {step}: {error}{}", saved.as_ref().map(|p| format!("; saved the last completed step in {}", p.display())).unwrap_or_default())]
    Generator {
        /// The step that needed completions.
        step: usize,
        /// What went wrong (it names the servers).
        error: rein_sampler::GeneratorError,
        /// The checkpoint written on the way out.
        saved: Option<std::path::PathBuf>,
    },
}

impl TrainError {
    /// The generator failed at step `step`.
    pub(crate) fn generator(step: usize, error: rein_sampler::GeneratorError) -> Self {
        Self::Generator {
            step,
            error,
            saved: None,
        }
    }

    /// Stops at step `step` when the loss `what` is NaN or infinite.
    pub(crate) fn check_loss(step: usize, what: &str, value: f32) -> Result<(), Self> {
        if value.is_finite() {
            return Ok(());
        }
        Err(Self::NonFinite {
            step,
            what: what.into(),
            value,
        })
    }

    /// Stops at step `step` when the gradient norm is NaN or infinite, naming the first
    /// parameter whose gradient is.
    pub(crate) fn check_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(
        step: usize,
        norm: f32,
        model: &M,
        grads: &GradientsParams,
    ) -> Result<(), Self> {
        if norm.is_finite() {
            return Ok(());
        }
        Err(Self::non_finite_gradient(
            step,
            norm,
            rein_optim::non_finite_gradient(model, grads),
        ))
    }

    /// The error of a non-finite gradient norm `norm` at step `step`, naming the first parameter
    /// whose gradient is not finite (`which`) when known.
    pub(crate) fn non_finite_gradient(step: usize, norm: f32, which: Option<String>) -> Self {
        let which = which.unwrap_or_else(|| "the parameters".into());
        Self::NonFinite {
            step,
            what: format!("gradient norm (first non-finite: the gradient of `{which}`)"),
            value: norm,
        }
    }
}
