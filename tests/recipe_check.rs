//! `rein recipe check` refuses every recipe `rein run` would refuse before its first step
//! without opening a model, naming the same key with the same message; the shipped recipes pass
//! it with the built plugins. (Recipe loading and its errors are rein-recipe's own tests.)

#[path = "common/mod.rs"]
mod common;

use rein_recipe::{LoadedRecipe, RecipeError};

/// A recipe on the tiny from-scratch Qwen2 of the main job, which `rein run` could train.
fn grpo_with(data: &str, model: &str) -> String {
    format!(
        "[algorithm]\nname = \"grpo\"\nsteps = 1\nprompts_per_step = 1\n[sampler]\nn = 2\n\
         max_new_tokens = 4\n{data}\n{model}\n[[reward]]\nplugin = \"math-answer\"\n"
    )
}

const TASK: &str = "[data]\ntask = { max_operand = 9, train = 10, test = 5 }";

fn tiny_model() -> String {
    let tokenizer = common::root().join("recipes/assets/arithmetic-tokenizer");
    format!(
        "[model]\ntokenizer = {:?}\n[model.architecture]\nmodel_type = \"qwen2\"\nvocab_size = 512\n\
         hidden_size = 16\nintermediate_size = 32\nnum_hidden_layers = 1\nnum_attention_heads = 2\n\
         num_key_value_heads = 1\nmax_position_embeddings = 64\n",
        tokenizer.display().to_string()
    )
}

#[test]
fn recipe_check_raises_what_run_raises_before_its_first_step() {
    let plugin_dir = common::plugin_path("math-answer").parent().unwrap().to_path_buf();
    let architecture_alone = tiny_model().replace("[model]\ntokenizer", "[model]\n# tokenizer");
    let cases: Vec<(&str, String, &[&str], &str)> = vec![
        (
            "operands",
            grpo_with(TASK, &tiny_model()),
            &["data.task.min_operand=50", "data.task.max_operand=10"],
            "data.task.min_operand",
        ),
        (
            "operator",
            grpo_with(TASK, &tiny_model()),
            &["data.task.ops=[\"/\"]"],
            "data.task.ops",
        ),
        (
            "problems",
            grpo_with(TASK, &tiny_model()),
            &["data.task.train=1000"],
            "data.task.train",
        ),
        (
            "no prompts",
            grpo_with("[data]\nsystem_prompt = \"Be brief.\"", &tiny_model()),
            &[],
            "data",
        ),
        (
            "pairs",
            TASK.replace("train = 10", "train = 10, solution = \"answer\"")
                + "\n[algorithm]\nname = \"dpo\"\n"
                + &tiny_model(),
            &[],
            "data.task",
        ),
        (
            "shapes colour",
            grpo_with("[data]\nshapes_task = { train = 10, test = 5 }", &tiny_model()),
            &["data.shapes_task.colors=[\"purple\"]"],
            "data.shapes_task.colors",
        ),
        (
            "two generated tasks",
            grpo_with(&format!("{TASK}\nshapes_task = {{ train = 10 }}"), &tiny_model()),
            &[],
            "data.shapes_task",
        ),
        (
            "no weights",
            grpo_with(TASK, "[model]\ntokenizer = \"tok\""),
            &[],
            "model",
        ),
        (
            "no tokenizer",
            grpo_with(TASK, &architecture_alone),
            &[],
            "model.tokenizer",
        ),
        (
            "no plugin",
            grpo_with(TASK, &tiny_model()).replace("\"math-answer\"", "\"no-such-plugin\""),
            &[],
            "reward[0].plugin",
        ),
    ];
    let dir = common::scratch("recipe-check");
    let file = dir.join("run.toml");
    let runs = format!("train.runs_dir={:?}", dir.join("runs").display().to_string());
    for (name, text, overrides, key) in cases {
        std::fs::write(&file, text).unwrap();
        let overrides: Vec<String> = overrides
            .iter()
            .copied()
            .chain([runs.as_str()])
            .map(String::from)
            .collect();
        let load = || LoadedRecipe::load(&file, &overrides);
        let checked = load().and_then(|loaded| loaded.check(&plugin_dir));
        let Err(error) = checked else {
            panic!("{name}: recipe check accepted it")
        };
        let named = match &error {
            RecipeError::Invalid { path, .. } | RecipeError::UnknownPlugin { path, .. } => path.as_str(),
            other => panic!("{name}: {other}"),
        };
        assert_eq!(named, key, "{name}: {error}");
        // Where loading accepts the recipe, `rein run` stops with the same error, before any
        // step (none of these recipes writes a metric).
        if let Ok(loaded) = load() {
            let ran = rein_train::run(&loaded, &plugin_dir, false).map(|_| ()).unwrap_err();
            assert_eq!(ran.to_string(), error.to_string(), "{name}");
        }
    }
}

#[test]
fn the_shipped_recipes_are_valid() {
    let root = common::root();
    let plugin_dir = common::plugin_path("cartpole").parent().unwrap().to_path_buf();
    let mut checked = 0;
    for entry in std::fs::read_dir(root.join("recipes")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let loaded = LoadedRecipe::load(&path, &[]).unwrap_or_else(|e| panic!("{e}"));
            loaded.check(&plugin_dir).unwrap_or_else(|e| panic!("{e}"));
            checked += 1;
        }
    }
    assert!(checked >= 17, "{checked} recipes");
}
