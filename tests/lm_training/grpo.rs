//! The GRPO family end to end: the main job's stages, other model families, chat templates,
//! Parquet prompts, LoRA, on-policy distillation, a curriculum over sources.

use super::*;

#[test]
fn sft_then_grpo_writes_checkpoints_metrics_and_a_report() {
    let runs = common::scratch("lm-e2e");
    let RunOutcome::Lm(outcome) = rein_train::run(&tiny_default(&runs, &[]), &plugin_dir(), true).unwrap() else {
        panic!("a language-model outcome")
    };
    let dir = outcome.run_dir.unwrap();
    for file in [
        "recipe.toml",
        "metrics.jsonl",
        "report.md",
        "data/train.jsonl",
        "data/test.jsonl",
        "sft/config.json",
        "final/model.safetensors",
        "final/tokenizer.json",
    ] {
        assert!(dir.join(file).is_file(), "{file} missing");
    }
    let before = outcome.before.unwrap();
    let after = outcome.after.unwrap();
    assert_eq!((before.examples, after.examples), (8, 8));
    assert!(before.pass_at_k.is_some() && before.maj_at_k.is_some());
    let metrics = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = metrics.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.iter().filter(|l| l["stage"] == "sft").count(), 12);
    let grpo: Vec<_> = lines.iter().filter(|l| l["stage"] == "grpo").collect();
    assert_eq!(grpo.len(), 2);
    for key in [
        "train/reward",
        "train/reward/math-answer",
        "train/reward/math-answer/correct",
        "train/reward/format-tags",
        "train/zero_variance_frac",
        "train/completion_length",
        "train/clip_frac",
        "train/learning_rate",
        "time/step_s",
        "time/generate_s",
        "time/reward_s",
        "time/forward_s",
        "time/backward_s",
        "time/optimizer_s",
        "time/elapsed_s",
        "plugins/math-answer/timeouts",
        "plugins/format-tags/errors",
        "sys/peak_rss_mib",
    ] {
        assert!(grpo[0].get(key).is_some(), "GRPO metrics lack `{key}`");
    }
    #[cfg(target_os = "linux")]
    assert!(grpo[0]["sys/peak_rss_mib"].as_f64().unwrap() > 1.0);
    assert_eq!(lines.iter().filter(|l| l["stage"] == "eval").count(), 2);
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        report.contains("| before RL |") && report.contains("| after RL |"),
        "{report}"
    );
    // The first held-out prompts, with their reference and the greedy answers before and after.
    assert!(
        report.contains("## Examples: the first 4 held-out prompts, greedy"),
        "{report}"
    );
    let first = before.shown[0].clone();
    assert!(
        report.contains(&format!("reference: `{}`", first.reference.unwrap())),
        "{report}"
    );
    assert!(
        report.contains("\nbefore RL (") && report.contains("\nafter RL ("),
        "{report}"
    );
    // The final model is a Hugging Face model directory rein (and transformers) can load, and
    // `rein eval` can judge it.
    let loaded = tiny_default(&runs, &[]);
    let report = rein_posttrain::evaluate_recipe(&loaded, &plugin_dir(), Some(&dir.join("final"))).unwrap();
    assert_eq!(report.examples, 8);
}

