//! rein's recipes: TOML files that say everything about a run, composed from fragments.
//!
//! ```toml
//! extends = ["fragments/ppo-classic.toml"]   # deep-merged in order, then this file
//! [env]
//! plugin = "cartpole"
//! ```
//!
//! `--set algorithm.clip_coef=0.3` overrides any key. Errors name the file (or `--set`), the
//! dotted key path, and for unknown keys the nearest valid one.
//!
//! **Architecture invariant:** this crate knows nothing about burn, wasmtime or training: it
//! turns files into a validated [`Recipe`] of plain data, and `rein-train` reads it.

mod compose;
mod curriculum;
mod data;
mod dpo;
mod error;
mod grpo;
mod implicit_prm;
mod keys;
mod kto;
mod lm_ppo;
mod model_source;
mod off_policy;
mod online_dpo;
mod plan;
mod ppo;
mod process_reward_model;
mod reward_model;
mod rewards;
mod rollout;
mod sampler;
mod schema;
mod sft;
mod tree_rollout;
mod uses;

use std::path::{Path, PathBuf};

pub use curriculum::{CurriculumKind, CurriculumSection};
pub use data::{ArithmeticTask, Fields, OperandRange, SHAPE_COLORS, ShapesTask, Solution};
pub use dpo::DpoRecipe;
pub use error::RecipeError;
pub use grpo::GrpoRecipe;
pub use implicit_prm::{ImplicitPrmSection, ImplicitPrmUpdate};
pub use kto::{KtoRecipe, KtoSection};
pub use lm_ppo::LmPpoRecipe;
pub use model_source::{ModelSource, Weights};
pub use off_policy::{OffPolicyAlgorithm, OffPolicyRecipe, SacSection, Td3Section};
pub use online_dpo::OnlineDpoRecipe;
pub use plan::Plan;
pub use ppo::PpoRecipe;
pub use process_reward_model::ProcessRewardModelRecipe;
pub use rein_core::{AdvantageKind, PrmAggregate, PrmSettings};
pub use reward_model::RewardModelRecipe;
pub use rollout::Rollout;
pub use schema::{
    AgentSection, Algorithm, DataSection, Device, DpoSection, EnvSection, EvalSection, GrpoSection, JudgeEntry,
    LmPpoSection, LogFormat, LoraSection, ModelSection, OnlineDpoSection, OptimizerSection, PluginEntry, PpoSection,
    ProcessRewardModelSection, Recipe, RewardEntry, RewardModelKind, RewardModelSection, SamplerSection, SftSection,
    TeacherKl, TeacherSection, TrainSection,
};
pub use sft::{MAX_BATCH_SIZE, SftRecipe};
pub use tree_rollout::{BranchRule, RolloutKind, RolloutSection};

use compose::Composed;
use schema::LM_PPO_TAG;

/// A recipe loaded from a file, with overrides applied and validated.
#[derive(Debug, Clone)]
pub struct LoadedRecipe {
    /// The typed recipe.
    pub recipe: Recipe,
    /// The file it was loaded from.
    pub path: PathBuf,
    composed: Composed,
}

