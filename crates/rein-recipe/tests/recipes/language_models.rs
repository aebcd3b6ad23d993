//! Language-model recipes: sampling and inference servers, judges, teachers, mixed
//! precision, DPO and KTO, PPO with a critic, curricula (rewards in `rewards.rs`).

use super::*;
use rein_recipe::ImplicitPrmUpdate;

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
            "algorithm.top_entropy_quantile=0.0",
            "algorithm.top_entropy_quantile",
            "(0, 1]",
        ),
        (
            "algorithm.updates_per_batch=0",
            "algorithm.updates_per_batch",
            "at least 1",
        ),
        (
            "algorithm.adaptive_entropy={ delta = 0.0 }",
            "algorithm.adaptive_entropy",
            "delta > 0 and 0 ≤ min ≤ max (got target 0.2, delta 0, min 0, max 1)",
        ),
        (
            "algorithm.adaptive_entropy={ min = 0.5, max = 0.1 }",
            "algorithm.adaptive_entropy",
            "0 ≤ min ≤ max",
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
fn gdpo_is_refused_beside_the_settings_it_replaces() {
    let dir = recipes(&[("grpo.toml", GRPO)]);
    let gdpo = "algorithm.multi_objective_aggregation=\"normalize_then_sum\"";
    for (set, key) in [
        ("algorithm.advantage=\"rloo\"", "algorithm.advantage"),
        ("algorithm.std_scaling=\"none\"", "algorithm.std_scaling"),
        ("algorithm.kl_in_reward=true", "algorithm.kl_in_reward"),
    ] {
        let says = "multi_objective_aggregation = \"normalize_then_sum\"";
        assert_refused(&dir, "grpo.toml", &[gdpo, set], key, says);
    }
    let loaded = load(&dir, "grpo.toml", &[gdpo]).unwrap();
    let Algorithm::Grpo(grpo) = &loaded.recipe.algorithm else {
        panic!("GRPO, got {:?}", loaded.recipe.algorithm)
    };
    assert_eq!(
        grpo.multi_objective_aggregation,
        rein_core::MultiObjectiveAggregation::NormalizeThenSum
    );
    let err = load(&dir, "grpo.toml", &["algorithm.multi_objective_aggregation=\"sum\""]).unwrap_err();
    assert!(err.to_string().contains("multi_objective_aggregation"), "{err}");
}

#[test]
fn the_pass_at_k_advantages_check_k_and_their_scaling() {
    let dir = recipes(&[("grpo.toml", GRPO)]);
    let pass_at_k = "algorithm.advantage=\"pass_at_k\"";
    for (sets, key, message) in [
        (&[pass_at_k][..], "algorithm.pass_k", "set k, from 1 to sampler.n"),
        (
            &[pass_at_k, "algorithm.pass_k=0"][..],
            "algorithm.pass_k",
            "must be from 1 to sampler.n",
        ),
        (&[pass_at_k, "algorithm.pass_k=99"][..], "algorithm.pass_k", "got 99"),
        (
            &[pass_at_k, "algorithm.pass_k=2", "algorithm.std_scaling=\"none\""][..],
            "algorithm.std_scaling",
            "its own σ",
        ),
        (
            &["algorithm.pass_k=2"][..],
            "algorithm.pass_k",
            "read only with advantage = \"pass_at_k\"",
        ),
        (
            &["algorithm.advantage=\"grpo_passk\"", "algorithm.std_scaling=\"batch\""][..],
            "algorithm.std_scaling",
            "`grpo_passk` divides",
        ),
    ] {
        assert_refused(&dir, "grpo.toml", sets, key, message);
    }
    let loaded = load(&dir, "grpo.toml", &[pass_at_k, "algorithm.pass_k=2"]).unwrap();
    let Algorithm::Grpo(grpo) = &loaded.recipe.algorithm else {
        panic!("GRPO, got {:?}", loaded.recipe.algorithm)
    };
    assert_eq!((grpo.advantage, grpo.pass_k()), (rein_core::AdvantageKind::PassAtK, 2));
    load(&dir, "grpo.toml", &["algorithm.advantage=\"grpo_passk\""]).unwrap();
}

#[test]
fn the_process_advantage_reads_its_settings_alone() {
    let dir = recipes(&[("grpo.toml", GRPO)]);
    let process = "algorithm.advantage=\"process\"";
    for (sets, key, message) in [
        (
            &["algorithm.process_gamma=0.9"][..],
            "algorithm.process_gamma",
            "read only with advantage = \"process\"",
        ),
        (
            &["algorithm.process_step_weight=2.0"][..],
            "algorithm.process_step_weight",
            "read only with advantage = \"process\"",
        ),
        (
            &[process, "algorithm.process_gamma=1.5"][..],
            "algorithm.process_gamma",
            "must be in [0, 1], got 1.5",
        ),
        (
            &[process, "algorithm.process_outcome_weight=inf"][..],
            "algorithm.process_outcome_weight",
            "must be finite",
        ),
    ] {
        assert_refused(&dir, "grpo.toml", sets, key, message);
    }
    let loaded = load(&dir, "grpo.toml", &[process, "algorithm.process_step_weight=0.5"]).unwrap();
    let Algorithm::Grpo(grpo) = &loaded.recipe.algorithm else {
        panic!("GRPO, got {:?}", loaded.recipe.algorithm)
    };
    assert_eq!(grpo.advantage, rein_core::AdvantageKind::Process);
    let settings = (
        grpo.process_gamma(),
        grpo.process_step_weight(),
        grpo.process_outcome_weight(),
    );
    assert_eq!(settings, (1.0, 0.5, 1.0));
}

#[test]
fn token_entropy_settings_that_cannot_hold_together_are_refused() {
    let dir = recipes(&[("grpo.toml", GRPO)]);
    let top = "algorithm.top_entropy_quantile=0.2";
    for (sets, key, message) in [
        (
            &["algorithm.adaptive_entropy={ target = 1.0 }", top][..],
            "algorithm.adaptive_entropy",
            "use one of the two",
        ),
        (&[top, "train.devices=2"][..], "train.devices", "top_entropy_quantile"),
    ] {
        assert_refused(&dir, "grpo.toml", sets, key, message);
    }
    let adaptive = load(&dir, "grpo.toml", &["algorithm.adaptive_entropy={ target = 1.5 }"]).unwrap();
    let Algorithm::Grpo(grpo) = &adaptive.recipe.algorithm else {
        panic!("GRPO, got {:?}", adaptive.recipe.algorithm)
    };
    let control = grpo.adaptive_entropy.unwrap();
    assert_eq!(
        (control.target, control.delta, control.min, control.max),
        (1.5, 0.005, 0.0, 1.0)
    );
}

#[test]
fn an_objectives_settings_are_read_only_with_it_and_must_be_positive() {
    let dir = recipes(&[("grpo.toml", GRPO)]);
    for (sets, key, message) in [
        (
            &["algorithm.cispo_max_weight=3.0"][..],
            "algorithm.cispo_max_weight",
            "read only with objective = \"cispo\", and this recipe's objective is \"clip\"",
        ),
        (
            &["algorithm.objective=\"cispo\"", "algorithm.sapo_temperature_neg=2.0"][..],
            "algorithm.sapo_temperature_neg",
            "read only with objective = \"sapo\", and this recipe's objective is \"cispo\"",
        ),
        (
            &["algorithm.objective=\"cispo\"", "algorithm.cispo_max_weight=0.0"][..],
            "algorithm.cispo_max_weight",
            "must be > 0",
        ),
        (
            &["algorithm.objective=\"sapo\"", "algorithm.sapo_temperature_pos=-1.0"][..],
            "algorithm.sapo_temperature_pos",
            "must be > 0",
        ),
        (
            &["algorithm.objective=\"sapo\"", "algorithm.dual_clip=3.0"][..],
            "algorithm.dual_clip",
            "objective = \"sapo\" has no clip to bound",
        ),
    ] {
        assert_refused(&dir, "grpo.toml", sets, key, message);
    }
    let sapo = load(
        &dir,
        "grpo.toml",
        &["algorithm.objective=\"sapo\"", "algorithm.sapo_temperature_neg=2.0"],
    )
    .unwrap();
    let Algorithm::Grpo(grpo) = &sapo.recipe.algorithm else {
        panic!("GRPO, got {:?}", sapo.recipe.algorithm)
    };
    assert_eq!(
        (grpo.objective, grpo.sapo_temperature_pos(), grpo.sapo_temperature_neg()),
        (rein_core::ObjectiveKind::Sapo, 1.0, 2.0)
    );
    let unknown = load(&dir, "grpo.toml", &["algorithm.objective=\"ppo\""]).unwrap_err();
    assert!(unknown.to_string().contains("algorithm.objective"), "{unknown}");
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
        assert_refused(&dir, "grpo.toml", &sets, key, says);
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
fn an_implicit_prm_needs_the_process_advantage_and_sound_settings() {
    let process = ["algorithm.advantage=\"process\""];
    let load_with = |prm: &str, overrides: &[&str]| {
        let dir = recipes(&[("grpo.toml", &format!("{GRPO}\n[implicit_prm]\n{prm}\n"))]);
        load(&dir, "grpo.toml", overrides)
    };
    let refused = |prm: &str, overrides: &[&str], key: &str, says: &str| {
        let err = load_with(prm, overrides).unwrap_err();
        assert!(
            matches!(&err, RecipeError::Invalid { path, message, .. } if path == key && message.contains(says)),
            "{err}"
        );
    };
    refused("", &[], "implicit_prm", "advantage = \"process\"");
    refused("beta = 0.0", &process, "implicit_prm.beta", "> 0");
    refused("lr = -1.0", &process, "implicit_prm.lr", "> 0");
    refused("lambda = 1.5", &process, "implicit_prm.lambda", "[0, 1]");
    refused("use_outcome = true", &process, "implicit_prm.use_outcome", "lambda > 0");
    refused(
        "update = \"none\"",
        &process,
        "implicit_prm.update",
        "every token reward would be 0",
    );
    let prm = load_with("update = \"after\"\nweight = 2.0", &process)
        .unwrap()
        .recipe
        .implicit_prm
        .unwrap();
    assert_eq!(
        (prm.update, prm.weight, prm.beta, prm.lr),
        (ImplicitPrmUpdate::After, 2.0, 0.05, 1e-6)
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
/// KTO reads DPO's sections, with its own loss keys (TRL's `KTOConfig` names and defaults).
#[test]
fn a_kto_recipe_names_what_is_out_of_range() {
    let kto = DPO.replace("name = \"dpo\"", "name = \"kto\"");
    let dir = recipes(&[("kto.toml", &kto)]);
    let loaded = load(&dir, "kto.toml", &[]).unwrap();
    let Algorithm::Kto(section) = &loaded.recipe.algorithm else {
        panic!("a KTO recipe")
    };
    assert_eq!(
        (
            section.beta,
            section.lr,
            section.desirable_weight,
            section.undesirable_weight
        ),
        (0.1, 1e-6, 1.0, 1.0)
    );
    assert_eq!(section.loss_type, rein_core::KtoLossKind::Kto);
    for (set, key, message) in [
        (
            "algorithm.batch_size=1",
            "algorithm.batch_size",
            "at least 2 for loss_type = \"kto\"",
        ),
        ("algorithm.desirable_weight=0", "algorithm.desirable_weight", "> 0"),
        ("algorithm.undesirable_weight=-1", "algorithm.undesirable_weight", "> 0"),
        ("algorithm.beta=0", "algorithm.beta", "> 0"),
        ("algorithm.sft_weight=1.0", "algorithm.sft_weight", "unknown"),
        (
            "algorithm.loss_type=\"sigmoid\"",
            "algorithm.loss_type",
            "apo_zero_unpaired",
        ),
        ("sampler.n=4", "sampler.n", "KTO does not use this key"),
    ] {
        let text = load(&dir, "kto.toml", &[set]).unwrap_err().to_string();
        assert!(
            text.contains(&format!("`{key}`")) && text.contains(message),
            "{set}: {text}"
        );
    }
    // APO-zero has no reference point to estimate, so one completion per step is enough.
    load(
        &dir,
        "kto.toml",
        &["algorithm.loss_type=\"apo_zero_unpaired\"", "algorithm.batch_size=1"],
    )
    .unwrap();
}

/// Process-reward-model training reads DPO's data and model sections with its own keys (TRL's
/// `PRMConfig` names and defaults); a separator it cannot judge at, sizes out of range, a
/// generated task whose solutions cannot slip and a sampling key are refused by name.
#[test]
fn a_prm_recipe_names_what_is_out_of_range() {
    let prm = DPO.replace("name = \"dpo\"", "name = \"prm\"");
    let dir = recipes(&[("prm.toml", &prm)]);
    let loaded = load(&dir, "prm.toml", &[]).unwrap();
    let Algorithm::Prm(section) = &loaded.recipe.algorithm else {
        panic!("a PRM recipe")
    };
    assert_eq!(
        (
            section.lr,
            section.step_separator.as_str(),
            section.train_on_last_step_only
        ),
        (1e-5, "\n", false)
    );
    for (set, key, message) in [
        (
            "algorithm.step_separator=\"\"",
            "algorithm.step_separator",
            "must not be empty",
        ),
        (
            "algorithm.max_completion_length=0",
            "algorithm.max_completion_length",
            "at least 1",
        ),
        ("algorithm.max_length=1", "algorithm.max_length", "at least 2"),
        ("algorithm.init_std=0", "algorithm.init_std", "positive"),
        ("algorithm.beta=0.1", "algorithm.beta", "unknown"),
        ("data.task.ops=[\"*\"]", "data.task", "step labels slip one step"),
        (
            "sampler.n=4",
            "sampler.n",
            "process-reward-model training does not use [sampler]",
        ),
    ] {
        let text = load(&dir, "prm.toml", &[set]).unwrap_err().to_string();
        assert!(
            text.contains(&format!("`{key}`")) && text.contains(message),
            "{set}: {text}"
        );
    }
}

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

/// An offline learner's batch is bounded before anything is allocated for it: a batch_size past
/// the limit is refused naming the key and the limit, for SFT (alone or as a stage), DPO, KTO,
/// reward models and process reward models.
#[test]
fn offline_batch_sizes_are_bounded() {
    let kto = DPO.replace("name = \"dpo\"", "name = \"kto\"");
    let rm = DPO.replace("name = \"dpo\"", "name = \"reward-model\"");
    let prm = DPO.replace("name = \"dpo\"", "name = \"prm\"");
    let dir = recipes(&[
        ("grpo.toml", GRPO),
        ("dpo.toml", DPO),
        ("kto.toml", &kto),
        ("rm.toml", &rm),
        ("prm.toml", &prm),
    ]);
    let huge = "1000000000000";
    let limit = format!("at most {}", rein_recipe::MAX_BATCH_SIZE);
    for file in ["dpo.toml", "kto.toml", "rm.toml", "prm.toml"] {
        let set = format!("algorithm.batch_size={huge}");
        assert_refused(&dir, file, &[&set], "algorithm.batch_size", &limit);
    }
    let stage = format!("sft={{ batch_size = {huge} }}");
    assert_refused(&dir, "grpo.toml", &[&stage], "sft.batch_size", &limit);
    let at_limit = format!("algorithm.batch_size={}", rein_recipe::MAX_BATCH_SIZE);
    load(&dir, "dpo.toml", &[&at_limit]).unwrap();
}
