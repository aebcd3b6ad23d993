//! What a language-model run or evaluation is made of, built from its recipe: the model and
//! tokenizer (checked against each other), the prepared data, the reward plugins, and the tools
//! and text environment of multi-turn episodes.

use std::path::Path;

use rein_core::{RewardFn, TextEnv, Tool};
use rein_model::ReinBackend;
use rein_model::lm::lora::LoraSpec;
use rein_model::lm::{CausalLm, LmConfig, LmInit, LmTokenizer, load};
use rein_model::vision::{IMAGE_TOKEN, Idefics3Vision, ImageSide, VisionConfig};
use rein_plugin::{PluginRuntime, RewardPlugin};
use rein_recipe::{LmPpoRecipe, LoadedRecipe, Plan, ProcessRewardModelRecipe, Weights};
use rein_sampler::SeededRng;

use crate::LmError;
use crate::PromptImageReader;
use crate::StepTokenizing;
use crate::rewards::setup::rewards;
use crate::rollout::episodes::Agent;
use crate::run::recipe_keys::{invalid, model_path, same_tokenizer, sampler_precision_fits};
use crate::{EvalReport, EvalSettings, WeightedReward};

/// Everything a language-model run or evaluation needs, built from a recipe.
pub(crate) struct LmSetup<B: ReinBackend> {
    pub(crate) model: CausalLm<B>,
    pub(crate) tokenizer: LmTokenizer,
    pub(crate) train: Vec<crate::Prompt>,
    pub(crate) test: Vec<crate::Prompt>,
    pub(crate) rewards: Vec<WeightedReward>,
    /// The label-free rewards the host computes from the sampler.
    pub(crate) signals: Vec<crate::SignalReward>,
    pub(crate) accuracy_index: usize,
    pub(crate) majority: Option<RewardPlugin>,
    /// Tools and a text environment, for multi-turn episodes.
    pub(crate) agent: Option<Agent>,
    /// Preference pairs (DPO, reward models).
    pub(crate) pairs: Vec<crate::PreferencePair>,
    /// Held-out preference pairs (reward models).
    pub(crate) test_pairs: Vec<crate::PreferencePair>,
    /// Labelled completions (KTO).
    pub(crate) labelled: Vec<crate::LabelledCompletion>,
    /// Step-labelled rows, training and held out (process reward models).
    pub(crate) stepwise: StepRows,
    /// Preference, labelled or step-labelled rows that could not train.
    pub(crate) skipped_rows: usize,
    /// A vision-language model's image processor (its settings are saved with every model
    /// the run writes).
    pub(crate) images: Option<PromptImageReader>,
}