impl LoadedRecipe {
    /// Loads `path`, applies `overrides` (`key.path=value`), and checks the result against the
    /// schema.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self, RecipeError> {
        let mut composed = Composed::load(path)?;
        for arg in overrides {
            composed.apply_override(arg)?;
        }
        let mut recipe: Recipe = deserialize(&composed)?;
        if recipe.name.is_none() {
            recipe.name = path.file_stem().map(|s| s.to_string_lossy().into_owned());
        }
        if let Some((key, message)) = uses::first_unused(&composed.table, &recipe.algorithm) {
            return Err(RecipeError::Invalid {
                file: composed.origin(&key),
                path: key,
                message,
            });
        }
        // Defaults that depend on the algorithm or on another key.
        let anneal_by_default = matches!(recipe.algorithm, Algorithm::Ppo(_));
        recipe.optimizer.anneal_lr.get_or_insert(anneal_by_default);
        recipe.eval.temperature.get_or_insert(recipe.sampler.temperature);
        let loaded = LoadedRecipe {
            recipe,
            path: path.to_path_buf(),
            composed,
        };
        loaded.validate()?;
        Ok(loaded)
    }

    /// The resolved recipe as TOML, with only the keys its algorithm reads (what `recipe show`
    /// prints and run directories keep).
    pub fn to_toml(&self) -> String {
        // Through text, so `f32` values print as written (`0.2`, not `0.20000000298023224`).
        let text = toml::to_string_pretty(&self.recipe).map_err(|e| e.to_string());
        let mut table: toml::Table = match text.and_then(|t| t.parse().map_err(|e: toml::de::Error| e.to_string())) {
            Ok(table) => table,
            Err(e) => return format!("# cannot render: {e}"),
        };
        uses::keep_used(&mut table, &self.recipe.algorithm);
        toml::to_string_pretty(&table).unwrap_or_else(|e| format!("# cannot render: {e}"))
    }

    /// The run's name.
    pub fn name(&self) -> &str {
        self.recipe.name.as_deref().unwrap_or("run")
    }

    /// What a run of this recipe can promise about reproducing itself: a line for `report.md`.
    /// A run is bit-identical for the same seed on any x86-64 CPU unless one of its settings
    /// lets something outside the run decide a number; each such setting is named.
    pub fn reproducibility(&self) -> String {
        let causes = self.unreproducible_settings();
        if causes.is_empty() {
            "Reproducible: the same seed gives the same metrics and files on any x86-64 CPU \
             (timings aside); plugins saw virtual clocks and completions came from the \
             in-process sampler, synchronously."
                .to_string()
        } else {
            format!(
                "**Not reproducible**: runs of the same seed may differ because {}.",
                causes.join("; and because ")
            )
        }
    }

    /// Each setting of this recipe that makes a run depend on more than its seed, with why.
    pub fn unreproducible_settings(&self) -> Vec<String> {
        let r = &self.recipe;
        let env = r.env.iter().map(|e| (&e.plugin, &e.limits));
        let rewards = r.reward.iter().filter_map(|r| Some((r.plugin.as_ref()?, &r.limits)));
        let agent = self.agent_plugins().map(|(_, entry)| (&entry.plugin, &entry.limits));
        let clocked: Vec<String> = env
            .chain(rewards)
            .chain(agent)
            .filter(|(_, limits)| limits.real_clock)
            .map(|(plugin, _)| format!("`{plugin}`"))
            .collect();
        let mut causes = Vec::new();
        if r.device == Device::Cuda {
            causes.push(
                "it runs on a GPU (`device = \"cuda\"`), whose kernels are not bit-identical from run to run"
                    .to_string(),
            );
        }
        if r.train.devices >= 3 {
            causes.push(format!(
                "its batches are split across {} devices (`train.devices`), whose gradients \
                 burn-collective sums in an order that varies from run to run",
                r.train.devices
            ));
        }
        if !clocked.is_empty() {
            causes.push(format!(
                "{} read the real clock (`real_clock = true`), so rewards or observations may differ",
                clocked.join(", ")
            ));
        }
        let max_staleness = match &r.algorithm {
            Algorithm::Grpo(grpo) => Some(grpo.max_staleness),
            Algorithm::LmPpo(ppo) => Some(ppo.max_staleness),
            _ => None,
        };
        if let Some(max_staleness) = max_staleness {
            if r.sampler.backend == rein_core::SamplerBackend::Http {
                causes.push(
                    "completions come from inference servers (`sampler.backend = \"http\"`), \
                     whose sampling and batching are not deterministic by default"
                        .to_string(),
                );
            }
            if max_staleness > 0 {
                causes.push(format!(
                    "rollouts run ahead of training (`algorithm.max_staleness = {max_staleness}`): which policy \
                     version samples each step depends on timing"
                ));
            }
        }
        causes
    }

    fn invalid(&self, path: &str, message: impl Into<String>) -> RecipeError {
        RecipeError::Invalid {
            file: self.composed.origin(path),
            path: path.into(),
            message: message.into(),
        }
    }

    /// The recipe's algorithm with the sections it requires ([`Plan`]). Loading checked them;
    /// this fails only for a recipe changed after loading.
    pub fn plan(&self) -> Result<Plan<'_>, RecipeError> {
        Plan::of(&self.recipe).map_err(|b| self.invalid(&b.key, b.message))
    }

    /// Checks what the schema alone cannot: the algorithm's rules ([`Plan`]), then those every
    /// recipe follows.
    fn validate(&self) -> Result<(), RecipeError> {
        let checked = Plan::of(&self.recipe).and_then(|plan| plan.check());
        checked.map_err(|b| self.invalid(&b.key, b.message))?;
        self.validate_sampling()?;
        self.validate_common()
    }

    /// `model.dtype` and `train.precision` agree, and a bf16 model is not asked to read the
    /// quantised codes of a GGUF file (whose exact products are `f32`).
    fn validate_precision(&self) -> Result<(), RecipeError> {
        use rein_core::{ModelDtype, SamplerPrecision, TrainPrecision};
        let r = &self.recipe;
        match (r.model.dtype, r.train.precision) {
            (Some(ModelDtype::Bf16), Some(TrainPrecision::F32)) => {
                return Err(self.invalid(
                    "train.precision",
                    "a bf16 model (`model.dtype = \"bf16\"`) trains in mixed precision, \
                     `f32` master weights and optimiser state with bf16 products \
                     (`train.precision = \"mixed\"`); rein does not update weights held in bf16",
                ));
            }
            (Some(ModelDtype::F32), Some(TrainPrecision::Mixed)) => {
                return Err(self.invalid(
                    "train.precision",
                    "mixed precision multiplies in bf16, and `model.dtype = \"f32\"` asks for \
                     f32 products: set `model.dtype = \"bf16\"` or leave it out",
                ));
            }
            _ => {}
        }
        if r.model_dtype() == ModelDtype::Bf16 && r.sampler.precision == SamplerPrecision::Q8 {
            return Err(self.invalid(
                "sampler.precision",
                "q8 multiplies by a GGUF file's quantised codes, which a bf16 model \
                 (`model.dtype`, `train.precision`) does not read: its products are its \
                 weights rounded to bf16",
            ));
        }
        Ok(())
    }

    /// Training, model and optimiser settings, and every plugin's limits.
    fn validate_common(&self) -> Result<(), RecipeError> {
        let r = &self.recipe;
        if r.train.stall_timeout_s <= 0.0 || r.train.stall_timeout_s.is_nan() {
            return Err(self.invalid(
                "train.stall_timeout_s",
                format!("must be positive, got {}", r.train.stall_timeout_s),
            ));
        }
        if r.train.devices == 0 {
            return Err(self.invalid("train.devices", "must be at least 1"));
        }
        if r.train.devices > 1 {
            let refused = match &r.algorithm {
                Algorithm::Sft(_) => None,
                Algorithm::Grpo(_) if r.teacher.as_ref().is_some_and(|t| t.kl == TeacherKl::Full) => {
                    Some("the full reverse KL to a teacher (`teacher.kl = \"full\"`) trains on one device")
                }
                Algorithm::Grpo(grpo) if grpo.top_entropy_quantile < 1.0 => Some(
                    "the top-entropy token mask (`algorithm.top_entropy_quantile` below 1) takes its \
                     quantile over the whole batch, on one device",
                ),
                Algorithm::Grpo(_) => None,
                _ => Some("this algorithm trains on one device"),
            };
            if let Some(why) = refused {
                return Err(self.invalid(
                    "train.devices",
                    format!(
                        "data parallelism ({} devices) splits the batches of SFT and the GRPO family \
                         (`algorithm.name = \"sft\"` or `\"grpo\"`); {why}",
                        r.train.devices
                    ),
                ));
            }
        }
        self.validate_precision()?;
        if !r.train.log.contains(&LogFormat::Jsonl) {
            return Err(self.invalid(
                "train.log",
                "must include \"jsonl\": metrics.jsonl is how a run resumes and is drawn \
                 (add \"tensorboard\" for TensorBoard's event files too)",
            ));
        }
        if r.model.hidden.contains(&0) {
            return Err(self.invalid("model.hidden", "layer widths must be at least 1"));
        }
        let opt = &r.optimizer;
        if opt.lr <= 0.0 || opt.lr.is_nan() {
            return Err(self.invalid("optimizer.lr", format!("must be positive, got {}", opt.lr)));
        }
        if opt.max_grad_norm <= 0.0 || opt.max_grad_norm.is_nan() {
            return Err(self.invalid(
                "optimizer.max_grad_norm",
                format!("must be positive, got {}", opt.max_grad_norm),
            ));
        }
        for (key, value) in [("optimizer.beta1", opt.beta1), ("optimizer.beta2", opt.beta2)] {
            if !(0.0..1.0).contains(&value) {
                return Err(self.invalid(key, format!("must be in [0, 1), got {value}")));
            }
        }
        if r.train.return_window == 0 {
            return Err(self.invalid("train.return_window", "must be at least 1"));
        }
        for (i, entry) in r.reward.iter().enumerate() {
            self.validate_reward(i, entry)?;
        }
        if let Some(c) = &r.curriculum
            && c.kind == CurriculumKind::Pools
            && !r.judges_answers()
        {
            return Err(self.invalid(
                "curriculum.kind",
                "difficulty pools sort prompts by the pass rate eval.accuracy_reward judges: add a [[reward]] \
                 with a plugin or a model (a `signal` judges no answer), or use kind = \"ucb\"",
            ));
        }
        for (key, entry) in self.agent_plugins() {
            entry
                .limits
                .validate()
                .map_err(|e| self.invalid(&format!("{key}.limits.{}", e.key), e.reason))?;
        }
        if let Some(sft) = r.sft.as_ref().or(match &r.algorithm {
            Algorithm::Sft(s) => Some(s),
            _ => None,
        }) {
            if sft.batch_size == 0 || sft.lr <= 0.0 {
                return Err(self.invalid("sft.batch_size", "batch_size must be at least 1 and lr positive"));
            }
            if sft.batch_size > MAX_BATCH_SIZE {
                let got = sft.batch_size;
                return Err(self.invalid("sft.batch_size", format!("must be at most {MAX_BATCH_SIZE}, got {got}")));
            }
        }
        Ok(())
    }

    /// The sampler's and evaluation's values are in range.
    fn validate_sampling(&self) -> Result<(), RecipeError> {
        let (sampler, eval) = (&self.recipe.sampler, &self.recipe.eval);
        let temperatures = [
            ("sampler.temperature", Some(sampler.temperature)),
            ("eval.temperature", eval.temperature),
        ];
        for (key, value) in temperatures {
            if let Some(t) = value
                && !(t >= 0.0 && t.is_finite())
            {
                return Err(self.invalid(key, format!("must be ≥ 0 (0 is greedy), got {t}")));
            }
        }
        if let Some(p) = sampler.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(self.invalid("sampler.top_p", format!("must be in (0, 1], got {p}")));
        }
        if let Some(p) = sampler.min_p
            && !(0.0..1.0).contains(&p)
        {
            return Err(self.invalid("sampler.min_p", format!("must be in [0, 1), got {p}")));
        }
        if sampler.top_k == Some(0) {
            return Err(self.invalid("sampler.top_k", "must be at least 1 (leave it out for no top-k)"));
        }
        if sampler.max_new_tokens == 0 {
            return Err(self.invalid("sampler.max_new_tokens", "must be at least 1"));
        }
        Ok(())
    }

    /// A path from the recipe, relative to the recipe file's directory.
    pub fn resolve(&self, path: &str) -> PathBuf {
        let path = Path::new(path);
        if path.is_absolute() {
            return path.to_path_buf();
        }
        self.path.parent().unwrap_or(Path::new(".")).join(path)
    }

    /// Resolves a plugin name at `key` to a `.wasm` file in `plugin_dir` (or as given, for a path).
    pub fn plugin_path(&self, name: &str, key: &str, plugin_dir: &Path) -> Result<PathBuf, RecipeError> {
        resolve_plugin(name, plugin_dir).ok_or_else(|| RecipeError::UnknownPlugin {
            file: self.composed.origin(key),
            path: key.into(),
            name: name.into(),
            dir: plugin_dir.to_path_buf(),
            available: available_plugins(plugin_dir),
        })
    }

    /// Resolves the env plugin name to a `.wasm` file in `plugin_dir` (or as given, for a path).
    pub fn env_plugin_path(&self, plugin_dir: &Path) -> Result<PathBuf, RecipeError> {
        let env = self
            .recipe
            .env
            .as_ref()
            .ok_or_else(|| self.invalid("env", "no [env] section"))?;
        self.plugin_path(&env.plugin, "env.plugin", plugin_dir)
    }

    /// The tool plugins and the text environment, each with its recipe key (`tool[0]`,
    /// `agent.env`).
    pub fn agent_plugins(&self) -> impl Iterator<Item = (String, &PluginEntry)> {
        let tools = (self.recipe.tool.iter().enumerate()).map(|(i, t)| (format!("tool[{i}]"), t));
        let env = (self.recipe.agent.iter()).filter_map(|a| a.env.as_ref().map(|e| ("agent.env".to_string(), e)));
        tools.chain(env)
    }

    /// Where a language-model recipe's weights and tokenizer come from (see [`ModelSource`]):
    /// what `rein run` opens first, and `rein recipe check` checks.
    pub fn model_source(&self) -> Result<ModelSource<'_>, RecipeError> {
        model_source::model_source(&self.recipe.model).map_err(|b| self.invalid(&b.key, b.message))
    }

    /// Every check `rein run` makes before its first step without opening a file other than
    /// the recipe's: the schema and the algorithm's rules (which loading ran), the plugins'
    /// files in `plugin_dir`, and for a language model where its weights and tokenizer come
    /// from. `rein recipe check` runs it.
    pub fn check(&self, plugin_dir: &Path) -> Result<(), RecipeError> {
        self.check_plugins(plugin_dir)?;
        if self.plan()?.data().is_some() {
            self.model_source()?;
        }
        Ok(())
    }

    /// Checks that every plugin the recipe names exists in `plugin_dir`.
    pub fn check_plugins(&self, plugin_dir: &Path) -> Result<(), RecipeError> {
        if self.recipe.env.is_some() {
            self.env_plugin_path(plugin_dir)?;
        }
        for (i, entry) in self.recipe.reward.iter().enumerate() {
            if let Some(plugin) = &entry.plugin {
                self.plugin_path(plugin, &format!("reward[{i}].plugin"), plugin_dir)?;
            }
        }
        for (key, entry) in self.agent_plugins() {
            self.plugin_path(&entry.plugin, &format!("{key}.plugin"), plugin_dir)?;
        }
        Ok(())
    }
}

