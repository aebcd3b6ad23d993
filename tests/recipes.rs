//! Recipe composition and every recipe error: each names the file, the key path, and what
//! would fix it.

#[path = "common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};

use rein_recipe::{Algorithm, LoadedRecipe, RecipeError};

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

fn ppo(loaded: &LoadedRecipe) -> &rein_recipe::PpoSection {
    let Algorithm::Ppo(ppo) = &loaded.recipe.algorithm else {
        panic!("a PPO recipe")
    };
    ppo
}

#[test]
fn extends_deep_merges_in_order_then_overrides_apply() {
    let dir = recipes(&[
        ("fragments/base.toml", BASE),
        (
            "fragments/wide.toml",
            "[model]\nhidden = [128, 128]\nactivation = \"relu\"\n[algorithm]\ngamma = 0.95",
        ),
        (
            "run.toml",
            "extends = [\"fragments/base.toml\", \"fragments/wide.toml\"]\nseed = 7\n[algorithm]\nnum_steps = 16",
        ),
    ]);
    let loaded = load(&dir, "run.toml", &[]).unwrap();
    let r = &loaded.recipe;
    assert_eq!(r.seed, 7);
    assert_eq!(r.name.as_deref(), Some("run"));
    assert_eq!(r.model.hidden, vec![128, 128], "the later fragment wins");
    assert_eq!(r.model.activation, rein_model::Activation::Relu);
    assert_eq!(ppo(&loaded).gamma, 0.95);
    assert_eq!(ppo(&loaded).num_steps, 16, "the recipe itself wins over its fragments");
    assert_eq!(r.env.as_ref().unwrap().num_envs, 4, "untouched keys survive");
    assert_eq!(ppo(&loaded).clip_coef, 0.2, "unset keys take their defaults");

    let loaded = load(
        &dir,
        "run.toml",
        &["algorithm.gamma=0.5", "model.hidden=[8]", "env.plugin=pendulum"],
    )
    .unwrap();
    assert_eq!(ppo(&loaded).gamma, 0.5);
    assert_eq!(loaded.recipe.model.hidden, vec![8]);
    assert_eq!(loaded.recipe.env.as_ref().unwrap().plugin, "pendulum");
}

#[test]
fn the_resolved_recipe_round_trips_through_show() {
    let dir = recipes(&[
        ("base.toml", BASE),
        (
            "run.toml",
            "extends = [\"base.toml\"]\n[env.config]\nmax_episode_steps = 100",
        ),
    ]);
    let loaded = load(&dir, "run.toml", &["algorithm.ent_coef=0.02"]).unwrap();
    let shown = loaded.to_toml();
    assert!(shown.contains("ent_coef = 0.02"), "{shown}");
    assert!(!shown.contains("extends"), "show prints the merged result: {shown}");
    let again = recipes(&[("shown.toml", &shown)]);
    assert_eq!(load(&again, "shown.toml", &[]).unwrap().recipe, loaded.recipe);
}

#[test]
fn an_unknown_key_names_its_file_and_the_nearest_key() {
    let dir = recipes(&[
        ("base.toml", BASE),
        ("run.toml", "extends = [\"base.toml\"]\n[algorithm]\nclip_cof = 0.3"),
    ]);
    let err = load(&dir, "run.toml", &[]).unwrap_err();
    assert_eq!(
        err,
        RecipeError::UnknownKey {
            file: dir.join("run.toml"),
            path: "algorithm.clip_cof".into(),
            suggestion: Some("clip_coef".into())
        }
    );
    assert!(
        err.to_string()
            .ends_with("run.toml: unknown key `algorithm.clip_cof` (did you mean `clip_coef`?)"),
        "{err}"
    );
    // In a fragment, the fragment is named; from --set, --set is.
    let dir = recipes(&[
        ("base.toml", &format!("{BASE}\n[train]\ntotal_step = 5")),
        ("run.toml", "extends = [\"base.toml\"]"),
    ]);
    let err = load(&dir, "run.toml", &[]).unwrap_err();
    assert_eq!(
        err,
        RecipeError::UnknownKey {
            file: dir.join("base.toml"),
            path: "train.total_step".into(),
            suggestion: Some("total_steps".into())
        }
    );
    let dir = recipes(&[("run.toml", BASE)]);
    let err = load(&dir, "run.toml", &["optimizer.learning_rate=0.1"]).unwrap_err();
    assert!(
        matches!(&err, RecipeError::UnknownKey { file, path, .. } if file == Path::new("--set") && path == "optimizer.learning_rate"),
        "{err}"
    );
    let err = load(&dir, "run.toml", &["top_level_typo=1"]).unwrap_err();
    assert!(
        matches!(&err, RecipeError::UnknownKey { path, .. } if path == "top_level_typo"),
        "{err}"
    );
    // A renamed key names its new name.
    let err = load(&dir, "run.toml", &["model.checkpoint=\"m\""]).unwrap_err();
    assert!(
        err.to_string()
            .ends_with("unknown key `model.checkpoint` (did you mean `path`?)"),
        "{err}"
    );
}