/// Loads or initialises the model (or the model directory `model_dir`, when given), the
/// tokenizer, the data (writing a generated task into `data_dir`), and the reward plugins.
pub(crate) fn setup<B: ReinBackend>(
    loaded: &LoadedRecipe,
    plan: Plan<'_>,
    plugin_dir: &Path,
    data_dir: Option<&Path>,
    model_dir: Option<&Path>,
    device: &B::Device,
) -> Result<LmSetup<B>, LmError> {
    let recipe = &loaded.recipe;
    let data = (plan.data()).ok_or_else(|| LmError::Unsupported("a PPO recipe trains no language model".into()))?;
    let preference = crate::data::from_recipe::PreferenceUse::of(plan);

    let lora = lora_spec(loaded)?;
    // Weights trained from scratch, then LoRA adapters, from the run's own generator.
    let mut init_rng = SeededRng::new(recipe.seed);
    let (model, tokenizer, images) = model_and_tokenizer::<B>(loaded, model_dir, &mut init_rng, device)?;
    let model = with_lora(loaded, model, lora.as_ref(), &mut init_rng, device)?;
    sampler_precision_fits(loaded, &model)?;
    other_models_share_the_tokenizer(loaded, plan, &tokenizer)?;

    let crate::data::from_recipe::RecipeData {
        train,
        test,
        preferences,
        test_preferences,
        labelled,
        stepwise,
        mut skipped,
    } = crate::data::from_recipe::read_data(loaded, data, preference, matches!(plan, Plan::Prm(_)), data_dir)?;
    let (train, stepwise) = match plan {
        Plan::Prm(ProcessRewardModelRecipe { prm, .. }) => {
            tokenized_steps(train, stepwise, &mut skipped, &tokenizer, &StepTokenizing::of(prm))?
        }
        _ => (train, Default::default()),
    };
    let runtime = PluginRuntime::default();
    let agent = agent(loaded, &runtime, plugin_dir, &tokenizer, images.as_ref())?;
    let tools = agent.as_ref().map(|a| a.schemas(None)).unwrap_or_default();
    let mut train = prepare_split("data.train", &train, (&tokenizer, data, &tools), images.as_ref())?;
    let (pairs, test_pairs, labelled) = match preference {
        Some(crate::data::from_recipe::PreferenceUse { max_length, .. }) => {
            let read = (&preferences[..], &test_preferences[..], &labelled[..]);
            let (pairs, test_pairs, labelled) =
                tokenized_preferences(read, &mut skipped, (&tokenizer, data), max_length)?;
            if train.is_empty() {
                // Preference data: an SFT stage learns the chosen (desirable) completions.
                train = pairs.iter().map(crate::PreferencePair::chosen_prompt).collect();
                let desirable = labelled.iter().filter(|e| e.desirable);
                train.extend(desirable.map(crate::LabelledCompletion::as_prompt));
            }
            (pairs, test_pairs, labelled)
        }
        None => (Vec::new(), Vec::new(), Vec::new()),
    };
    let mut test = prepare_split("data.test", &test, (&tokenizer, data, &tools), images.as_ref())?;
    images_fit(loaded, plan, train.iter().chain(&test))?;
    if let Some(max) = recipe.eval.max_examples {
        test.truncate(max);
    }

    let rewards = rewards::<B>(loaded, &runtime, plugin_dir, (&model, &tokenizer), device)?;
    let accuracy_index = match &recipe.eval.accuracy_reward {
        Some(name) => rewards.iter().position(|r| r.reward.name() == name).ok_or_else(|| {
            invalid(
                loaded,
                "eval.accuracy_reward",
                format!("`{name}` is not one of the recipe's rewards"),
            )
        })?,
        None => 0,
    };
    let majority = match &recipe.eval.majority_plugin {
        Some(name) if !rewards.is_empty() && recipe.eval.k > 1 => {
            let path = loaded.plugin_path(name, "eval.majority_plugin", plugin_dir)?;
            Some(runtime.load(&path, Default::default())?.reward("{}")?)
        }
        _ => None,
    };
    Ok(LmSetup {
        model,
        tokenizer,
        train,
        test,
        rewards,
        signals: crate::rewards::setup::signals(loaded),
        accuracy_index,
        majority,
        agent,
        pairs,
        test_pairs,
        labelled,
        stepwise,
        skipped_rows: skipped.len(),
        images,
    })
}

/// [`crate::prepare`] of one split of the data, an error naming the split's key (`data.train`)
/// before the row it names.
fn prepare_split(
    key: &str,
    examples: &[crate::Example],
    (tokenizer, data, tools): (&LmTokenizer, &rein_recipe::DataSection, &[serde_json::Value]),
    images: Option<&PromptImageReader>,
) -> Result<Vec<crate::Prompt>, LmError> {
    crate::prepare(examples, tokenizer, data, tools, images).map_err(|error| match error {
        LmError::Data(crate::DataError { path, reason }) => LmError::Data(crate::DataError {
            path: format!("{key} {path}"),
            reason,
        }),
        other => other,
    })
}

/// Step-labelled rows ready to train on, and the held-out ones.
pub(crate) type StepRows = (Vec<crate::StepLabelled>, Vec<crate::StepLabelled>);