/// `name` → `<dir>/<name>.wasm`; a name ending in `.wasm` is a path.
fn resolve_plugin(name: &str, dir: &Path) -> Option<PathBuf> {
    let path = if name.ends_with(".wasm") {
        PathBuf::from(name)
    } else {
        dir.join(format!("{name}.wasm"))
    };
    path.is_file().then_some(path)
}

fn available_plugins(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".wasm").map(String::from))
        .collect();
    names.sort();
    names
}

fn deserialize(composed: &Composed) -> Result<Recipe, RecipeError> {
    let value = toml::Value::Table(with_lm_ppo_tag(composed.table.clone()));
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let message = e.inner().to_string();
        match parse_unknown_field(&message) {
            Some((field, expected)) => {
                // serde_path_to_error's path ends at the unknown field, except inside tagged enums.
                let full = if path == "." || path.is_empty() {
                    field.clone()
                } else if path == field || path.ends_with(&format!(".{field}")) {
                    path.clone()
                } else {
                    format!("{path}.{field}")
                };
                let full = full.trim_start_matches('.').to_string();
                RecipeError::UnknownKey {
                    file: composed.origin(&full),
                    suggestion: renamed(&full).or_else(|| nearest(&field, &expected)),
                    path: full,
                }
            }
            None => {
                let path = if path == "." { String::new() } else { path };
                // Inside the internally tagged `[algorithm]` serde loses the path: find the key
                // by reading the section as its own type.
                let (path, message) = match path.as_str() {
                    "algorithm" => algorithm_error(composed).unwrap_or((path, message)),
                    _ => (path, message),
                };
                let message = message.lines().next().unwrap_or_default().to_string();
                RecipeError::Invalid {
                    file: composed.origin(&path),
                    path,
                    message,
                }
            }
        }
    })
}

