//! Why a training run stops early.

use rein_core::PluginError;

/// Why training stopped early.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrainError {
    /// The environment plugin failed.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The recipe cannot be trained as written.
    #[error(transparent)]
    Recipe(#[from] crate::recipe::RecipeError),
    /// A file in the run directory could not be written.
    #[error("run directory: {0}")]
    Io(#[from] std::io::Error),
    /// A loss or gradient became NaN or infinite.
    #[error("update {update}: {what} is not finite ({value}); stopping")]
    NonFinite {
        /// The update number (1-based).
        update: usize,
        /// Which quantity.
        what: &'static str,
        /// Its value.
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
    /// The environment's spaces cannot be trained with this algorithm.
    #[error("environment `{plugin}`: {message}")]
    Unsupported {
        /// The plugin.
        plugin: String,
        /// What is unsupported.
        message: String,
    },
}
