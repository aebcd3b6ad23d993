//! `[[reward]]` entries: plugins, reward models, process reward models and signals, each with
//! only its own keys.

use super::*;

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
        (
            "[[reward]]\nmodel = \"rm\"\nprm = { tag = \" #\" }\n",
            "reward[0].prm",
            "only a `kind = \"prm\"` reward model reads it",
        ),
        (
            "[[reward]]\nplugin = \"math-answer\"\nkind = \"prm\"\n",
            "reward[0].kind",
            "this reward is a plugin",
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
    assert!(
        err.contains("kind") && err.contains("classifier") && err.contains("prm"),
        "{err}"
    );
    let dir = recipes(&[(
        "grpo.toml",
        &grpo("[[reward]]\nmodel = \"rm\"\nlabel = \"good\"\nweight = 0.5\n"),
    )]);
    let loaded = load(&dir, "grpo.toml", &[]).unwrap();
    assert_eq!(loaded.recipe.reward[0].model.as_deref(), Some("rm"));
    assert_eq!(loaded.recipe.reward[0].batch_size, 16);
}

/// A process reward model's own keys: a separator and a tag that are not empty, no `label` (it
/// reads its positive label), a `url` that is one; the settings' defaults.
#[test]
fn a_process_reward_model_reads_its_own_keys() {
    let grpo = |reward: &str| GRPO.replace("[[reward]]\nplugin = \"math-answer\"\n", reward);
    let cases = [
        (
            "[[reward]]\nmodel = \"prm\"\nkind = \"prm\"\nprm = { separator = \"\" }\n",
            "reward[0].prm.separator",
            "must not be empty",
        ),
        (
            "[[reward]]\nmodel = \"prm\"\nkind = \"prm\"\nlabel = \"LABEL_1\"\n",
            "reward[0].label",
            "reads its positive label",
        ),
        (
            "[[reward]]\nmodel = \"prm\"\nkind = \"prm\"\nurl = \"127.0.0.1:8000\"\n",
            "reward[0].url",
            "not an http(s) URL",
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
    let prm = "[[reward]]\nmodel = \"prm\"\nkind = \"prm\"\nprm = { tag = \" #\", aggregate = \"last\" }\n";
    let dir = recipes(&[("grpo.toml", &grpo(prm))]);
    let entry = load(&dir, "grpo.toml", &[]).unwrap().recipe.reward.remove(0);
    let settings = entry.prm.unwrap();
    assert_eq!(
        (
            settings.tag.as_str(),
            settings.separator.as_str(),
            settings.good.as_str()
        ),
        (" #", "\n", "+")
    );
    assert_eq!(settings.aggregate, rein_core::PrmAggregate::Last);
    let served = "[[reward]]\nmodel = \"prm\"\nkind = \"prm\"\nurl = \"http://127.0.0.1:8000\"\n";
    let dir = recipes(&[("grpo.toml", &grpo(served))]);
    let entry = load(&dir, "grpo.toml", &[]).unwrap().recipe.reward.remove(0);
    assert_eq!(entry.url.as_deref(), Some("http://127.0.0.1:8000"));
}

/// A `signal` reward is computed by the host from rein's own sampler: it stands alone in its
/// entry, needs an online algorithm sampling in process, and cannot judge accuracy.
#[test]
fn a_signal_reward_stands_alone_and_needs_reins_own_sampler() {
    let with_signal = |extra: &str| format!("{GRPO}[[reward]]\nsignal = \"self_certainty\"\n{extra}");
    let dir = recipes(&[
        ("grpo.toml", &with_signal("")),
        ("dpo.toml", &format!("{DPO}[[reward]]\nsignal = \"negative_entropy\"\n")),
        ("plugin.toml", &with_signal("plugin = \"math-answer\"\n")),
        ("config.toml", &with_signal("config = { extract = \"answer\" }\n")),
        ("limits.toml", &with_signal("limits = { timeout_ms = 5 }\n")),
        ("unknown.toml", &format!("{GRPO}[[reward]]\nsignal = \"confidence\"\n")),
        (
            "alone.toml",
            &GRPO.replace("plugin = \"math-answer\"", "signal = \"self_certainty\""),
        ),
    ]);
    let loaded = load(&dir, "grpo.toml", &[]).unwrap();
    let entry = &loaded.recipe.reward[1];
    assert_eq!(entry.signal, Some(rein_core::SamplerSignal::SelfCertainty));
    for (file, key) in [
        ("plugin.toml", "reward[1].plugin"),
        ("config.toml", "reward[1].config"),
        ("limits.toml", "reward[1].limits"),
    ] {
        assert_refused(&dir, file, &[], key, "set `signal` alone");
    }
    let urls = ["sampler.backend=\"http\"", "sampler.urls=[\"http://127.0.0.1:8000\"]"];
    assert_refused(
        &dir,
        "grpo.toml",
        &urls,
        "reward[1].signal",
        "servers, which do not report it",
    );
    assert_refused(&dir, "dpo.toml", &[], "reward[0].signal", "samples none to train on");
    let judge = ["eval.accuracy_reward=\"self_certainty\""];
    assert_refused(
        &dir,
        "grpo.toml",
        &judge,
        "eval.accuracy_reward",
        "not a judge of correct answers",
    );
    let text = load(&dir, "unknown.toml", &[]).unwrap_err().to_string();
    assert!(
        text.contains("self_certainty") && text.contains("negative_entropy"),
        "{text}"
    );
    // Training on the signal alone is label-free RL; what needs answers judged is refused.
    load(&dir, "alone.toml", &[]).unwrap();
    let weighted = ["algorithm.difficulty_weight={low = 0.5, high = 1.5, center = 0.5, steepness = 10.0}"];
    assert_refused(
        &dir,
        "alone.toml",
        &weighted,
        "algorithm.difficulty_weight",
        "a `signal` judges no answer",
    );
    let pass_at_k = ["algorithm.advantage=\"pass_at_k\"", "algorithm.pass_k=2"];
    assert_refused(&dir, "alone.toml", &pass_at_k, "reward", "with a plugin or a model");
    let process = ["algorithm.advantage=\"process\""];
    assert_refused(
        &dir,
        "alone.toml",
        &process,
        "reward",
        "step scores of a reward plugin or model",
    );
    let pools = ["curriculum.kind=\"pools\""];
    assert_refused(
        &dir,
        "alone.toml",
        &pools,
        "curriculum.kind",
        "a `signal` judges no answer",
    );
    let empty = [r#"reward=[{weight = 1.0}]"#];
    assert_refused(
        &dir,
        "grpo.toml",
        &empty,
        "reward[0]",
        "`signal` (the sampler's own certainty)",
    );
}
