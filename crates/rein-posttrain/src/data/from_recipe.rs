//! A language-model recipe's data as read or generated, before tokenizing: prompts and target
//! completions, and for the algorithms that learn from preferences, preference pairs (from
//! files, or made from the generated task's worked solutions and slipped ones).

use std::path::Path;

use rein_recipe::{CurriculumKind, DataSection, LoadedRecipe};
use rein_sampler::SeededRng;

use crate::LmError;
use crate::run::recipe_keys::invalid;
use crate::{Example, PreferenceExample, Skipped};

/// How an algorithm that learns from preference pairs reads them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PreferenceUse {
    /// Most tokens of prompt and completion together.
    pub(crate) max_length: usize,
    /// Whether the held-out split is pairs too (a reward model's; DPO's is prompts to answer).
    pub(crate) test_is_pairs: bool,
}

/// A recipe's examples and preference rows.
pub(crate) struct RecipeData {
    pub(crate) train: Vec<Example>,
    pub(crate) test: Vec<Example>,
    pub(crate) preferences: Vec<PreferenceExample>,
    pub(crate) test_preferences: Vec<PreferenceExample>,
    /// Preference rows that cannot train, with why.
    pub(crate) skipped: Vec<Skipped>,
}

/// Reads or generates `data` (writing a generated task into `data_dir`); with `preference`,
/// its preference pairs too.
pub(crate) fn read_data(
    loaded: &LoadedRecipe,
    data: &DataSection,
    preference: Option<PreferenceUse>,
    data_dir: Option<&Path>,
) -> Result<RecipeData, LmError> {
    let (mut preferences, mut test_preferences) = (Vec::new(), Vec::new());
    let mut skipped = Vec::new();
    let test_is_pairs = preference.as_ref().is_some_and(|p| p.test_is_pairs);
    let (train, mut test) = match (&data.task, &data.train) {
        (Some(task), _) => {
            let (train, test) = crate::generate_task(task, loaded.recipe.seed);
            if let Some(dir) = data_dir {
                std::fs::create_dir_all(dir)?;
                crate::write_jsonl(&dir.join("train.jsonl"), &train)?;
                crate::write_jsonl(&dir.join("test.jsonl"), &test)?;
            }
            (train, test)
        }
        (None, Some(path)) if preference.is_some() => {
            (preferences, skipped) = crate::read_preferences(&loaded.resolve(path), &data.fields)?;
            let test = match &data.test {
                Some(path) if test_is_pairs => {
                    let skipped_test;
                    (test_preferences, skipped_test) = crate::read_preferences(&loaded.resolve(path), &data.fields)?;
                    skipped.extend(skipped_test);
                    Vec::new()
                }
                Some(path) => crate::read(&loaded.resolve(path), &data.fields)?,
                None => Vec::new(),
            };
            (Vec::new(), test)
        }
        (None, Some(path)) => {
            let train = crate::read(&loaded.resolve(path), &data.fields)?;
            let test = match &data.test {
                Some(path) => crate::read(&loaded.resolve(path), &data.fields)?,
                None => Vec::new(),
            };
            (train, test)
        }
        // Loading refuses such a recipe (the plan's data check); one changed since is refused here.
        (None, None) => return Err(invalid(loaded, "data", "names neither `train` nor `task`")),
    };
    if let Some(c) = (loaded.recipe.curriculum.as_ref()).filter(|c| c.kind == CurriculumKind::Ucb) {
        let sources = train.iter().map(|e| crate::source_of(&e.metadata, &data.fields.source));
        let sources: Vec<String> = sources.collect();
        crate::online::curriculum::sources_to_draw(sources.iter().map(String::as_str), &c.sources)
            .map_err(|(key, message)| invalid(loaded, key, message))?;
    }
    if let (Some(_), Some(_)) = (&data.task, &preference) {
        // Generated pairs: each problem's worked solution against a slipped one (loading the
        // recipe checked that the task's solutions can slip).
        let mut rng = SeededRng::new(loaded.recipe.seed ^ 0x5119);
        let mut slip = |e: &crate::Example| crate::slipped_solution(&e.prompt, &mut rng);
        preferences = crate::pairs_from_examples(&train, &mut slip);
        if test_is_pairs {
            test_preferences = crate::pairs_from_examples(&std::mem::take(&mut test), &mut slip);
        }
    }
    Ok(RecipeData {
        train,
        test,
        preferences,
        test_preferences,
        skipped,
    })
}
