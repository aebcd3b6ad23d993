//! Why a run on environments stops early.

use rein_core::PluginError;
use rein_run::RunError;

/// Why training on environments stopped early.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// The run's machinery stopped it (a non-finite value, a checkpoint, a stop request).
    #[error(transparent)]
    Run(#[from] RunError),
    /// An environment plugin failed.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The recipe cannot be trained as written.
    #[error(transparent)]
    Recipe(#[from] rein_recipe::RecipeError),
    /// The environment's spaces cannot be trained with this algorithm.
    #[error("environment `{plugin}`: {message}")]
    Environment {
        /// The plugin.
        plugin: String,
        /// What is unsupported.
        message: String,
    },
    /// The run cannot be done as asked (a replay buffer larger than the memory).
    #[error("{0}")]
    Unsupported(String),
}

impl rein_run::StepError for ControlError {}

impl From<std::io::Error> for ControlError {
    fn from(error: std::io::Error) -> Self {
        Self::Run(error.into())
    }
}

impl From<rein_run::checkpoint::CheckpointError> for ControlError {
    fn from(error: rein_run::checkpoint::CheckpointError) -> Self {
        Self::Run(error.into())
    }
}
