//! Language-model training end to end on tiny models, one module per family: the GRPO family
//! ([`grpo`]), rewards in a run ([`rewards`]), multi-turn recipes ([`multi_turn`]), learning
//! from preferences ([`preferences`]), process reward models trained on step labels
//! ([`process_reward`]), a vision-language model on rows with images ([`vision`]) and in episodes
//! that show it images ([`vision_episodes`]).

#[path = "../common/mod.rs"]
mod common;

mod grpo;
mod multi_turn;
mod preferences;
mod process_reward;
mod rewards;
mod vision;
mod vision_episodes;

use std::path::Path;

use common::{plugin_dir, root, stage_records};

use rein_posttrain::{Fields, read};
use rein_recipe::LoadedRecipe;
use rein_train::{RunOutcome, TrainError};

/// The default recipe, shrunk to seconds.
fn tiny_default(runs: &Path, extra: &[&str]) -> LoadedRecipe {
    let mut overrides: Vec<String> = [
        "data.task.train=400",
        "data.task.test=8",
        "sft.steps=12",
        "sft.batch_size=8",
        "algorithm.steps=2",
        "algorithm.prompts_per_step=2",
        "sampler.n=4",
        "sampler.max_new_tokens=12",
        "eval.k=2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    overrides.push(format!("train.runs_dir={:?}", runs.display().to_string()));
    overrides.extend(extra.iter().map(|s| s.to_string()));
    LoadedRecipe::load(&root().join("recipes/grpo-arithmetic.toml"), &overrides).unwrap()
}