/// The step-labelled rows `read` (training and held out) tokenized, the rows that cannot train
/// added to `skipped` and reported; with the SFT stage's examples: `train` as given (a generated
/// task's worked solutions), or else the training rows whose every step is right, their steps
/// joined by the separator.
fn tokenized_steps(
    train: Vec<crate::Example>,
    (rows, test_rows): (Vec<crate::StepwiseExample>, Vec<crate::StepwiseExample>),
    skipped: &mut Vec<crate::Skipped>,
    tokenizer: &LmTokenizer,
    settings: &StepTokenizing<'_>,
) -> Result<(Vec<crate::Example>, StepRows), LmError> {
    let train = match train.is_empty() {
        false => train,
        true => (rows.iter().filter(|r| r.labels.iter().all(|&l| l)))
            .map(|r| crate::Example {
                prompt: r.prompt.clone(),
                answer: None,
                completion: Some(r.steps.join(settings.separator)),
                metadata: String::new(),
                images: Vec::new(),
            })
            .collect(),
    };
    let (prepared, more) = crate::prepare_stepwise(&rows, tokenizer, settings, true)?;
    skipped.extend(more);
    let (test, more) = crate::prepare_stepwise(&test_rows, tokenizer, settings, false)?;
    skipped.extend(more);
    crate::report_skipped(skipped);
    Ok((train, (prepared, test)))
}

/// Tokenized preference pairs, held-out pairs and labelled completions.
type Tokenized = (
    Vec<crate::PreferencePair>,
    Vec<crate::PreferencePair>,
    Vec<crate::LabelledCompletion>,
);

/// The preference pairs, held-out pairs and labelled completions `read`, tokenized; the rows
/// that cannot train added to `skipped` and reported.
fn tokenized_preferences(
    (pairs, test_pairs, labelled): (
        &[crate::PreferenceExample],
        &[crate::PreferenceExample],
        &[crate::LabelledExample],
    ),
    skipped: &mut Vec<crate::Skipped>,
    (tokenizer, data): (&LmTokenizer, &rein_recipe::DataSection),
    max_length: usize,
) -> Result<Tokenized, LmError> {
    let (pairs, more) = crate::prepare_preferences(pairs, tokenizer, data, max_length)?;
    skipped.extend(more);
    let (test_pairs, more) = crate::prepare_preferences(test_pairs, tokenizer, data, max_length)?;
    skipped.extend(more);
    let (labelled, more) = crate::prepare_labelled(labelled, tokenizer, data, max_length)?;
    skipped.extend(more);
    crate::report_skipped(skipped);
    Ok((pairs, test_pairs, labelled))
}

/// Refuses a teacher, a value model or an implicit PRM whose tokenizer is not the policy's.
fn other_models_share_the_tokenizer(
    loaded: &LoadedRecipe,
    plan: Plan<'_>,
    tokenizer: &LmTokenizer,
) -> Result<(), LmError> {
    if let Some(teacher) = &loaded.recipe.teacher {
        same_tokenizer(loaded, tokenizer, &teacher.model, "teacher.model", "the teacher")?;
    }
    if let Some(path) = loaded.recipe.implicit_prm.as_ref().and_then(|prm| prm.model.as_ref()) {
        same_tokenizer(loaded, tokenizer, path, "implicit_prm.model", "the implicit PRM")?;
    }
    if let Plan::LmPpo(LmPpoRecipe { ppo, .. }) = plan
        && let Some(path) = &ppo.value_model_path
    {
        same_tokenizer(loaded, tokenizer, path, "algorithm.value_model_path", "the value model")?;
    }
    Ok(())
}

