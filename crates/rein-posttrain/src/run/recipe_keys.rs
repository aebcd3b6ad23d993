//! What a language-model recipe names, resolved: the models it names by path or by a fetched
//! model's name, and errors that name the recipe key at fault.

use std::path::{Path, PathBuf};

use rein_core::SamplerPrecision;
use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, LmTokenizer};
use rein_recipe::{LoadedRecipe, RecipeError};

use crate::LmError;

/// An error about the recipe's key `path`.
pub(crate) fn invalid(loaded: &LoadedRecipe, path: &str, message: impl Into<String>) -> LmError {
    LmError::Recipe(RecipeError::Invalid {
        file: loaded.path.clone(),
        path: path.into(),
        message: message.into(),
    })
}

/// A model named in the recipe: a path relative to the recipe, unless it is the name of a
/// fetched model (`smollm2-135m`). A `*` in one of the path's folders picks the newest run:
/// `../runs/rm-arithmetic-*/final` is the `final/` of the last `rm-arithmetic` run directory
/// (by name, which starts with its UTC time) that has one.
pub(crate) fn model_path(loaded: &LoadedRecipe, path: &str) -> PathBuf {
    let resolved = loaded.resolve(path);
    if path.contains('*') {
        return newest_match(&resolved).unwrap_or(resolved);
    }
    match resolved.exists() || Path::new(path).components().count() > 1 {
        true => resolved,
        false => PathBuf::from(path),
    }
}

/// The last path, by name, that `pattern` matches with its one `*` (within one folder name)
/// standing for any text, and that exists.
fn newest_match(pattern: &Path) -> Option<PathBuf> {
    let components: Vec<_> = pattern.components().collect();
    let at = components
        .iter()
        .position(|c| c.as_os_str().to_string_lossy().contains('*'))?;
    let parent: PathBuf = components[..at].iter().collect();
    let rest: PathBuf = components[at + 1..].iter().collect();
    let name = components[at].as_os_str().to_string_lossy();
    let (prefix, suffix) = name.split_once('*')?;
    let mut names: Vec<String> = std::fs::read_dir(&parent)
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|n| n.len() >= prefix.len() + suffix.len() && n.starts_with(prefix) && n.ends_with(suffix))
        .collect();
    names.sort();
    names
        .into_iter()
        .rev()
        .map(|n| parent.join(n).join(&rest))
        .find(|p| p.exists())
}

/// Refuses a model (`role`, named by the recipe's key `key` as `path`) whose tokenizer is not
/// the policy's: it would read other tokens than the ones sampled (a teacher's log-probabilities,
/// a value model's values).
pub(crate) fn same_tokenizer(
    loaded: &LoadedRecipe,
    tokenizer: &LmTokenizer,
    path: &str,
    key: &str,
    role: &str,
) -> Result<(), LmError> {
    let fail = |message: String| invalid(loaded, key, message);
    let dir = rein_model::lm::locate(&model_path(loaded, path)).map_err(|e| fail(e.to_string()))?;
    let theirs = LmTokenizer::load(&dir, &[]).map_err(|e| fail(e.to_string()))?;
    match tokenizer.vocabulary_difference(&theirs) {
        None => Ok(()),
        Some(difference) => Err(fail(format!(
            "{role} {} must share the policy's tokenizer: {difference}",
            dir.display()
        ))),
    }
}

/// `sampler.precision = "q8"` quantises the activations of products with a quantised model's
/// codes: an error naming the key when the model has none (it would sample exactly, quietly).
pub(crate) fn sampler_precision_fits<B: ReinBackend>(
    loaded: &LoadedRecipe,
    model: &CausalLm<B>,
) -> Result<(), LmError> {
    if loaded.recipe.sampler.precision != SamplerPrecision::Q8 || model.packed_weights().is_some() {
        return Ok(());
    }
    let model = loaded
        .recipe
        .model
        .path
        .as_deref()
        .unwrap_or("a model trained from scratch");
    Err(invalid(
        loaded,
        "sampler.precision",
        format!(
            "\"q8\" reads a quantised model's codes and {model} has none (load a .gguf, or use precision = \"exact\")"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_star_picks_the_newest_run_that_has_the_rest() {
        let runs = std::env::temp_dir().join(format!("rein-newest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&runs);
        for (run, finished) in [
            ("rm-20261101-000000", true),
            ("rm-20261102-000000", true),
            ("rm-20261103-000000", false),
        ] {
            std::fs::create_dir_all(runs.join(run)).unwrap();
            if finished {
                std::fs::create_dir_all(runs.join(run).join("final")).unwrap();
            }
        }
        std::fs::create_dir_all(runs.join("other-20261109-000000/final")).unwrap();
        let found = newest_match(&runs.join("rm-*/final"));
        assert_eq!(found, Some(runs.join("rm-20261102-000000/final")));
        assert_eq!(newest_match(&runs.join("none-*/final")), None);
        std::fs::remove_dir_all(&runs).unwrap();
    }
}