#[test]
fn a_wrong_type_names_the_key() {
    let dir = recipes(&[("run.toml", &BASE.replace("num_envs = 4", "num_envs = \"four\""))]);
    let err = load(&dir, "run.toml", &[]).unwrap_err();
    let RecipeError::Invalid { file, path, message } = &err else {
        panic!("{err}")
    };
    assert_eq!(
        (file.as_path(), path.as_str()),
        (dir.join("run.toml").as_path(), "env.num_envs")
    );
    assert!(message.contains("invalid type: string \"four\""), "{message}");
    let err = load(&dir, "run.toml", &["env.num_envs=2", "algorithm.gamma=\"high\""]).unwrap_err();
    let RecipeError::Invalid { file, path, message } = &err else {
        panic!("{err}")
    };
    assert_eq!((file.as_path(), path.as_str()), (Path::new("--set"), "algorithm.gamma"));
    assert!(message.contains("\"high\""), "{message}");
    // A bare word is a string to TOML: the error still names `--set` and the whole key.
    let err = load(&dir, "run.toml", &["algorithm.gamma=abc"]).unwrap_err();
    assert!(err.to_string().starts_with("--set: key `algorithm.gamma`"), "{err}");
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

#[test]
fn a_key_the_algorithm_does_not_read_is_an_error() {
    let dir = recipes(&[("ppo.toml", BASE), ("grpo.toml", GRPO)]);
    for (file, set, key) in [
        ("ppo.toml", "sampler.temperature=0.5", "sampler.temperature"),
        ("ppo.toml", "optimizer.weight_decay=0.1", "optimizer.weight_decay"),
        ("ppo.toml", "model.dtype=\"bf16\"", "model.dtype"),
        ("ppo.toml", "model.tokenizer=\"tok\"", "model.tokenizer"),
        ("grpo.toml", "env.plugin=\"cartpole\"", "env.plugin"),
        ("grpo.toml", "train.total_steps=10", "train.total_steps"),
        ("grpo.toml", "model.hidden=[8]", "model.hidden"),
    ] {
        let err = load(&dir, file, &[set]).unwrap_err();
        assert!(
            matches!(&err, RecipeError::Invalid { path, file, message }
                if path == key && file == Path::new("--set") && message.contains("does not use")),
            "{file} {set}: {err}"
        );
    }
    // SFT has its own learning rate: an [optimizer] section would be ignored.
    let err = load(&dir, "grpo.toml", &["algorithm.name=\"sft\"", "optimizer.lr=0.1"]).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("--set: key `optimizer.lr`: SFT does not use [optimizer]"),
        "{err}"
    );
    // What `recipe show` prints is only what the algorithm reads, so it loads again.
    let shown = load(&dir, "grpo.toml", &[]).unwrap().to_toml();
    assert!(
        !shown.contains("[env]") && !shown.contains("hidden") && !shown.contains("total_steps"),
        "{shown}"
    );
    let again = recipes(&[("shown.toml", &shown)]);
    load(&again, "shown.toml", &[]).unwrap();
}

#[test]
fn values_out_of_range_name_the_key_and_the_range() {
    let dir = recipes(&[("grpo.toml", GRPO)]);
    for (set, key, range) in [
        ("sampler.temperature=-1", "sampler.temperature", "≥ 0"),
        ("sampler.n=1", "sampler.n", "at least 2"),
        ("sampler.top_p=1.5", "sampler.top_p", "(0, 1]"),
        ("sampler.min_p=-0.1", "sampler.min_p", "[0, 1)"),
        ("sampler.top_k=0", "sampler.top_k", "at least 1"),
        ("eval.temperature=-0.5", "eval.temperature", "≥ 0"),
        ("algorithm.kl_coef=-0.1", "algorithm.kl_coef", "≥ 0"),
        (
            "algorithm.updates_per_batch=0",
            "algorithm.updates_per_batch",
            "at least 1",
        ),
        ("optimizer.beta2=1.0", "optimizer.beta2", "[0, 1)"),
        ("optimizer.max_grad_norm=0", "optimizer.max_grad_norm", "positive"),
        ("train.stall_timeout_s=0", "train.stall_timeout_s", "positive"),
        ("train.devices=0", "train.devices", "at least 1"),
        (
            "algorithm.advantage=\"gigpo\"",
            "algorithm.advantage",
            "needs an [agent] section",
        ),
        (
            "algorithm.difficulty_weight={ low = 2.0, high = 1.0 }",
            "algorithm.difficulty_weight",
            "0 < low ≤ high",
        ),
        (
            "algorithm.difficulty_weight={ center = 1.5 }",
            "algorithm.difficulty_weight",
            "center in [0, 1] and steepness > 0 (got low 0.4, high 1.5, center 1.5, steepness 10)",
        ),
    ] {
        let err = load(&dir, "grpo.toml", &[set]).unwrap_err();
        assert!(
            matches!(&err, RecipeError::Invalid { path, file, message }
                if path == key && file == Path::new("--set") && message.contains(range)),
            "{set}: {err}"
        );
    }
    let weighted = load(&dir, "grpo.toml", &["algorithm.difficulty_weight={ steepness = 5.0 }"]).unwrap();
    let Algorithm::Grpo(grpo) = &weighted.recipe.algorithm else {
        panic!("GRPO, got {:?}", weighted.recipe.algorithm)
    };
    let w = grpo.difficulty_weight.unwrap();
    assert_eq!((w.low, w.high, w.center, w.steepness), (0.4, 1.5, 0.75, 5.0));
    // REINFORCE++ without a group baseline whitens over the batch: one completion per prompt is fine.
    load(
        &dir,
        "grpo.toml",
        &[
            "sampler.n=1",
            "algorithm.advantage=\"reinforce++\"",
            "algorithm.group_baseline=false",
        ],
    )
    .unwrap();
}

