//! Composition (`extends`, `--set`), the resolved recipe, and errors about files, keys, types
//! and plugins.

use super::*;

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
    assert_eq!(r.model.activation, rein_core::Activation::Relu);
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
    // A plugin directory is its `.wasm` files.
    let plugin_dir = dir.join("plugins");
    std::fs::create_dir_all(&plugin_dir).unwrap();
    for plugin in ["cartpole", "pendulum"] {
        std::fs::write(plugin_dir.join(format!("{plugin}.wasm")), b"").unwrap();
    }
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
