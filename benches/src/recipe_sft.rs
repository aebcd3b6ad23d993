//! What the benches that train from a recipe's SFT'd model share: the recipe loaded, its
//! generated task prepared, its model (initialised as the recipe says) after the recipe's SFT
//! stage, and its reward plugins loaded.

use std::path::Path;

use anyhow::Context;
use rein_model::CpuAutodiff;
use rein_model::lm::{CausalLm, LmConfig, LmInit, LmTokenizer};
use rein_plugin::PluginRuntime;
use rein_posttrain::{Prompt, Sft, WeightedReward, generate_task, prepare};
use rein_recipe::LoadedRecipe;
use rein_run::driver::Trainer;
use rein_run::watchdog::Phases;

/// A recipe, its prepared data and its model after its SFT stage.
pub(crate) struct AfterSft {
    pub(crate) loaded: LoadedRecipe,
    pub(crate) tokenizer: LmTokenizer,
    pub(crate) train: Vec<Prompt>,
    pub(crate) test: Vec<Prompt>,
    pub(crate) model: CausalLm<CpuAutodiff>,
}

/// Loads `recipe` (one with an architecture, a generated task and an SFT stage), prepares its
/// data and runs its SFT stage.
pub(crate) fn after_sft(recipe: &str) -> anyhow::Result<AfterSft> {
    let loaded = LoadedRecipe::load(Path::new(recipe), &[])?;
    let r = &loaded.recipe;
    let architecture = (r.model.architecture.clone()).context("the recipe names an architecture")?;
    let config = LmConfig::from_json(serde_json::to_value(architecture)?).map_err(anyhow::Error::msg)?;
    let data = r.data.clone().context("the recipe has data")?;
    let task = data.task.clone().context("the recipe generates its task")?;
    let device = Default::default();
    let model = LmInit {
        config,
        std: r.model.init_std,
    }
    .init::<CpuAutodiff>(&mut rein_core::SeededRng::new(r.seed), &device);
    let tokenizer_dir = loaded.resolve(r.model.tokenizer.as_deref().unwrap_or_default());
    let tokenizer = LmTokenizer::load(&tokenizer_dir, &model.config().eos_ids())?;
    let (train, test) = generate_task(&task, r.seed);
    let (train, test) = (
        prepare(&train, &tokenizer, &data, &[], None)?,
        prepare(&test, &tokenizer, &data, &[], None)?,
    );
    let sft = r.sft.clone().context("the recipe has an SFT stage")?;
    let pad = model.config().eos_ids().first().copied().unwrap_or(0);
    println!("{recipe}: {} SFT steps…", sft.steps);
    let mut trainer = Sft::new(model, &train, pad, &sft, r.seed, vec![device])?;
    let phases = Phases::new(Default::default(), Default::default());
    for step in 1..=sft.steps {
        trainer.step(step, &phases)?;
    }
    Ok(AfterSft {
        model: trainer.model,
        loaded,
        tokenizer,
        train,
        test,
    })
}

/// `loaded`'s rewards (plugins only), loaded from `plugin_dir`.
pub(crate) fn recipe_rewards(
    loaded: &LoadedRecipe,
    runtime: &PluginRuntime,
    plugin_dir: &Path,
) -> anyhow::Result<Vec<WeightedReward>> {
    (loaded.recipe.reward.iter())
        .map(|entry| {
            let name = entry.plugin.as_deref().context("the recipe's rewards are plugins")?;
            let plugin = runtime.load(plugin_dir.join(format!("{name}.wasm")), Default::default())?;
            Ok(WeightedReward {
                reward: Box::new(plugin.reward(&serde_json::to_string(&entry.config)?)?),
                weight: entry.weight,
                isolate: entry.isolate,
            })
        })
        .collect()
}
