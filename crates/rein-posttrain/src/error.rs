//! Why a language-model run stops early.

use std::path::PathBuf;

use rein_core::PluginError;
use rein_run::RunError;

/// Why language-model training stopped early.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LmError {
    /// The run's machinery stopped it (a non-finite value, a checkpoint, a stop request, a
    /// stalled phase).
    #[error(transparent)]
    Run(#[from] RunError),
    /// A plugin failed.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The recipe cannot be trained as written.
    #[error(transparent)]
    Recipe(#[from] rein_recipe::RecipeError),
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
    Data(#[from] crate::DataError),
    /// A multi-turn transcript could not be rendered or extended.
    #[error(transparent)]
    Transcript(#[from] crate::rollout::transcript::TranscriptError),
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
        saved: Option<PathBuf>,
    },
}

impl LmError {
    /// The generator failed at step `step`.
    pub(crate) fn generator(step: usize, error: rein_sampler::GeneratorError) -> Self {
        Self::Generator {
            step,
            error,
            saved: None,
        }
    }
}

impl rein_run::StepError for LmError {
    fn resumable(&mut self) -> Option<&mut Option<PathBuf>> {
        match self {
            Self::Generator { saved, .. } => Some(saved),
            _ => None,
        }
    }
}

impl From<std::io::Error> for LmError {
    fn from(error: std::io::Error) -> Self {
        Self::Run(error.into())
    }
}

impl From<rein_run::checkpoint::CheckpointError> for LmError {
    fn from(error: rein_run::checkpoint::CheckpointError) -> Self {
        Self::Run(error.into())
    }
}