#[test]
fn inference_servers_and_asynchrony_are_checked() {
    let dir = recipes(&[("grpo.toml", GRPO)]);
    let http = "sampler.backend=\"http\"";
    let urls = "sampler.urls=[\"http://127.0.0.1:8000\"]";
    for (sets, key, says) in [
        (vec![http], "sampler.urls", "needs the servers' URLs"),
        (vec![urls], "sampler.urls", "urls are for backend = \"http\""),
        (
            vec![http, "sampler.urls=[\"https://a:1\"]"],
            "sampler.urls",
            "not an http:// URL",
        ),
        (
            vec!["algorithm.max_staleness=1", "algorithm.dynamic_sampling=true"],
            "algorithm.max_staleness",
            "dynamic sampling",
        ),
        (vec!["sampler.sync_every=2"], "sampler.sync_every", "1..=1"),
        (vec!["sampler.sync=\"adapter\""], "sampler.sync", "no [lora]"),
        (vec![http, urls, "sampler.api=\"vllm\""], "sampler.sync", "LoRA adapter"),
        (vec!["algorithm.tis_cap=0.5"], "algorithm.tis_cap", "≥ 1"),
        (
            vec!["algorithm.icepop_bounds=[1.5, 2.0]"],
            "algorithm.icepop_bounds",
            "0 < low < 1 < high",
        ),
        (vec![http, urls, "sampler.backoff_s=0"], "sampler.backoff_s", "positive"),
        (
            vec![http, urls, "sampler.precision=\"q8\""],
            "sampler.precision",
            "backend = \"native\"",
        ),
    ] {
        let err = load(&dir, "grpo.toml", &sets).unwrap_err();
        assert!(
            matches!(&err, RecipeError::Invalid { path, message, .. } if path == key && message.contains(says)),
            "{sets:?}: {err}"
        );
    }
    let loaded = load(
        &dir,
        "grpo.toml",
        &[http, urls, "algorithm.max_staleness=2", "sampler.sync_every=3"],
    )
    .unwrap();
    assert_eq!(loaded.recipe.sampler.urls, ["http://127.0.0.1:8000"]);
    let q8 = load(&dir, "grpo.toml", &["sampler.precision=\"q8\""]).unwrap();
    assert_eq!(q8.recipe.sampler.precision, rein_core::SamplerPrecision::Q8);
    let unknown = load(&dir, "grpo.toml", &["sampler.precision=\"q4\""])
        .unwrap_err()
        .to_string();
    assert!(unknown.contains("precision") && unknown.contains("q4"), "{unknown}");
}

#[test]
fn evaluation_samples_at_the_samplers_temperature_unless_told() {
    let dir = recipes(&[("grpo.toml", GRPO)]);
    let loaded = load(&dir, "grpo.toml", &["sampler.temperature=0.7"]).unwrap();
    assert_eq!(loaded.recipe.eval.temperature, Some(0.7));
    let loaded = load(&dir, "grpo.toml", &["sampler.temperature=0.7", "eval.temperature=1.0"]).unwrap();
    assert_eq!(loaded.recipe.eval.temperature, Some(1.0));
}

#[test]
fn invalid_values_are_named() {
    let dir = recipes(&[("run.toml", BASE)]);
    for (set, key) in [
        ("algorithm.num_minibatches=7", "algorithm.num_minibatches"),
        ("algorithm.gamma=1.5", "algorithm.gamma"),
        ("env.num_envs=0", "env.num_envs"),
        ("model.hidden=[64, 0]", "model.hidden"),
        ("env.limits.memory_mib=0", "env.limits.memory_mib"),
        ("optimizer.lr=-1.0", "optimizer.lr"),
    ] {
        let err = load(&dir, "run.toml", &[set]).unwrap_err();
        assert!(
            matches!(&err, RecipeError::Invalid { path, file, .. } if path == key && file == Path::new("--set")),
            "{set}: {err}"
        );
    }
    let err = load(&dir, "run.toml", &["algorithm.name=ddpg"]).unwrap_err();
    assert!(
        err.to_string()
            .contains("unknown variant `ddpg`, expected one of `ppo`, `grpo`, `sft`"),
        "{err}"
    );
}

