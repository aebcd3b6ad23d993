//! Recipes: composition and every recipe error, each naming the file, the key path, and what
//! would fix it.
//!
//! - `composition`: fragments, overrides, unknown keys and types, files, plugins, the shipped
//!   recipes;
//! - `classic_control`: PPO, SAC and TD3 keys;
//! - `language_models`: the GRPO family's, DPO's, PPO-with-a-critic's, rewards', judges',
//!   teachers' and curricula's keys;
//!
//! What `rein recipe check` refuses against what `rein run` raises, and the shipped recipes
//! against the built plugins, need a run and the plugins: they are the workspace tests'
//! `recipe_check`.

mod classic_control;
mod composition;
mod language_models;
mod rewards;
mod tree_rollouts;

use std::path::{Path, PathBuf};

use rein_recipe::{Algorithm, LoadedRecipe, RecipeError};

/// The repository's root (where `recipes/` is).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A fresh directory of recipe files.
fn recipes(files: &[(&str, &str)]) -> PathBuf {
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("recipes-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

const BASE: &str = r#"
[algorithm]
name = "ppo"
gamma = 0.9
num_steps = 64
[env]
plugin = "cartpole"
num_envs = 4
[model]
hidden = [32, 32]
"#;

fn load(dir: &Path, file: &str, overrides: &[&str]) -> Result<LoadedRecipe, RecipeError> {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    LoadedRecipe::load(&dir.join(file), &overrides)
}

/// Loading `file` with `overrides` is refused as invalid, naming `key` with a message that says
/// `says`.
fn assert_refused(dir: &Path, file: &str, overrides: &[&str], key: &str, says: &str) {
    let err = load(dir, file, overrides).unwrap_err();
    assert!(
        matches!(&err, RecipeError::Invalid { path, message, .. } if path == key && message.contains(says)),
        "{overrides:?}: {err}"
    );
}

fn ppo(loaded: &LoadedRecipe) -> &rein_recipe::PpoSection {
    let Algorithm::Ppo(ppo) = &loaded.recipe.algorithm else {
        panic!("a PPO recipe")
    };
    ppo
}

const GRPO: &str = r#"
[algorithm]
name = "grpo"
[data]
task = { max_operand = 9, train = 10, test = 5 }
[model]
tokenizer = "tok"
[[reward]]
plugin = "math-answer"
"#;

const DPO: &str = r#"
[algorithm]
name = "dpo"
[data]
task = { max_operand = 9, train = 10, test = 5 }
[model]
tokenizer = "tok"
"#;