/// Refuses, when some of `prompts` have images, what would read them without their images:
/// inference servers, and a teacher, implicit PRM or value model of their own (which read the
/// prompt's tokens only). An error names the key.
fn images_fit<'p>(
    loaded: &LoadedRecipe,
    plan: Plan<'_>,
    mut prompts: impl Iterator<Item = &'p crate::Prompt>,
) -> Result<(), LmError> {
    if !prompts.any(|p| !p.images.is_empty()) {
        return Ok(());
    }
    let recipe = &loaded.recipe;
    let refuse = |key: &str, what: &str| {
        let message = format!(
            "{what} cannot read the prompts' images: vision-language models train on prompts sampled in process, with the policy as the only model"
        );
        Err(invalid(loaded, key, message))
    };
    if recipe.sampler.backend != rein_core::SamplerBackend::Native {
        return refuse("sampler.backend", "an inference server");
    }
    if recipe.teacher.is_some() {
        return refuse("teacher.model", "a teacher");
    }
    if recipe.implicit_prm.as_ref().is_some_and(|prm| prm.model.is_some()) {
        return refuse("implicit_prm.model", "an implicit PRM of its own");
    }
    if let Plan::LmPpo(LmPpoRecipe { ppo, .. }) = plan
        && ppo.value_model_path.is_some()
    {
        return refuse("algorithm.value_model_path", "a value model of its own");
    }
    Ok(())
}

/// The recipe's tools and text environment, loaded, when it plays multi-turn episodes (tools
/// alone get the default `[agent]` limits). The chat template must extend each turn's prefix
/// unchanged (checked here, before any training).
fn agent(
    loaded: &LoadedRecipe,
    runtime: &PluginRuntime,
    plugin_dir: &Path,
    tokenizer: &LmTokenizer,
    images: Option<&PromptImageReader>,
) -> Result<Option<Agent>, LmError> {
    let recipe = &loaded.recipe;
    if recipe.tool.is_empty() && recipe.agent.is_none() {
        return Ok(None);
    }
    let section = recipe.agent.clone().unwrap_or_default();
    let config = |table: &toml::Table| serde_json::to_string(table).unwrap_or_else(|_| "{}".into());
    let mut tools: Vec<Box<dyn Tool>> = Vec::new();
    for (i, entry) in recipe.tool.iter().enumerate() {
        let path = loaded.plugin_path(&entry.plugin, &format!("tool[{i}].plugin"), plugin_dir)?;
        let tool = runtime
            .load(&path, entry.limits.clone())?
            .tool(&config(&entry.config))?;
        if let Some(other) = tools.iter().find(|t| t.spec().name == tool.spec().name) {
            return Err(invalid(
                loaded,
                &format!("tool[{i}].plugin"),
                format!("a second tool named `{}`", other.spec().name),
            ));
        }
        tools.push(Box::new(tool));
    }
    let env: Option<Box<dyn TextEnv>> = match &section.env {
        Some(entry) => {
            let path = loaded.plugin_path(&entry.plugin, "agent.env.plugin", plugin_dir)?;
            Some(Box::new(
                runtime
                    .load(&path, entry.limits.clone())?
                    .text_env(&config(&entry.config))?,
            ))
        }
        None => None,
    };
    crate::rollout::transcript::check_template_extends_prefixes(tokenizer, images.is_some())?;
    Ok(Some(Agent {
        tools,
        env,
        max_turns: section.max_turns,
        max_tokens: section.max_tokens,
        system_prompt: recipe.data.as_ref().and_then(|d| d.system_prompt.clone()),
        images: images.cloned(),
    }))
}

/// `model` with the adapters `lora` asks for (none without), drawn from `rng`; an error names
/// `lora.vision` when it asks for the vision encoder's and the model has none.
fn with_lora<B: ReinBackend>(
    loaded: &LoadedRecipe,
    model: CausalLm<B>,
    lora: Option<&LoraSpec>,
    rng: &mut SeededRng,
    device: &B::Device,
) -> Result<CausalLm<B>, LmError> {
    match lora {
        Some(spec) if spec.vision && model.vision.is_none() => Err(invalid(
            loaded,
            "lora.vision",
            "the model has no vision encoder to adapt",
        )),
        Some(spec) => Ok(model.with_lora(spec, rng, device)),
        None => Ok(model),
    }
}