#[test]
fn a_missing_file_names_who_extended_it() {
    let dir = recipes(&[("run.toml", "extends = [\"fragments/nope.toml\"]")]);
    let err = load(&dir, "run.toml", &[]).unwrap_err();
    let RecipeError::Missing { file, from, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(file, &dir.join("fragments/nope.toml"));
    assert_eq!(from.as_deref(), Some(dir.join("run.toml").as_path()));
    assert!(err.to_string().contains("(extended from"), "{err}");
    let err = load(&dir, "absent.toml", &[]).unwrap_err();
    assert!(matches!(err, RecipeError::Missing { from: None, .. }));
}

#[test]
fn a_syntax_error_has_line_and_column() {
    let dir = recipes(&[("run.toml", "[algorithm]\nname = \"ppo\"\ngamma = = 0.9\n")]);
    let err = load(&dir, "run.toml", &[]).unwrap_err();
    let RecipeError::Syntax { file, line, column, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!((file, *line), (&dir.join("run.toml"), 3));
    assert!(*column >= 7 && *column <= 9, "column {column}");
    assert!(err.to_string().contains("run.toml:3:"), "{err}");
}

#[test]
fn an_extends_cycle_is_reported_with_its_chain() {
    let dir = recipes(&[
        ("a.toml", "extends = [\"b.toml\"]"),
        ("b.toml", "extends = [\"c.toml\"]"),
        ("c.toml", "extends = [\"a.toml\"]"),
    ]);
    let err = load(&dir, "a.toml", &[]).unwrap_err();
    let RecipeError::Cycle { chain } = &err else {
        panic!("{err}")
    };
    let names: Vec<_> = chain
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_string())
        .collect();
    assert_eq!(names, vec!["a.toml", "b.toml", "c.toml", "a.toml"]);
    assert!(
        err.to_string().contains("a.toml → ") && err.to_string().contains("→ "),
        "{err}"
    );
    let dir = recipes(&[("self.toml", "extends = [\"self.toml\"]")]);
    assert!(matches!(
        load(&dir, "self.toml", &[]).unwrap_err(),
        RecipeError::Cycle { .. }
    ));
}

#[test]
fn an_unknown_plugin_lists_the_available_ones() {
    let dir = recipes(&[("run.toml", &BASE.replace("\"cartpole\"", "\"cartpol\""))]);
    let loaded = load(&dir, "run.toml", &[]).unwrap();
    let plugin_dir = common::plugin_path("cartpole").parent().unwrap().to_path_buf();
    let err = loaded.env_plugin_path(&plugin_dir).unwrap_err();
    let RecipeError::UnknownPlugin {
        file,
        path,
        name,
        available,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(
        (file, path.as_str(), name.as_str()),
        (&dir.join("run.toml"), "env.plugin", "cartpol")
    );
    assert!(available.contains(&"cartpole".to_string()), "{available:?}");
    let ok = load(&dir, "run.toml", &["env.plugin=cartpole"]).unwrap();
    assert_eq!(
        ok.env_plugin_path(&plugin_dir).unwrap(),
        plugin_dir.join("cartpole.wasm")
    );
}

#[test]
fn malformed_overrides_are_rejected() {
    let dir = recipes(&[("run.toml", BASE)]);
    for bad in ["no-equals", "=1", "algorithm..gamma=1", "algorithm.gamma.x=1"] {
        assert!(
            matches!(
                load(&dir, "run.toml", &[bad]).unwrap_err(),
                RecipeError::Override { .. }
            ),
            "{bad}"
        );
    }
}

#[test]
fn the_shipped_recipes_are_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let plugin_dir = common::plugin_path("cartpole").parent().unwrap().to_path_buf();
    for name in [
        "ppo-cartpole.toml",
        "ppo-pendulum.toml",
        "grpo-arithmetic.toml",
        "grpo-judge.toml",
        "distill-arithmetic.toml",
        "grpo-reward-model.toml",
        "ppo-arithmetic.toml",
        "ppo-rm-arithmetic.toml",
    ] {
        let loaded = LoadedRecipe::load(&root.join("recipes").join(name), &[]).unwrap_or_else(|e| panic!("{e}"));
        loaded.check_plugins(&plugin_dir).unwrap();
    }
}

#[test]
fn a_reward_is_a_plugin_or_a_model_with_only_its_own_keys() {
    let grpo = |reward: &str| GRPO.replace("[[reward]]\nplugin = \"math-answer\"\n", reward);
    let cases = [
        ("[[reward]]\nweight = 1.0\n", "reward[0]", "set `plugin`"),
        (
            "[[reward]]\nplugin = \"math-answer\"\nmodel = \"rm\"\n",
            "reward[0].model",
            "not both",
        ),
        (
            "[[reward]]\nplugin = \"math-answer\"\nlabel = \"good\"\n",
            "reward[0].label",
            "this reward is a plugin",
        ),
        (
            "[[reward]]\nmodel = \"rm\"\nconfig = { x = 1 }\n",
            "reward[0].config",
            "this reward is a model",
        ),
        (
            "[[reward]]\nmodel = \"rm\"\nisolate = true\n",
            "reward[0].isolate",
            "this reward is a model",
        ),
        (
            "[[reward]]\nmodel = \"rm\"\nbatch_size = 0\n",
            "reward[0].batch_size",
            "at least 1",
        ),
        (
            "[[reward]]\nplugin = \"math-answer\"\nurl = \"http://127.0.0.1:8000\"\n",
            "reward[0].url",
            "this reward is a plugin",
        ),
        (
            "[[reward]]\nmodel = \"rm\"\nurl = \"127.0.0.1:8000\"\n",
            "reward[0].url",
            "not an http(s) URL",
        ),
        (
            "[[reward]]\nmodel = \"rm\"\nserved_model = \"rm\"\n",
            "reward[0].served_model",
            "set `url` too",
        ),
    ];
    for (reward, key, says) in cases {
        let dir = recipes(&[("grpo.toml", &grpo(reward))]);
        let err = load(&dir, "grpo.toml", &[]).unwrap_err();
        assert!(
            matches!(&err, RecipeError::Invalid { path, message, .. } if path == key && message.contains(says)),
            "{reward}: {err}"
        );
    }
    let dir = recipes(&[("grpo.toml", &grpo("[[reward]]\nmodel = \"rm\"\nkind = \"oracle\"\n"))]);
    let err = load(&dir, "grpo.toml", &[]).unwrap_err().to_string();
    assert!(err.contains("kind") && err.contains("classifier"), "{err}");
    let dir = recipes(&[(
        "grpo.toml",
        &grpo("[[reward]]\nmodel = \"rm\"\nlabel = \"good\"\nweight = 0.5\n"),
    )]);
    let loaded = load(&dir, "grpo.toml", &[]).unwrap();
    assert_eq!(loaded.recipe.reward[0].model.as_deref(), Some("rm"));
    assert_eq!(loaded.recipe.reward[0].batch_size, 16);
}

#[test]
fn a_judge_is_granted_to_plugins_with_its_budget_checked() {
    let grpo = |reward: &str| GRPO.replace("[[reward]]\nplugin = \"math-answer\"\n", reward);
    let cases = [
        (
            "[[reward]]\nmodel = \"rm\"\njudge = {}\n",
            "reward[0].judge",
            "granted to plugins",
        ),
        (
            "[[reward]]\nplugin = \"judge-match\"\njudge = { max_requests_per_group = 0 }\n",
            "reward[0].judge.max_requests_per_group",
            "at least 1",
        ),
        (
            "[[reward]]\nplugin = \"judge-match\"\njudge = { deadline_share = 2.0 }\n",
            "reward[0].judge.deadline_share",
            "(0, 1]",
        ),
        (
            "[[reward]]\nplugin = \"judge-match\"\njudge = { temperature = -1.0 }\n",
            "reward[0].judge.temperature",
            "0 or more",
        ),
    ];
    for (reward, key, says) in cases {
        let dir = recipes(&[("grpo.toml", &grpo(reward))]);
        let err = load(&dir, "grpo.toml", &[]).unwrap_err();
        assert!(
            matches!(&err, RecipeError::Invalid { path, message, .. } if path == key && message.contains(says)),
            "{reward}: {err}"
        );
    }
    // A misspelt budget key is refused, not ignored.
    let dir = recipes(&[(
        "grpo.toml",
        &grpo("[[reward]]\nplugin = \"judge-match\"\njudge = { max_tokens = 8 }\n"),
    )]);
    let err = load(&dir, "grpo.toml", &[]).unwrap_err().to_string();
    assert!(err.contains("max_tokens"), "{err}");
    let dir = recipes(&[(
        "grpo.toml",
        &grpo("[[reward]]\nplugin = \"judge-match\"\njudge = { model = \"judge\", max_new_tokens = 8 }\n"),
    )]);
    let judge = load(&dir, "grpo.toml", &[]).unwrap().recipe.reward[0]
        .judge
        .clone()
        .unwrap();
    assert_eq!(judge.model.as_deref(), Some("judge"));
    assert_eq!(judge.limits.max_new_tokens, 8);
    assert_eq!(
        judge.limits.max_requests_per_group, 16,
        "unset keys keep their defaults"
    );
}

#[test]
fn a_teacher_needs_a_model_and_a_positive_weight() {
    let with = |teacher: &str| format!("{GRPO}\n[teacher]\n{teacher}\n");
    let dir = recipes(&[("grpo.toml", &with("model = \"teacher\"\ncoef = 0.0"))]);
    let err = load(&dir, "grpo.toml", &[]).unwrap_err();
    assert!(
        matches!(&err, RecipeError::Invalid { path, message, .. } if path == "teacher.coef" && message.contains("> 0")),
        "{err}"
    );
    let dir = recipes(&[("grpo.toml", &with("coef = 1.0"))]);
    let err = load(&dir, "grpo.toml", &[]).unwrap_err().to_string();
    assert!(err.contains("model"), "{err}");
    let dir = recipes(&[("grpo.toml", &with("model = \"teacher\""))]);
    let teacher = load(&dir, "grpo.toml", &[]).unwrap().recipe.teacher.unwrap();
    assert_eq!((teacher.model.as_str(), teacher.coef), ("teacher", 1.0));
    // Data parallelism splits GRPO's batches, but not the full KL's teacher logits.
    load(&dir, "grpo.toml", &["train.devices=2"]).unwrap();
    let err = load(&dir, "grpo.toml", &["train.devices=2", "teacher.kl=\"full\""]).unwrap_err();
    assert!(
        matches!(&err, RecipeError::Invalid { path, message, .. }
            if path == "train.devices" && message.contains("`teacher.kl = \"full\"`) trains on one device")),
        "{err}"
    );
}

#[test]
fn mixed_precision_is_one_choice_named_by_either_key() {
    use rein_core::ModelDtype;
    let dir = recipes(&[("grpo.toml", GRPO)]);
    let dtype = |sets: &[&str]| load(&dir, "grpo.toml", sets).unwrap().recipe.model_dtype();
    assert_eq!(dtype(&[]), ModelDtype::F32);
    assert_eq!(dtype(&["model.dtype=\"bf16\""]), ModelDtype::Bf16);
    assert_eq!(dtype(&["train.precision=\"mixed\""]), ModelDtype::Bf16);
    assert_eq!(
        dtype(&["model.dtype=\"bf16\"", "train.precision=\"mixed\""]),
        ModelDtype::Bf16
    );
    assert_eq!(
        dtype(&["model.dtype=\"f32\"", "train.precision=\"f32\""]),
        ModelDtype::F32
    );
    for (sets, key, says) in [
        (
            vec!["model.dtype=\"bf16\"", "train.precision=\"f32\""],
            "train.precision",
            "does not update weights held in bf16",
        ),
        (
            vec!["model.dtype=\"f32\"", "train.precision=\"mixed\""],
            "train.precision",
            "set `model.dtype = \"bf16\"`",
        ),
        (
            vec!["model.dtype=\"bf16\"", "sampler.precision=\"q8\""],
            "sampler.precision",
            "quantised codes",
        ),
    ] {
        let text = load(&dir, "grpo.toml", &sets).unwrap_err().to_string();
        assert!(
            text.contains(&format!("`{key}`")) && text.contains(says),
            "{sets:?}: {text}"
        );
    }
    let text = load(&dir, "grpo.toml", &["model.dtype=\"f16\""])
        .unwrap_err()
        .to_string();
    assert!(text.contains("model.dtype") && text.contains("bf16"), "{text}");
}

const DPO: &str = r#"
[algorithm]
name = "dpo"
[data]
task = { max_operand = 9, train = 10, test = 5 }
[model]
tokenizer = "tok"
"#;

#[test]
fn a_dpo_recipe_names_what_it_does_not_use_and_what_is_out_of_range() {
    let dir = recipes(&[("dpo.toml", DPO)]);
    let dpo = load(&dir, "dpo.toml", &[]).unwrap();
    let Algorithm::Dpo(section) = &dpo.recipe.algorithm else {
        panic!("a DPO recipe")
    };
    // TRL's defaults.
    assert_eq!((section.beta, section.lr, section.max_length), (0.1, 1e-6, 1024));
    assert!(section.precompute_ref);
    for (set, key, message) in [
        ("sampler.n=4", "sampler.n", "DPO does not use this key"),
        ("optimizer.lr=0.1", "optimizer.lr", "DPO does not use [optimizer]"),
        ("algorithm.kl_coef=0.1", "algorithm.kl_coef", "unknown"),
        ("algorithm.beta=0", "algorithm.beta", "> 0"),
        (
            "algorithm.label_smoothing=0.1",
            "algorithm.label_smoothing",
            "only the `robust` loss",
        ),
        ("algorithm.max_length=1", "algorithm.max_length", "at least 2"),
        ("algorithm.batch_size=0", "algorithm.batch_size", "at least 1"),
        ("algorithm.loss_type=\"kto\"", "algorithm.loss_type", "sigmoid"),
        (
            "train.devices=2",
            "train.devices",
            "this algorithm trains on one device",
        ),
    ] {
        let err = load(&dir, "dpo.toml", &[set]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&format!("`{key}`")) && text.contains(message),
            "{set}: {err}"
        );
    }
    let robust = ["algorithm.loss_type=\"robust\"", "algorithm.label_smoothing=0.1"];
    load(&dir, "dpo.toml", &robust).unwrap();
    let err = load(
        &dir,
        "dpo.toml",
        &["algorithm.loss_type=\"robust\"", "algorithm.label_smoothing=0.5"],
    )
    .unwrap_err();
    assert!(err.to_string().contains("[0, 0.5)"), "{err}");
    let dir = recipes(&[("dpo.toml", "[algorithm]\nname = \"dpo\"\n")]);
    let err = load(&dir, "dpo.toml", &[]).unwrap_err();
    assert!(err.to_string().contains("DPO needs a [data] section"), "{err}");

    // Online DPO ranks groups of samples by their rewards.
    let online = GRPO.replace("name = \"grpo\"", "name = \"online-dpo\"");
    let dir = recipes(&[("online.toml", &online)]);
    load(&dir, "online.toml", &[]).unwrap();
    for (set, key, message) in [
        ("sampler.n=1", "sampler.n", "best completion with its worst"),
        ("reward=[]", "reward", "add a [[reward]]"),
        ("algorithm.beta=-1", "algorithm.beta", "> 0"),
        ("algorithm.clip_low=0.1", "algorithm.clip_low", "unknown"),
        (
            "teacher.model=\"t\"",
            "teacher.model",
            "online DPO does not use [teacher]",
        ),
        ("train.devices=2", "train.devices", "SFT and the GRPO family"),
    ] {
        let err = load(&dir, "online.toml", &[set]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&format!("`{key}`")) && text.contains(message),
            "{set}: {err}"
        );
    }
}