/// The main job on the newer families' shapes, initialised from scratch: a Gemma 3 (four norms,
/// GeGLU, q/k norms, a window of 8 on its sliding layers, two RoPE bases) and a Qwen3-MoE (four
/// experts, two per token) take SFT and GRPO steps and write a final model rein loads again; the
/// MoE's records carry its load-balancing loss and how often the trainer would have routed
/// otherwise than the sampler, with router replay on and off.
#[test]
fn gemma3_and_a_mixture_of_experts_run_the_main_job() {
    let families: [(&str, &[&str]); 3] = [
        (
            "gemma3",
            &[
                "model.architecture.model_type=\"gemma3_text\"",
                "model.architecture.head_dim=32",
                "model.architecture.sliding_window=8",
                "model.architecture.layer_types=[\"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\"]",
                "model.architecture.query_pre_attn_scalar=32",
            ],
        ),
        (
            "qwen3-moe",
            &[
                "model.architecture.model_type=\"qwen3_moe\"",
                "model.architecture.num_experts=4",
                "model.architecture.num_experts_per_tok=2",
                "model.architecture.moe_intermediate_size=96",
                "model.architecture.norm_topk_prob=true",
            ],
        ),
        (
            "qwen3-moe-no-replay",
            &[
                "model.architecture.model_type=\"qwen3_moe\"",
                "model.architecture.num_experts=4",
                "model.architecture.num_experts_per_tok=2",
                "model.architecture.moe_intermediate_size=96",
                "algorithm.router_replay=false",
                "algorithm.router_aux_loss_coef=0.01",
            ],
        ),
    ];
    for (name, extra) in families {
        let runs = common::scratch(&format!("lm-family-{name}"));
        let recipe = tiny_default(&runs, extra);
        let RunOutcome::Lm(outcome) = rein_train::run(&recipe, &plugin_dir(), true).unwrap() else {
            panic!("a language-model outcome")
        };
        let dir = outcome.run_dir.unwrap();
        let model = rein_model::lm::load::<rein_model::Cpu>(&dir.join("final"), &Default::default()).unwrap();
        let config = model.config();
        let grpo = stage_records(&runs, "grpo");
        assert_eq!(grpo.len(), 2, "{name}");
        match config.moe() {
            Some(moe) => {
                assert_eq!(moe.experts, 4, "{name}");
                for record in &grpo {
                    let mismatch = record["moe/router_mismatch"].as_f64().unwrap();
                    assert!((0.0..=1.0).contains(&mismatch), "{name}: {record}");
                    assert!(record["moe/aux_loss"].as_f64().unwrap() > 0.0, "{name}: {record}");
                }
            }
            None => {
                assert_eq!(config.model_type, "gemma3_text");
                assert!(
                    grpo[0].get("moe/aux_loss").is_none_or(serde_json::Value::is_null),
                    "{name}"
                );
            }
        }
    }
}

/// `model.chat_template` replaces the tokenizer's template: the prompts are rendered in it (a
/// template that raises stops the run with its message) and the models the run writes carry
/// it; a missing file is an error naming the key.
#[test]
fn a_recipe_chat_template_replaces_the_tokenizers() {
    let runs = common::scratch("lm-chat-template");
    let run_with = |name: &str, template: Option<&str>| {
        let path = runs.join(name);
        if let Some(template) = template {
            std::fs::write(&path, template).unwrap();
        }
        let key = format!("model.chat_template={:?}", path.display().to_string());
        let recipe = tiny_default(&runs, &[&key, "sft.steps=2", "algorithm.steps=1"]);
        rein_train::run(&recipe, &plugin_dir(), true)
    };
    let refusing = "{{ raise_exception('the recipe template was rendered') }}";
    let error = run_with("refusing.jinja", Some(refusing)).unwrap_err().to_string();
    assert!(error.contains("the recipe template was rendered"), "{error}");
    let error = run_with("missing.jinja", None).unwrap_err().to_string();
    assert!(
        error.contains("model.chat_template") && error.contains("missing.jinja"),
        "{error}"
    );

    let plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}\
                 {% if add_generation_prompt %}answer: {% endif %}";
    let Ok(RunOutcome::Lm(outcome)) = run_with("plain.jinja", Some(plain)) else {
        panic!("a language-model outcome")
    };
    let dir = outcome.run_dir.unwrap();
    for model in ["sft", "final"] {
        let saved = std::fs::read_to_string(dir.join(model).join("chat_template.jinja")).unwrap();
        assert_eq!(saved, plain, "{model}");
    }
    let tokenizer = rein_model::lm::LmTokenizer::load(&dir.join("final"), &[]).unwrap();
    let user = rein_model::lm::ChatMessage {
        role: "user".into(),
        content: "What is 1 + 2?".into(),
    };
    let rendered = tokenizer.apply_chat_template(&[user], true).unwrap();
    assert_eq!(rendered.as_deref(), Some("user: What is 1 + 2?\nanswer: "));
}

/// `tests/fixtures/prompts.parquet` is written by `tests/fixtures/gen_prompts_parquet.py`.
#[test]
fn prompts_load_from_parquet_with_named_columns() {
    let fields = Fields {
        prompt: "question".into(),
        answer: "solution".into(),
        ..Fields::default()
    };
    let rows = read(&root().join("tests/fixtures/prompts.parquet"), &fields).unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[1].prompt, "What is 10 - 4?");
    assert_eq!(rows[1].answer.as_deref(), Some("6"));
    assert_eq!(rows[1].metadata, "{\"level\":2}");
    let err = read(&root().join("tests/fixtures/prompts.parquet"), &Fields::default()).unwrap_err();
    assert!(err.to_string().contains("no `prompt` field"), "{err}");
}

