//! Why a run stops early, whichever trainer ran it.

use rein_control::ControlError;
use rein_core::PluginError;
use rein_posttrain::LmError;
use rein_recipe::RecipeError;
use rein_run::RunError;

/// Why a run stopped early. The machinery's errors, the recipe's and the plugins' are the same
/// variants whichever trainer raised them; the rest are the trainers' own.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrainError {
    /// The recipe cannot be trained as written.
    #[error(transparent)]
    Recipe(#[from] RecipeError),
    /// A plugin failed or cannot be loaded.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The run's machinery stopped it: a non-finite value, a checkpoint, a stop request, a
    /// run that cannot be resumed.
    #[error(transparent)]
    Run(#[from] RunError),
    /// Training on environments failed.
    #[error(transparent)]
    Control(Box<ControlError>),
    /// Language-model training failed.
    #[error(transparent)]
    Lm(Box<LmError>),
    /// The recipe asks a command for what it does not do (`run_env` on a language-model recipe).
    #[error("{0}")]
    Unsupported(String),
}

impl From<ControlError> for TrainError {
    fn from(error: ControlError) -> Self {
        match error {
            ControlError::Run(e) => Self::Run(e),
            ControlError::Plugin(e) => Self::Plugin(e),
            ControlError::Recipe(e) => Self::Recipe(e),
            other => Self::Control(Box::new(other)),
        }
    }
}

impl From<LmError> for TrainError {
    fn from(error: LmError) -> Self {
        match error {
            LmError::Run(e) => Self::Run(e),
            LmError::Plugin(e) => Self::Plugin(e),
            LmError::Recipe(e) => Self::Recipe(e),
            other => Self::Lm(Box::new(other)),
        }
    }
}

impl From<std::io::Error> for TrainError {
    fn from(error: std::io::Error) -> Self {
        Self::Run(error.into())
    }
}

impl From<rein_run::checkpoint::CheckpointError> for TrainError {
    fn from(error: rein_run::checkpoint::CheckpointError) -> Self {
        Self::Run(error.into())
    }
}