/// `algorithm.name = "ppo"` is PPO on environments with `[env]` and PPO with a critic on a
/// language model with `[data]`; each reads only its own keys, and the language model's are
/// checked.
#[test]
fn ppo_on_prompts_is_ppo_with_a_critic_on_a_language_model() {
    let lm = GRPO.replace("name = \"grpo\"", "name = \"ppo\"");
    let dir = recipes(&[("lm.toml", &lm), ("env.toml", BASE)]);
    let loaded = load(&dir, "lm.toml", &[]).unwrap();
    let Algorithm::LmPpo(section) = &loaded.recipe.algorithm else {
        panic!("PPO on a language model, got {:?}", loaded.recipe.algorithm)
    };
    // TRL's defaults.
    assert_eq!((section.gamma, section.gae_lambda, section.vf_coef), (1.0, 0.95, 0.1));
    assert!(loaded.to_toml().contains("name = \"ppo\""), "{}", loaded.to_toml());
    ppo(&load(&dir, "env.toml", &[]).unwrap());
    let err = load(&dir, "env.toml", &["algorithm.value_model=\"head\""]).unwrap_err();
    assert!(err.to_string().contains("algorithm.value_model"), "{err}");
    for (set, key, message) in [
        (
            "algorithm.num_minibatches=100000",
            "algorithm.num_minibatches",
            "prompts_per_step × sampler.n",
        ),
        ("algorithm.update_epochs=0", "algorithm.update_epochs", "at least 1"),
        ("algorithm.gae_lambda=1.5", "algorithm.gae_lambda", "[0, 1]"),
        ("algorithm.value_clip=0", "algorithm.value_clip", "> 0"),
        (
            "algorithm.critic_warmup_steps=100",
            "algorithm.critic_warmup_steps",
            "never learn",
        ),
        ("algorithm.clip_high=0.3", "algorithm.clip_high", "unknown"),
        ("algorithm.value_model=\"shared\"", "algorithm.value_model", "separate"),
        ("reward=[]", "reward", "at least one [[reward]]"),
        (
            "teacher.model=\"t\"",
            "teacher.model",
            "PPO on a language model does not use [teacher]",
        ),
    ] {
        let err = load(&dir, "lm.toml", &[set]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&format!("`{key}`")) && text.contains(message),
            "{set}: {err}"
        );
    }
    let head = ["algorithm.value_model=\"head\"", "algorithm.value_model_path=\"rm\""];
    let err = load(&dir, "lm.toml", &head).unwrap_err();
    assert!(err.to_string().contains("`algorithm.value_model_path`"), "{err}");
}