/// The recipe's `[lora]` section as the model takes it, checked.
pub(crate) fn lora_spec(loaded: &LoadedRecipe) -> Result<Option<LoraSpec>, LmError> {
    let Some(section) = &loaded.recipe.lora else {
        return Ok(None);
    };
    let spec = LoraSpec {
        rank: section.rank,
        alpha: section.alpha,
        dropout: section.dropout,
        targets: section.targets.clone(),
        rslora: section.rslora,
        vision: section.vision,
    };
    spec.validate()
        .map_err(|(field, message)| invalid(loaded, &format!("lora.{field}"), message))?;
    Ok(Some(spec))
}

/// The recipe's model (or the model directory `model_dir`) and its tokenizer, checked against
/// each other.
fn model_and_tokenizer<B: ReinBackend>(
    loaded: &LoadedRecipe,
    model_dir: Option<&Path>,
    rng: &mut SeededRng,
    device: &B::Device,
) -> Result<(CausalLm<B>, LmTokenizer, Option<PromptImageReader>), LmError> {
    let recipe = &loaded.recipe;
    let model_section = &recipe.model;
    let resolve = |path: &str| model_path(loaded, path);
    let (tokenizer_dir, model): (_, CausalLm<B>) = match model_dir {
        Some(dir) => (dir.to_path_buf(), load(dir, device)?),
        None => {
            let source = loaded.model_source()?;
            let model = match source.weights {
                Weights::Path(path) => load(&resolve(path), device)?,
                Weights::Architecture(table) => {
                    let value = serde_json::to_value(table)
                        .map_err(|e| invalid(loaded, "model.architecture", e.to_string()))?;
                    let config = LmConfig::from_json(value).map_err(|e| invalid(loaded, "model.architecture", e))?;
                    config.validate().map_err(rein_model::lm::LoadError::from)?;
                    LmInit {
                        config,
                        std: model_section.init_std,
                    }
                    .init(rng, device)
                }
            };
            (resolve(source.tokenizer), model)
        }
    };
    let kwargs = recipe
        .data
        .as_ref()
        .map(|d| d.chat_template_kwargs.clone())
        .unwrap_or_default();
    let kwargs =
        serde_json::to_value(kwargs).map_err(|e| invalid(loaded, "data.chat_template_kwargs", e.to_string()))?;
    let mut tokenizer = LmTokenizer::load(&tokenizer_dir, &model.config().eos_ids())?
        .with_template_kwargs(kwargs.as_object().cloned().unwrap_or_default());
    if let Some(file) = &model_section.chat_template {
        let path = loaded.resolve(file);
        let template = std::fs::read_to_string(&path)
            .map_err(|e| invalid(loaded, "model.chat_template", format!("{}: {e}", path.display())))?;
        tokenizer = tokenizer.with_chat_template(template);
    }
    if tokenizer.vocab_size() > model.config().vocab_size {
        return Err(invalid(
            loaded,
            "model",
            format!(
                "the tokenizer has {} tokens but the model only {}",
                tokenizer.vocab_size(),
                model.config().vocab_size
            ),
        ));
    }
    let model = match (&model_section.vision, model.vision.is_some(), model_dir) {
        (Some(table), false, _) => {
            let vision = new_image_side(loaded, &model, table, &tokenizer, rng, device)?;
            model.with_vision(ImageSide::Idefics3(vision))
        }
        (Some(_), true, None) => {
            let message = "adds an image side, but the model has one already";
            return Err(invalid(loaded, "model.vision", message));
        }
        // A checkpoint of this run (resumed, evaluated) has the image side it trained.
        _ => model,
    };
    // A vision-language model reads its prompts' images with the processor saved beside its
    // tokenizer (Hugging Face keeps both in the model directory).
    let images = (model.vision.as_ref())
        .map(|vision| PromptImageReader::load(&tokenizer_dir, vision))
        .transpose()?;
    let model = match model_section.train_vision_encoder {
        true => model,
        false => model.with_frozen_vision(),
    };
    Ok((model.with_dtype(recipe.model_dtype()), tokenizer, images))
}

