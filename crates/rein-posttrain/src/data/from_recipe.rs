//! A language-model recipe's data as read or generated, before tokenizing: prompts and target
//! completions, and for the algorithms that learn from preferences, preference pairs or
//! labelled completions, and for process reward models, step-labelled rows (from files, or made
//! from the generated task's worked solutions and slipped ones).

use std::path::Path;

use rein_recipe::{CurriculumKind, DataSection, LoadedRecipe, Plan};
use rein_sampler::SeededRng;

use crate::LmError;
use crate::run::recipe_keys::invalid;
use crate::{Example, LabelledExample, PreferenceExample, Skipped, StepwiseExample};

/// How an algorithm that learns from preference pairs reads them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PreferenceUse {
    /// Most tokens of prompt and completion together.
    pub(crate) max_length: usize,
    /// Whether the held-out split is pairs too (a reward model's; DPO's is prompts to answer).
    pub(crate) test_is_pairs: bool,
    /// Whether the algorithm learns from labelled completions (KTO) instead of pairs: paired
    /// rows are split into a desirable and an undesirable example.
    pub(crate) unpaired: bool,
}

impl PreferenceUse {
    /// How `plan`'s algorithm learns from preferences, when it does: its `max_length`, and
    /// whether the held-out split is pairs too and the data labelled completions.
    pub(crate) fn of(plan: Plan<'_>) -> Option<Self> {
        let (max_length, test_is_pairs, unpaired) = match plan {
            Plan::Dpo(dpo) => (dpo.dpo.max_length, false, false),
            Plan::Kto(kto) => (kto.kto.max_length, false, true),
            Plan::RewardModel(rm) => (rm.reward_model.max_length, true, false),
            _ => return None,
        };
        Some(Self {
            max_length,
            test_is_pairs,
            unpaired,
        })
    }
}

/// Step-labelled rows for training, and held out.
pub(crate) type StepwiseRows = (Vec<StepwiseExample>, Vec<StepwiseExample>);

/// A recipe's examples, preference rows and step-labelled rows.
pub(crate) struct RecipeData {
    pub(crate) train: Vec<Example>,
    pub(crate) test: Vec<Example>,
    pub(crate) preferences: Vec<PreferenceExample>,
    pub(crate) test_preferences: Vec<PreferenceExample>,
    /// Labelled completions (with [`PreferenceUse::unpaired`]).
    pub(crate) labelled: Vec<LabelledExample>,
    /// Step-labelled rows (process reward models), training and held out.
    pub(crate) stepwise: StepwiseRows,
    /// Preference, labelled or step-labelled rows that cannot train, with why.
    pub(crate) skipped: Vec<Skipped>,
}

/// The training and held-out examples of `data`'s generated task (the visual or the arithmetic
/// one), written into `data_dir`; `None` when it generates none.
fn generated(data: &DataSection, seed: u64, data_dir: Option<&Path>) -> Result<Option<Split>, LmError> {
    let split = match (&data.shapes_task, &data.task) {
        (Some(shapes), _) => crate::generate_shapes_task(shapes, seed),
        (None, Some(task)) => crate::generate_task(task, seed),
        (None, None) => return Ok(None),
    };
    if let Some(dir) = data_dir {
        std::fs::create_dir_all(dir)?;
        crate::write_jsonl(&dir.join("train.jsonl"), &split.0)?;
        crate::write_jsonl(&dir.join("test.jsonl"), &split.1)?;
    }
    Ok(Some(split))
}

/// Training and held-out examples.
type Split = (Vec<Example>, Vec<Example>);

/// Reads or generates `data` (writing a generated task into `data_dir`); with `preference`,
/// its preference pairs too; with `stepwise`, its step-labelled rows.
pub(crate) fn read_data(
    loaded: &LoadedRecipe,
    data: &DataSection,
    preference: Option<PreferenceUse>,
    stepwise: bool,
    data_dir: Option<&Path>,
) -> Result<RecipeData, LmError> {
    let (mut preferences, mut test_preferences, mut labelled) = (Vec::new(), Vec::new(), Vec::new());
    let (mut steps, mut test_steps) = (Vec::new(), Vec::new());
    let mut skipped = Vec::new();
    let unpaired = preference.as_ref().is_some_and(|p| p.unpaired);
    let test_is_pairs = preference.as_ref().is_some_and(|p| p.test_is_pairs);
    let (train, mut test) = match (generated(data, loaded.recipe.seed, data_dir)?, &data.train) {
        (Some(split), _) => split,
        (None, Some(path)) if stepwise => {
            ((steps, test_steps), skipped) = read_stepwise_files(loaded, data, path)?;
            (Vec::new(), Vec::new())
        }
        (None, Some(path)) if preference.is_some() => {
            (preferences, labelled, skipped) = match unpaired {
                true => {
                    let (labelled, skipped) = crate::read_labelled(&loaded.resolve(path), &data.fields)?;
                    (Vec::new(), labelled, skipped)
                }
                false => {
                    let (preferences, skipped) = crate::read_preferences(&loaded.resolve(path), &data.fields)?;
                    (preferences, Vec::new(), skipped)
                }
            };
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
        if unpaired {
            labelled = std::mem::take(&mut preferences)
                .into_iter()
                .flat_map(crate::unpair)
                .collect();
        }
    }
    if let (Some(_), true) = (&data.task, stepwise) {
        // Generated step labels: each problem's worked solution, all right, and a slipped one,
        // wrong from its slip on (loading the recipe checked that the task's solutions can slip).
        let mut rng = SeededRng::new(loaded.recipe.seed ^ 0x5739);
        steps = crate::stepwise_from_examples(&train, &mut rng);
        test_steps = crate::stepwise_from_examples(&std::mem::take(&mut test), &mut rng);
    }
    Ok(RecipeData {
        train,
        test,
        preferences,
        test_preferences,
        labelled,
        stepwise: (steps, test_steps),
        skipped,
    })
}

/// The step-labelled rows of the training file `path` and of `data.test`, if any, with the rows
/// of both that cannot train.
fn read_stepwise_files(
    loaded: &LoadedRecipe,
    data: &DataSection,
    path: &str,
) -> Result<(StepwiseRows, Vec<Skipped>), LmError> {
    let (rows, mut skipped) = crate::read_stepwise(&loaded.resolve(path), &data.fields)?;
    let mut test = Vec::new();
    if let Some(path) = &data.test {
        let skipped_test;
        (test, skipped_test) = crate::read_stepwise(&loaded.resolve(path), &data.fields)?;
        skipped.extend(skipped_test);
    }
    Ok(((rows, test), skipped))
}