/// `train.log` chooses the metrics formats; `metrics.jsonl` cannot be left out.
#[test]
fn metrics_formats_are_chosen_and_jsonl_is_kept() {
    let dir = recipes(&[("grpo.toml", GRPO), ("ppo.toml", BASE)]);
    for file in ["grpo.toml", "ppo.toml"] {
        assert!(load(&dir, file, &[]).unwrap().recipe.train.tensorboard());
        let jsonl_only = load(&dir, file, &["train.log=[\"jsonl\"]"]).unwrap();
        assert!(!jsonl_only.recipe.train.tensorboard());
        let err = load(&dir, file, &["train.log=[\"tensorboard\"]"]).unwrap_err();
        assert!(
            err.to_string().contains("`train.log`") && err.to_string().contains("jsonl"),
            "{err}"
        );
        let err = load(&dir, file, &["train.log=[\"wandb\"]"]).unwrap_err();
        assert!(err.to_string().contains("train.log"), "{err}");
    }
}

#[test]
fn sac_and_td3_keys_are_checked_and_named() {
    let root = common::root().join("recipes");
    let load_shipped = |file: &str, set: &[&str]| load(&root, file, set);
    for (file, set, key, expected) in [
        (
            "sac-pendulum.toml",
            "algorithm.batch_size=0",
            "algorithm.batch_size",
            "at least 1",
        ),
        (
            "sac-pendulum.toml",
            "algorithm.buffer_size=0",
            "algorithm.buffer_size",
            "at least 1",
        ),
        ("sac-pendulum.toml", "algorithm.tau=0", "algorithm.tau", "(0, 1]"),
        (
            "sac-pendulum.toml",
            "algorithm.gamma=1.5",
            "algorithm.gamma",
            "between 0 and 1",
        ),
        ("sac-pendulum.toml", "algorithm.q_lr=0", "algorithm.q_lr", "positive"),
        (
            "sac-pendulum.toml",
            "algorithm.autotune=false",
            "algorithm.target_entropy",
            "only read when `algorithm.autotune = true`",
        ),
        (
            "td3-pendulum.toml",
            "algorithm.policy_frequency=0",
            "algorithm.policy_frequency",
            "at least 1",
        ),
        (
            "td3-pendulum.toml",
            "algorithm.noise_clip=-1",
            "algorithm.noise_clip",
            "≥ 0",
        ),
        (
            "td3-pendulum.toml",
            "optimizer.lr=0.1",
            "optimizer.lr",
            "TD3 does not use [optimizer]",
        ),
        (
            "td3-pendulum.toml",
            "model.activation=\"tanh\"",
            "model.activation",
            "of [model] it reads hidden",
        ),
        (
            "sac-pendulum.toml",
            "algorithm.policy_noise=0.2",
            "algorithm.policy_noise",
            "unknown",
        ),
    ] {
        // `target_entropy` is set here so that turning `autotune` off leaves it unread.
        let with_entropy = ["algorithm.target_entropy=-1.0", set];
        let sets: &[&str] = if key == "algorithm.target_entropy" {
            &with_entropy
        } else {
            &[set]
        };
        let err = load_shipped(file, sets).unwrap_err();
        assert!(
            matches!(&err, RecipeError::Invalid { path, message, .. } if path == key && message.contains(expected))
                || matches!(&err, RecipeError::UnknownKey { .. } if expected == "unknown"),
            "{file} {set}: {err}"
        );
    }
    let no_env = recipes(&[("sac.toml", "[algorithm]\nname = \"sac\"\n")]);
    let err = load(&no_env, "sac.toml", &[]).unwrap_err();
    assert!(
        err.to_string().contains("SAC needs an [env] section with a plugin"),
        "{err}"
    );
}