/// `algorithm.name = "ppo"` means PPO on a language model when the recipe has prompts
/// (`[data]`) and no `[env]`: the table gets the internal tag of [`Algorithm::LmPpo`], which
/// serialises back as `"ppo"`.
fn with_lm_ppo_tag(mut table: toml::Table) -> toml::Table {
    let on_prompts = table.contains_key("data") && !table.contains_key("env");
    if let Some(algorithm) = table.get_mut("algorithm").and_then(toml::Value::as_table_mut)
        && on_prompts
        && algorithm.get("name").and_then(toml::Value::as_str) == Some("ppo")
    {
        algorithm.insert("name".into(), LM_PPO_TAG.into());
    }
    table
}

/// The key and message of a type error inside `[algorithm]`, found by deserialising the section
/// as the type its `name` selects.
fn algorithm_error(composed: &Composed) -> Option<(String, String)> {
    let table = with_lm_ppo_tag(composed.table.clone());
    let mut section = table.get("algorithm")?.as_table()?.clone();
    let name = section.remove("name")?;
    let value = toml::Value::Table(section);
    let error = match name.as_str()? {
        "ppo" => serde_path_to_error::deserialize::<_, PpoSection>(value).err()?,
        LM_PPO_TAG => serde_path_to_error::deserialize::<_, LmPpoSection>(value).err()?,
        "grpo" => serde_path_to_error::deserialize::<_, GrpoSection>(value).err()?,
        "sft" => serde_path_to_error::deserialize::<_, SftSection>(value).err()?,
        "dpo" => serde_path_to_error::deserialize::<_, DpoSection>(value).err()?,
        "kto" => serde_path_to_error::deserialize::<_, KtoSection>(value).err()?,
        "reward-model" => serde_path_to_error::deserialize::<_, RewardModelSection>(value).err()?,
        "prm" => serde_path_to_error::deserialize::<_, ProcessRewardModelSection>(value).err()?,
        "online-dpo" => serde_path_to_error::deserialize::<_, OnlineDpoSection>(value).err()?,
        _ => return None,
    };
    Some((format!("algorithm.{}", error.path()), error.inner().to_string()))
}

