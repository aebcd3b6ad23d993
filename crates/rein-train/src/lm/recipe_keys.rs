//! What a language-model recipe names, resolved: the models it names by path or by a fetched
//! model's name, and errors that name the recipe key at fault.

use std::path::{Path, PathBuf};

use rein_recipe::{LoadedRecipe, RecipeError};

use crate::TrainError;

/// An error about the recipe's key `path`.
pub(super) fn invalid(loaded: &LoadedRecipe, path: &str, message: impl Into<String>) -> TrainError {
    TrainError::Recipe(RecipeError::Invalid {
        file: loaded.path.clone(),
        path: path.into(),
        message: message.into(),
    })
}

/// A model named in the recipe: a path relative to the recipe, unless it is the name of a
/// fetched model (`smollm2-135m`).
pub(super) fn model_path(loaded: &LoadedRecipe, path: &str) -> PathBuf {
    let resolved = loaded.resolve(path);
    match resolved.exists() || Path::new(path).components().count() > 1 {
        true => resolved,
        false => PathBuf::from(path),
    }
}