#[test]
fn a_curriculum_reads_its_kinds_keys_and_ucb_needs_two_sources() {
    let dir = recipes(&[("grpo.toml", GRPO)]);
    let mixed = [
        "data.task.max_operand=99",
        "data.task.digits=[1, 2]",
        "curriculum.kind=\"ucb\"",
    ];
    let ucb = load(&dir, "grpo.toml", &mixed).unwrap();
    let section = ucb.recipe.curriculum.as_ref().unwrap();
    // DUMP's settings.
    assert_eq!(
        (section.window, section.exploration, section.temperature),
        (300, 1.0, 0.1)
    );
    // `recipe show` prints the keys of the kind in use only.
    let shown = ucb.to_toml();
    assert!(
        shown.contains("window = 300") && !shown.contains("easy_above"),
        "{shown}"
    );
    let pools = load(&dir, "grpo.toml", &["curriculum.kind=\"pools\""])
        .unwrap()
        .to_toml();
    assert!(pools.contains("easy_above") && !pools.contains("window"), "{pools}");
    let with = |extra: &[&'static str]| [&mixed[..], extra].concat();
    for (set, key, message) in [
        (
            with(&["curriculum.easy=0.5"]),
            "curriculum.easy",
            "not a key of kind = \"ucb\"",
        ),
        (
            vec!["curriculum.window=10"],
            "curriculum.window",
            "not a key of kind = \"pools\"",
        ),
        (
            vec!["curriculum.kind=\"ucb\""],
            "curriculum.kind",
            "data.task makes one",
        ),
        (
            with(&["curriculum.sources=[\"1-digit\", \"3-digit\"]"]),
            "curriculum.sources",
            "\"3-digit\" has no rows",
        ),
        (
            with(&["curriculum.sources=[\"1-digit\"]"]),
            "curriculum.sources",
            "one source",
        ),
        (with(&["curriculum.temperature=0"]), "curriculum.temperature", "> 0"),
        (with(&["curriculum.window=0"]), "curriculum.window", "at least 1"),
    ] {
        let err = load(&dir, "grpo.toml", &set).unwrap_err();
        assert!(
            matches!(&err, RecipeError::Invalid { path, message: m, .. } if path == key && m.contains(message)),
            "{set:?}: {err}"
        );
    }
}