/// `[lora]`: SFT and GRPO train adapters only; the run writes them in PEFT's format next to the
/// merged model, which differs from the model the run started from only in the adapted
/// matrices. The run starts from a model saved to disk (the recipe's architecture,
/// initialised here), so the comparison does not depend on the random stream other tests
/// share.
#[test]
fn a_lora_run_trains_adapters_and_writes_them_beside_the_merged_model() {
    use rein_model::Cpu;
    use rein_model::lm::{CausalLm, LmConfig, LmInit, load, save};
    let runs = common::scratch("lm-lora");
    let device = Default::default();
    let architecture = tiny_default(&runs, &[]).recipe.model.architecture.unwrap();
    let start = LmInit {
        config: LmConfig::from_json(serde_json::to_value(architecture).unwrap()).unwrap(),
        std: 0.02,
    }
    .init::<Cpu>(&mut rein_core::SeededRng::new(1), &device);
    let start_dir = runs.join("start");
    save(&start, &start_dir).unwrap();
    let recipe = tiny_default(
        &runs,
        &[
            &format!("model.path={:?}", start_dir.display().to_string()),
            "lora.rank=2",
            "lora.alpha=4.0",
            "lora.targets=[\"q_proj\", \"down_proj\"]",
        ],
    );
    let RunOutcome::Lm(outcome) = rein_train::run(&recipe, &plugin_dir(), true).unwrap() else {
        panic!("a language-model outcome")
    };
    let dir = outcome.run_dir.unwrap();
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("adapter/adapter_config.json")).unwrap()).unwrap();
    assert_eq!(
        (config["r"].as_u64(), config["lora_alpha"].as_f64()),
        (Some(2), Some(4.0))
    );
    assert_eq!(config["target_modules"], serde_json::json!(["q_proj", "down_proj"]));

    let start = load::<Cpu>(&start_dir, &device).unwrap();
    let trained = load::<Cpu>(&dir.join("final"), &device).unwrap();
    let values = |m: &CausalLm<Cpu>| rein_model::safetensors_file::module_tensors(m);
    let (before, after) = (values(&start), values(&trained));
    let changed: Vec<&String> = before
        .iter()
        .filter(|(name, v)| after[*name] != **v)
        .map(|(name, _)| name)
        .collect();
    assert!(!changed.is_empty(), "training changed nothing");
    assert!(
        changed
            .iter()
            .all(|n| n.ends_with("q_proj.weight") || n.ends_with("down_proj.weight")),
        "weights without adapters changed: {changed:?}"
    );
}