/// Parses serde's "unknown field `x`, expected one of `a`, `b`" (or "expected `a` or `b`",
/// "there are no fields") into the field and the valid names. Also handles unknown variants
/// (an unknown `algorithm.name`).
fn parse_unknown_field(message: &str) -> Option<(String, Vec<String>)> {
    let rest = message.strip_prefix("unknown field `")?;
    let (field, rest) = rest.split_once('`')?;
    let expected = (rest.split('`').skip(1).step_by(2))
        .filter(|name| *name != LM_PPO_TAG)
        .map(String::from)
        .collect();
    Some((field.to_string(), expected))
}

/// The new name of a key that was renamed.
fn renamed(key: &str) -> Option<String> {
    const RENAMED: [(&str, &str); 1] = [("model.checkpoint", "path")];
    RENAMED
        .iter()
        .find(|(old, _)| *old == key)
        .map(|(_, new)| new.to_string())
}

/// The candidate closest to `word` by edit distance, if close enough to be a likely typo.
fn nearest(word: &str, candidates: &[String]) -> Option<String> {
    candidates
        .iter()
        .map(|c| (strsim::levenshtein(word, c), c))
        .filter(|(d, c)| *d <= (c.len().max(word.len()) / 2).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_field_messages_are_parsed() {
        let (field, expected) =
            parse_unknown_field("unknown field `clip_hgh`, expected one of `clip_coef`, `gamma`").unwrap();
        assert_eq!(field, "clip_hgh");
        assert_eq!(expected, vec!["clip_coef", "gamma"]);
        assert_eq!(
            parse_unknown_field("unknown field `x`, there are no fields").unwrap().1,
            Vec::<String>::new()
        );
        assert!(parse_unknown_field("invalid type").is_none());
    }

    #[test]
    fn the_nearest_key_is_suggested_only_when_close() {
        let keys: Vec<String> = ["clip_coef", "clip_vloss", "gamma", "gae_lambda"]
            .map(String::from)
            .to_vec();
        assert_eq!(nearest("clip_cof", &keys).as_deref(), Some("clip_coef"));
        assert_eq!(nearest("gama", &keys).as_deref(), Some("gamma"));
        assert_eq!(nearest("learning_rate", &keys), None);
    }

    #[test]
    fn each_setting_that_breaks_reproducibility_is_named_in_the_report_line() {
        let grpo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes/grpo-arithmetic.toml");
        let line = |overrides: &[&str]| {
            let overrides: Vec<String> = overrides.iter().map(|o| o.to_string()).collect();
            LoadedRecipe::load(&grpo, &overrides).unwrap().reproducibility()
        };
        assert!(line(&[]).starts_with("Reproducible"), "{}", line(&[]));
        let http = line(&["sampler.backend=\"http\"", "sampler.urls=[\"http://127.0.0.1:30000\"]"]);
        assert!(
            http.starts_with("**Not reproducible**") && http.contains("sampler.backend = \"http\""),
            "{http}"
        );
        let ahead = line(&["algorithm.max_staleness=1"]);
        assert!(
            ahead.starts_with("**Not reproducible**") && ahead.contains("max_staleness = 1"),
            "{ahead}"
        );
        let all = line(&[
            "algorithm.max_staleness=2",
            "sampler.backend=\"http\"",
            "sampler.urls=[\"http://127.0.0.1:30000\"]",
            "reward.0.limits.real_clock=true",
        ]);
        for named in ["max_staleness = 2", "sampler.backend", "real_clock = true"] {
            assert!(all.contains(named), "{named} missing from: {all}");
        }
        let gpu = line(&["device=\"cuda\""]);
        assert!(
            gpu.starts_with("**Not reproducible**") && gpu.contains("device = \"cuda\""),
            "{gpu}"
        );
    }

    #[test]
    fn a_plugin_given_the_real_clock_makes_the_run_not_reproducible() {
        let recipes = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes");
        let ppo = recipes.join("ppo-cartpole.toml");
        let virtual_clocks = LoadedRecipe::load(&ppo, &[]).unwrap();
        assert!(virtual_clocks.reproducibility().starts_with("Reproducible"));
        let real = LoadedRecipe::load(&ppo, &["env.limits.real_clock=true".into()]).unwrap();
        let line = real.reproducibility();
        assert!(
            line.contains("Not reproducible") && line.contains("`cartpole`"),
            "{line}"
        );
        assert_eq!(real.unreproducible_settings().len(), 1);

        let grpo = recipes.join("grpo-arithmetic.toml");
        let reward = LoadedRecipe::load(&grpo, &["reward.1.limits.real_clock=true".into()]);
        let line = reward.map(|r| r.reproducibility());
        assert!(matches!(&line, Ok(l) if l.contains("`format-tags`")), "{line:?}");
        let out_of_range = LoadedRecipe::load(&grpo, &["reward.2.weight=1".into()]).unwrap_err();
        let message = out_of_range.to_string();
        assert!(message.contains("`reward` is a list of 2 tables"), "{message}");
    }
}