/// The image side `model.vision` (`table`) describes, initialised from `rng` for `model`, its
/// features replacing the tokenizer's `<image>` token.
fn new_image_side<B: ReinBackend>(
    loaded: &LoadedRecipe,
    model: &CausalLm<B>,
    table: &toml::Table,
    tokenizer: &LmTokenizer,
    rng: &mut SeededRng,
    device: &B::Device,
) -> Result<Idefics3Vision<B>, LmError> {
    let fail = |message: String| invalid(loaded, "model.vision", message);
    let mut settings = serde_json::to_value(table).map_err(|e| fail(e.to_string()))?;
    let scale_factor = match settings.as_object_mut().and_then(|s| s.remove("scale_factor")) {
        None => 2,
        Some(value) => value
            .as_u64()
            .ok_or_else(|| fail(format!("scale_factor: expected a positive integer, found {value}")))?
            as usize,
    };
    const KEYS: [&str; 9] = [
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_channels",
        "image_size",
        "patch_size",
        "layer_norm_eps",
        "hidden_act",
    ];
    if let Some(key) = table
        .keys()
        .find(|k| *k != "scale_factor" && !KEYS.contains(&k.as_str()))
    {
        return Err(fail(format!(
            "unknown key `{key}` (known: scale_factor, {})",
            KEYS.join(", ")
        )));
    }
    let config = VisionConfig::from_json(&settings).map_err(fail)?;
    let token = (tokenizer.token_id(IMAGE_TOKEN)).ok_or_else(|| {
        fail(format!(
            "the tokenizer has no `{IMAGE_TOKEN}` token for the image features"
        ))
    })?;
    let std = loaded.recipe.model.init_std;
    Idefics3Vision::init(model.config(), config, (scale_factor, token), std, rng, device).map_err(fail)
}

impl<B: ReinBackend> LmSetup<B> {
    /// Evaluates `model` on the held-out prompts; `None` without prompts or rewards.
    pub(crate) fn evaluate<M: ReinBackend>(
        &mut self,
        model: &CausalLm<M>,
        loaded: &LoadedRecipe,
        device: &M::Device,
    ) -> Result<Option<EvalReport>, LmError> {
        if self.test.is_empty() || self.rewards.is_empty() {
            return Ok(None);
        }
        let recipe = &loaded.recipe;
        let settings = EvalSettings {
            k: recipe.eval.k,
            temperature: recipe.eval.temperature.unwrap_or(recipe.sampler.temperature),
            max_new_tokens: recipe.sampler.max_new_tokens,
            batch: 64,
            seed: recipe.seed ^ 0xE7A1,
            stop: &recipe.sampler.stop,
        };
        let accuracy: &mut dyn RewardFn = self.rewards[self.accuracy_index].reward.as_mut();
        let majority = self.majority.as_mut().map(|m| m as &mut dyn RewardFn);
        Ok(Some(crate::evaluate(
            model,
            &self.tokenizer,
            &self.test,
            accuracy,
            majority,
            self.agent.as_mut(),
            &settings,
            device,
        )?))
    }
}

/// Evaluates a recipe's model (or the model directory `model_dir`) on its held-out split with
/// its rewards.
pub fn evaluate_recipe(
    loaded: &LoadedRecipe,
    plugin_dir: &Path,
    model_dir: Option<&Path>,
) -> Result<EvalReport, LmError> {
    let device = Default::default();
    let mut setup = setup::<rein_model::Cpu>(loaded, loaded.plan()?, plugin_dir, None, model_dir, &device)?;
    let model = setup.model.clone();
    setup.evaluate(&model, loaded, &device)?.ok_or_else(|| {
        invalid(
            loaded,
            "data.test",
            "no held-out prompts, or no [[reward]] to judge them",
        )
    })
}