/// On-policy distillation (`[teacher]`), with the sampled-token and the full-vocabulary reverse
/// KL: a student that is its teacher has no reverse KL to close; a student from scratch, taught
/// by a model that went through SFT, closes it with no reward at all (the verifier's weight is
/// 0: it only measures held-out accuracy).
#[test]
fn a_student_distilled_on_policy_moves_toward_its_teacher() {
    let teacher_runs = common::scratch("lm-teacher");
    let teacher = tiny_default(&teacher_runs, &["sft.steps=40", "algorithm.steps=1"]);
    rein_train::run(&teacher, &plugin_dir(), true).unwrap();
    let run = std::fs::read_dir(&teacher_runs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let teacher_dir = format!("teacher.model={:?}", run.join("sft").display().to_string());
    let only_verifier = "reward=[{plugin = \"math-answer\", config = {extract = \"answer\"}, weight = 0.0}]";

    let itself = common::scratch("lm-self-distill");
    let path = format!("model.path={:?}", run.join("sft").display().to_string());
    let recipe = tiny_default(
        &itself,
        &["sft.steps=0", "algorithm.steps=1", &teacher_dir, &path, only_verifier],
    );
    rein_train::run(&recipe, &plugin_dir(), true).unwrap();
    let kl = stage_records(&itself, "grpo")[0]["train/teacher_kl"].as_f64().unwrap();
    assert!(kl.abs() < 1e-4, "a student that is its teacher: reverse KL {kl}");

    let student = common::scratch("lm-student");
    let overrides = [
        "sft.steps=0",
        "algorithm.steps=30",
        "optimizer.lr=3e-3",
        "optimizer.max_grad_norm=10.0",
        &teacher_dir,
        only_verifier,
    ];
    rein_train::run(&tiny_default(&student, &overrides), &plugin_dir(), true).unwrap();
    let kl: Vec<f64> = (stage_records(&student, "grpo").iter())
        .map(|r| r["train/teacher_kl"].as_f64().unwrap())
        .collect();
    eprintln!("teacher_kl per step: {kl:?}");
    let (first, last) = (
        kl[..3].iter().sum::<f64>() / 3.0,
        kl[kl.len() - 3..].iter().sum::<f64>() / 3.0,
    );
    assert!(last < 0.8 * first, "the reverse KL did not shrink: {kl:?}");

    // The full reverse KL over the vocabulary (`teacher.kl = "full"`, TRL's loss): none for the
    // teacher itself; the student from scratch closes it too.
    let full = "teacher.kl=\"full\"";
    let itself = common::scratch("lm-self-distill-full");
    let recipe = tiny_default(
        &itself,
        &[
            "sft.steps=0",
            "algorithm.steps=1",
            &teacher_dir,
            &path,
            only_verifier,
            full,
        ],
    );
    rein_train::run(&recipe, &plugin_dir(), true).unwrap();
    let kl = stage_records(&itself, "grpo")[0]["train/teacher_kl"].as_f64().unwrap();
    assert!(kl.abs() < 1e-5, "a student that is its teacher: full reverse KL {kl}");
    let student = common::scratch("lm-student-full");
    let overrides: Vec<&str> = overrides.iter().copied().chain([full, "algorithm.steps=15"]).collect();
    rein_train::run(&tiny_default(&student, &overrides), &plugin_dir(), true).unwrap();
    let kl: Vec<f64> = (stage_records(&student, "grpo").iter())
        .map(|r| r["train/teacher_kl"].as_f64().unwrap())
        .collect();
    eprintln!("full teacher_kl per step: {kl:?}");
    let (first, last) = (kl[0], kl[kl.len() - 1]);
    assert!(last < 0.8 * first, "the full reverse KL did not shrink: {kl:?}");
}

/// A teacher or an implicit PRM with another vocabulary (two tokens' ids swapped) is refused
/// before any training, naming the key and the token: its log-probabilities would be of other
/// tokens than the ones sampled.
#[test]
fn models_beside_the_policy_must_share_its_tokenizer() {
    let other_dir = common::scratch("lm-other-vocabulary").join("teacher");
    std::fs::create_dir_all(&other_dir).unwrap();
    for file in ["config.json", "model.safetensors", "tokenizer_config.json"] {
        std::fs::copy(root().join("tests/fixtures/lm/llama").join(file), other_dir.join(file)).unwrap();
    }
    let tokenizer = std::fs::read_to_string(root().join("tests/fixtures/lm/llama/tokenizer.json")).unwrap();
    let mut tokenizer: serde_json::Value = serde_json::from_str(&tokenizer).unwrap();
    tokenizer["model"]["vocab"]["!"] = 4.into();
    tokenizer["model"]["vocab"]["\""] = 3.into();
    std::fs::write(other_dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let other = format!("teacher.model={:?}", other_dir.display().to_string());
    let recipe = tiny_default(&common::scratch("lm-wrong-teacher"), &[&other]);
    let error = rein_train::run(&recipe, &plugin_dir(), true).unwrap_err().to_string();
    assert!(
        error.contains("teacher.model") && error.contains("share the policy's tokenizer"),
        "{error}"
    );
    assert!(error.contains(r#"token "!" is id 3 here and 4 there"#), "{error}");
    let implicit = format!("implicit_prm.model={:?}", other_dir.display().to_string());
    let process = "algorithm.advantage=\"process\"";
    let recipe = tiny_default(&common::scratch("lm-wrong-implicit-prm"), &[&implicit, process]);
    let error = rein_train::run(&recipe, &plugin_dir(), true).unwrap_err().to_string();
    assert!(
        error.contains("implicit_prm.model")
            && error.contains("the implicit PRM")
            && error.contains("share the policy's tokenizer"),
        "{error}"
    );
}

/// Rows with an `images` column as Hugging Face datasets store it in Parquet
/// (`tests/fixtures/vlm/gen_image_rows_parquet.py`): the bytes read back, a path resolved against
/// the file's directory, the column kept out of the metadata; a recipe training a text-only
/// policy on them is refused before training, naming the key and the row.
#[test]
fn image_rows_are_read_and_a_recipe_for_a_text_only_policy_refuses_them() {
    use rein_posttrain::ImageSource;
    let vlm = root().join("tests/fixtures/vlm");
    let rows = read(&vlm.join("image_rows.parquet"), &Fields::default()).unwrap();
    let grey = std::fs::read(vlm.join("images/grey.png")).unwrap();
    assert_eq!(rows[0].images, [ImageSource::Bytes(grey)]);
    assert_eq!(rows[1].images, [ImageSource::Path(vlm.join("images/wide.png"))]);
    assert_eq!(rows[1].metadata, "");

    let dir = common::scratch("lm-image-rows");
    let recipe = format!(
        r#"
[model]
path = {model:?}
[data]
train = {train:?}
[algorithm]
name = "grpo"
steps = 1
[[reward]]
plugin = "math-answer"
[train]
runs_dir = {runs:?}
"#,
        model = root().join("tests/fixtures/lm/qwen2-gqa").display().to_string(),
        train = vlm.join("image_rows.parquet").display().to_string(),
        runs = dir.join("runs").display().to_string(),
    );
    std::fs::write(dir.join("recipe.toml"), recipe).unwrap();
    let loaded = LoadedRecipe::load(&dir.join("recipe.toml"), &[]).unwrap();
    let err = rein_train::run(&loaded, &plugin_dir(), true).unwrap_err().to_string();
    assert!(
        err.contains("data.train row 1") && err.contains("the model reads no images"),
        "{err}"
    );
}

/// A UCB curriculum over files draws between the rows' `data.fields.source` values: the parquet
/// fixture's `level` column gives two sources, whose draws and advantages each step logs; data
/// without a source column, or a named source without rows, is refused before training,
/// naming the key.
#[test]
fn a_ucb_curriculum_over_a_file_draws_between_its_sources() {
    let dir = common::scratch("lm-ucb");
    std::fs::copy(
        root().join("tests/fixtures/prompts.parquet"),
        dir.join("prompts.parquet"),
    )
    .unwrap();
    let recipe = format!(
        r#"
[model]
path = {model:?}
[data]
train = "prompts.parquet"
fields = {{ prompt = "question", answer = "solution" }}
[sampler]
n = 4
max_new_tokens = 4
[algorithm]
name = "grpo"
steps = 3
prompts_per_step = 2
[[reward]]
plugin = "math-answer"
[eval]
k = 0
[curriculum]
kind = "ucb"
[train]
runs_dir = {runs:?}
"#,
        model = root().join("tests/fixtures/lm/qwen2-gqa").display().to_string(),
        runs = dir.join("runs").display().to_string(),
    );
    std::fs::write(dir.join("recipe.toml"), recipe).unwrap();
    let run = |overrides: &[&str]| {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        let loaded = LoadedRecipe::load(&dir.join("recipe.toml"), &overrides).unwrap();
        rein_train::run(&loaded, &plugin_dir(), true)
    };
    let err = run(&[]).unwrap_err().to_string();
    assert!(
        err.contains("curriculum.kind") && err.contains("has one (\"\")"),
        "{err}"
    );
    let err = run(&["data.fields.source=\"level\"", "curriculum.sources=[\"1\", \"3\"]"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("curriculum.sources") && err.contains("\"3\" has no rows"),
        "{err}"
    );
    let runs = format!("train.runs_dir={:?}", dir.join("ran").display().to_string());
    let RunOutcome::Lm(_) = run(&["data.fields.source=\"level\"", &runs]).unwrap() else {
        panic!("a language-model outcome")
    };
    let records = stage_records(&dir.join("ran"), "grpo");
    assert_eq!(records.len(), 3);
    for record in &records {
        let weight = |level: &str| record[format!("train/curriculum/{level}/weight")].as_f64().unwrap();
        assert!((weight("1") + weight("2") - 1.0).abs() < 1e-9, "{record}");
    }
}
