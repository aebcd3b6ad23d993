//! Language-model training end to end on tiny models: SFT then GRPO with reward plugins,
//! reward failures under each `on_error`, datasets in JSON lines and Parquet, evaluation.

#[path = "common/mod.rs"]
mod common;

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

/// A recipe on the tiny Qwen2 fixture with the hostile reward plugin, prompts from a file
/// where one row asks the plugin to panic.
fn hostile_recipe(dir: &Path, on_error: &str) -> LoadedRecipe {
    std::fs::write(
        dir.join("train.jsonl"),
        "{\"prompt\": \"calm\", \"answer\": \"x\"}\n{\"prompt\": \"trouble\", \"answer\": \"x\", \"attack\": \"panic\"}\n",
    )
    .unwrap();
    let model = root().join("tests/fixtures/lm/qwen2-gqa");
    let recipe = format!(
        r#"
seed = 3
[model]
path = {model:?}
[data]
train = "train.jsonl"
[sampler]
n = 2
max_new_tokens = 4
[algorithm]
name = "grpo"
steps = 2
prompts_per_step = 2
on_error = "{on_error}"
[[reward]]
plugin = {plugin:?}
[eval]
k = 0
[train]
runs_dir = {runs:?}
"#,
        model = model.display().to_string(),
        runs = dir.join("runs").display().to_string(),
        plugin = common::test_plugin_path("hostile-reward").display().to_string(),
    );
    std::fs::write(dir.join("recipe.toml"), recipe).unwrap();
    LoadedRecipe::load(&dir.join("recipe.toml"), &[]).unwrap()
}

#[test]
fn a_failing_reward_plugin_follows_on_error() {
    let dir = common::scratch("lm-onerror");
    let err = rein_train::run(&hostile_recipe(&dir, "fail"), &plugin_dir(), false).unwrap_err();
    let TrainError::Lm(lm) = &err else { panic!("{err}") };
    let rein_posttrain::LmError::Reward { prompt, error, .. } = lm.as_ref() else {
        panic!("{err}")
    };
    assert_eq!(prompt, "trouble");
    assert_eq!(error.plugin, "hostile-reward");
    assert!(
        err.to_string().contains("the hostile plugin panics on purpose"),
        "{err}"
    );
    for policy in ["zero", "skip"] {
        let outcome = rein_train::run(&hostile_recipe(&dir, policy), &plugin_dir(), true).unwrap();
        let RunOutcome::Lm(outcome) = outcome else { panic!() };
        let metrics = std::fs::read_to_string(outcome.run_dir.unwrap().join("metrics.jsonl")).unwrap();
        let failures: u64 = metrics
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter_map(|l| l["train/reward_failures"].as_u64())
            .sum();
        assert!(failures >= 1, "{policy}: the failure is logged");
        // The panic is a trap, counted per plugin in every record.
        let last: serde_json::Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
        let traps = last["plugins/hostile-reward/traps"].as_u64();
        assert!(traps >= Some(1), "{policy}: the plugin's traps are counted: {last}");
    }
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

/// The calculator recipe, shrunk: SFT on conversational traces, multi-turn GRPO with the
/// sandboxed calculator, greedy episodes in both evaluations; its metrics carry the episode
/// figures and report.md their table.
#[test]
fn a_multi_turn_recipe_logs_episodes_and_reports_tool_use() {
    let runs = common::scratch("lm-agent");
    let overrides: Vec<String> = [
        "data.task.train=200",
        "data.task.test=4",
        "sft.steps=4",
        "sft.batch_size=4",
        "algorithm.steps=1",
        "algorithm.prompts_per_step=2",
        "sampler.n=2",
        "sampler.max_new_tokens=8",
        "agent.max_turns=2",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("train.runs_dir={:?}", runs.display().to_string())])
    .collect();
    let recipe = LoadedRecipe::load(&root().join("recipes/grpo-calculator.toml"), &overrides).unwrap();
    let RunOutcome::Lm(outcome) = rein_train::run(&recipe, &plugin_dir(), true).unwrap() else {
        panic!("a language-model outcome")
    };
    for report in [outcome.before.unwrap(), outcome.after.unwrap()] {
        let episodes = report.episodes.expect("greedy episodes in the evaluation");
        assert!((1.0..=2.0).contains(&episodes.turns), "{episodes:?}");
    }
    let dir = outcome.run_dir.unwrap();
    let metrics = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    let grpo: serde_json::Value = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["stage"] == "grpo")
        .unwrap();
    for key in [
        "episode/turns",
        "episode/tool_calls",
        "episode/env_token_share",
        "episode/truncated_frac",
        "episode/tool_errors/malformed",
        "episode/tool_errors/timeout",
    ] {
        assert!(grpo[key].is_number(), "{key} missing from {grpo}");
    }
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        report.contains("| greedy episodes | turns | tool-call rate | tool errors | truncated |"),
        "{report}"
    );
}

/// A multi-turn recipe whose chat template rewrites earlier turns (Qwen3's habit of dropping
/// an earlier assistant turn's `<think>` block) is refused at start-up, before any training,
/// with an error naming the drift.
#[test]
fn a_multi_turn_recipe_refuses_a_template_that_rewrites_earlier_turns() {
    let runs = common::scratch("lm-drift");
    let tokenizer = runs.join("drifting-tokenizer");
    std::fs::create_dir_all(&tokenizer).unwrap();
    let assets = root().join("recipes/assets/arithmetic-tokenizer");
    std::fs::copy(assets.join("tokenizer.json"), tokenizer.join("tokenizer.json")).unwrap();
    let template = "{% for message in messages %}{% set content = message['content'] %}\
        {% if message['role'] == 'assistant' and not loop.last %}{% set content = content.split('</think>')[-1] %}{% endif %}\
        {{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}{% endfor %}\
        {% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    let config = serde_json::json!({"chat_template": template, "eos_token": "<|im_end|>"});
    std::fs::write(tokenizer.join("tokenizer_config.json"), config.to_string()).unwrap();
    let overrides = vec![
        format!("model.tokenizer={:?}", tokenizer.display().to_string()),
        format!("train.runs_dir={:?}", runs.display().to_string()),
    ];
    let recipe = LoadedRecipe::load(&root().join("recipes/grpo-calculator.toml"), &overrides).unwrap();
    let error = rein_train::run(&recipe, &plugin_dir(), true).unwrap_err();
    let text = error.to_string();
    assert!(text.contains("<think>"), "{text}");
    assert!(
        !std::fs::read_dir(&runs)
            .unwrap()
            .any(|e| e.unwrap().path().join("metrics.jsonl").exists()),
        "refused before training"
    );
}

/// GRPO with a reward model beside a plugin: its scores are logged under its name and enter the
/// sum with their weight.
#[test]
fn a_reward_model_scores_completions_beside_a_plugin() {
    let runs = common::scratch("lm-reward-model");
    let rm = root().join("tests/fixtures/lm/llama-rm");
    let rewards = format!(
        "reward=[{{plugin = \"math-answer\", config = {{extract = \"answer\"}}}}, \
         {{model = {:?}, name = \"rm\", weight = 0.5, batch_size = 3}}]",
        rm.display().to_string()
    );
    let recipe = tiny_default(&runs, &["sft.steps=2", rewards.as_str()]);
    let RunOutcome::Lm(outcome) = rein_train::run(&recipe, &plugin_dir(), true).unwrap() else {
        panic!("a language-model outcome")
    };
    let metrics = std::fs::read_to_string(outcome.run_dir.unwrap().join("metrics.jsonl")).unwrap();
    let grpo: Vec<serde_json::Value> = (metrics.lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|l: &serde_json::Value| l["stage"] == "grpo")
        .collect();
    assert_eq!(grpo.len(), 2);
    for line in &grpo {
        let (total, answer, rm) = (
            line["train/reward"].as_f64().unwrap(),
            line["train/reward/math-answer"].as_f64().unwrap(),
            line["train/reward/rm"].as_f64().unwrap(),
        );
        assert!(rm.is_finite() && rm != 0.0, "{line}");
        assert!((total - (answer + 0.5 * rm)).abs() < 1e-6, "{line}");
    }
}

/// GRPO with a reward plugin granted a judge (the policy's own starting model): every
/// completion is judged within the budget, and the judge's usage is logged under the reward's
/// name.
#[test]
fn a_plugin_granted_a_judge_asks_it_for_every_completion() {
    let runs = common::scratch("lm-judge");
    let rewards = "reward=[{plugin = \"math-answer\", config = {extract = \"answer\"}}, \
                   {plugin = \"judge-match\", weight = 0.5, judge = {max_new_tokens = 4}, limits = {timeout_ms = 60000}}]";
    let recipe = tiny_default(&runs, &["sft.steps=2", rewards]);
    let RunOutcome::Lm(outcome) = rein_train::run(&recipe, &plugin_dir(), true).unwrap() else {
        panic!("a language-model outcome")
    };
    let metrics = std::fs::read_to_string(outcome.run_dir.unwrap().join("metrics.jsonl")).unwrap();
    let grpo: Vec<serde_json::Value> = (metrics.lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|l: &serde_json::Value| l["stage"] == "grpo")
        .collect();
    assert_eq!(grpo.len(), 2);
    for line in &grpo {
        let usage = |key: &str| line[format!("train/reward/judge-match/{key}")].as_f64().unwrap();
        let calls = usage("judge_calls");
        // Two groups of four completions at least (dynamic sampling may score more).
        assert!(calls >= 8.0 && calls % 4.0 == 0.0, "{line}");
        assert!(
            usage("judge_tokens") >= calls && usage("judge_tokens") <= 4.0 * calls,
            "{line}"
        );
        assert!(usage("judge_ms") > 0.0, "{line}");
        assert_eq!(usage("judge_failures"), 0.0, "{line}");
        assert!(line["train/reward/judge-match"].as_f64().unwrap().is_finite(), "{line}");
    }
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

    // A teacher with another vocabulary (two tokens' ids swapped) is refused before any
    // training, naming the key and the token.
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
}

/// DPO on the tiny Qwen2 fixture from a preference file in TRL's formats (plain, conversational,
/// implicit prompt), its bad rows skipped and named: the first step's loss is ln 2 (the policy
/// is its reference, with or without fresh LoRA adapters), and the implicit reward margin and
/// accuracy grow as it learns to answer rather than decline.
#[test]
fn dpo_learns_the_preferred_answers_and_skips_bad_rows() {
    let dir = common::scratch("lm-dpo");
    let mut rows = vec![
        serde_json::json!({"prompt": "broken", "chosen": "x"}),
        serde_json::json!({"prompt": "same", "chosen": "y", "rejected": "y"}),
    ];
    for a in 0..24 {
        let (right, wrong) = (format!("<answer>{}</answer>", a + 1), format!("I do not know {a}."));
        let prompt = format!("What is {a} + 1?");
        rows.push(match a % 3 {
            0 => serde_json::json!({"prompt": prompt, "chosen": right, "rejected": wrong}),
            1 => serde_json::json!({
                "prompt": [{"role": "user", "content": prompt}],
                "chosen": [{"role": "assistant", "content": right}],
                "rejected": [{"role": "assistant", "content": wrong}],
            }),
            _ => serde_json::json!({
                "chosen": [{"role": "user", "content": prompt}, {"role": "assistant", "content": right}],
                "rejected": [{"role": "user", "content": prompt}, {"role": "assistant", "content": wrong}],
            }),
        });
    }
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(dir.join("pairs.jsonl"), text).unwrap();
    let recipe = |runs: &str, extra: &str| {
        let text = format!(
            r#"
seed = 5
[model]
path = {model:?}
[data]
train = "pairs.jsonl"
[algorithm]
name = "dpo"
steps = 25
batch_size = 8
lr = 3e-3
beta = 0.5
[train]
runs_dir = {runs:?}
{extra}
"#,
            model = root().join("tests/fixtures/lm/qwen2-gqa").display().to_string(),
            runs = dir.join(runs).display().to_string(),
        );
        std::fs::write(dir.join(format!("{runs}.toml")), text).unwrap();
        LoadedRecipe::load(&dir.join(format!("{runs}.toml")), &[]).unwrap()
    };
    for (runs, extra) in [("full", ""), ("lora", "[lora]\nrank = 4\nalpha = 8.0")] {
        let RunOutcome::Lm(outcome) = rein_train::run(&recipe(runs, extra), &plugin_dir(), true).unwrap() else {
            panic!("a language-model outcome")
        };
        let dpo = outcome.dpo.unwrap();
        assert_eq!((dpo.pairs, dpo.skipped, dpo.steps), (24, 2, 25), "{runs}");
        let report = std::fs::read_to_string(outcome.run_dir.unwrap().join("report.md")).unwrap();
        assert!(report.contains("on 24 preference pairs (2 rows skipped)"), "{report}");
        let records = stage_records(&dir.join(runs), "dpo");
        let value = |r: &serde_json::Value, key: &str| r[key].as_f64().unwrap();
        let first = value(&records[0], "dpo/loss");
        assert!(
            (first - std::f64::consts::LN_2).abs() < 1e-5,
            "{runs}: first loss {first}"
        );
        let mean = |key: &str, range: std::ops::Range<usize>| {
            records[range.clone()].iter().map(|r| value(r, key)).sum::<f64>() / range.len() as f64
        };
        let (early, late) = (mean("dpo/reward_margin", 0..5), mean("dpo/reward_margin", 20..25));
        assert!(late > early + 0.5, "{runs}: margin {early} → {late}");
        assert!(mean("dpo/reward_accuracy", 20..25) > 0.9, "{runs}: {records:?}");
    }
}

/// Reward-model training on the tiny Qwen2's decoder from preference files (train and held
/// out): held-out pairwise accuracy rises from chance, and `final/` is a
/// `Qwen2ForSequenceClassification` directory with transformers' own tensor names and shapes
/// (those of the model `gen_trl_reward.py` made with transformers) that rein loads back to the
/// same accuracy.
#[test]
fn a_reward_model_learns_the_preferences_and_saves_a_classifier() {
    let dir = common::scratch("lm-reward-model-training");
    let pairs = |range: std::ops::Range<usize>| -> String {
        range
            .map(|a| {
                let row = serde_json::json!({
                    "prompt": format!("What is {a} + 1?"),
                    "chosen": format!("<answer>{}</answer>", a + 1),
                    "rejected": format!("I do not know {a}."),
                    "margin": 0.25,
                });
                format!("{row}\n")
            })
            .collect()
    };
    std::fs::write(dir.join("train.jsonl"), pairs(0..40)).unwrap();
    std::fs::write(
        dir.join("test.jsonl"),
        pairs(40..56) + "{\"prompt\": \"x\", \"chosen\": \"y\"}\n",
    )
    .unwrap();
    let text = format!(
        r#"
seed = 2
[model]
path = {model:?}
[data]
train = "train.jsonl"
test = "test.jsonl"
[algorithm]
name = "reward-model"
steps = 30
batch_size = 8
lr = 1e-3
center_rewards_coefficient = 0.01
eval_every = 10
[train]
runs_dir = {runs:?}
"#,
        model = root().join("tests/fixtures/lm/qwen2-gqa").display().to_string(),
        runs = dir.join("runs").display().to_string(),
    );
    std::fs::write(dir.join("rm.toml"), text).unwrap();
    let recipe = LoadedRecipe::load(&dir.join("rm.toml"), &[]).unwrap();
    let RunOutcome::Lm(outcome) = rein_train::run(&recipe, &plugin_dir(), true).unwrap() else {
        panic!("a language-model outcome")
    };
    let trained = outcome.reward_model.unwrap();
    assert_eq!((trained.pairs, trained.test_pairs, trained.skipped), (40, 16, 1));
    let (before, after) = (trained.accuracy_before.unwrap(), trained.accuracy_after.unwrap());
    assert!(
        after >= 0.9 && after > before,
        "held-out pairwise accuracy {before} → {after}"
    );
    let run = outcome.run_dir.unwrap();
    let records = stage_records(&dir.join("runs"), "reward-model");
    assert_eq!(records.len(), 30);
    assert!(records[9]["eval/pairwise_accuracy"].is_number(), "{:?}", records[9]);
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(report.contains("| after training |"), "{report}");

    // transformers' names and shapes.
    let final_dir = run.join("final");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(final_dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "Qwen2ForSequenceClassification");
    assert_eq!(
        (config["num_labels"].as_u64(), config["id2label"]["0"].as_str()),
        (Some(1), Some("LABEL_0"))
    );
    let shapes = |path: &Path| -> std::collections::BTreeMap<String, Vec<usize>> {
        let bytes = std::fs::read(path).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        file.tensors()
            .into_iter()
            .map(|(name, view)| (name, view.shape().to_vec()))
            .collect()
    };
    assert_eq!(
        shapes(&final_dir.join("model.safetensors")),
        shapes(&root().join("tests/fixtures/trl_reward_grads.safetensors"))
    );
    assert!(final_dir.join("tokenizer.json").is_file());

    // rein reads it back: the same held-out accuracy.
    let device = Default::default();
    let model = rein_model::lm::SequenceClassifier::<rein_model::Cpu>::load(&final_dir, &device).unwrap();
    let tokenizer = rein_model::lm::LmTokenizer::load(&final_dir, &[]).unwrap();
    let data: rein_recipe::DataSection = serde_json::from_str("{}").unwrap();
    let (test, _) = rein_posttrain::read_preferences(&dir.join("test.jsonl"), &Fields::default()).unwrap();
    let (test, _) = rein_posttrain::prepare_preferences(&test, &tokenizer, &data, 1024).unwrap();
    let reloaded = rein_posttrain::pairwise_accuracy(&model, &test, &device).unwrap();
    assert_eq!(reloaded, after);
}

/// Online DPO, shrunk: the policy's own groups, scored by a plugin (here the length), give one
/// pair each (best against worst) or a tie; the first update's loss is ln 2, the policy being
/// its reference.
#[test]
fn online_dpo_learns_from_the_best_and_worst_of_each_group() {
    let runs = common::scratch("lm-online-dpo");
    let overrides: Vec<String> = [
        "data.task.train=400",
        "data.task.test=8",
        "sft.steps=12",
        "sft.batch_size=8",
        "algorithm.steps=3",
        "algorithm.prompts_per_step=4",
        "algorithm.sft_weight=0.0",
        "sampler.n=4",
        "sampler.temperature=1.5",
        "sampler.max_new_tokens=40",
        "eval.k=2",
        // Rewards that differ within a group from the start: the length (math-answer, at weight
        // 0, still measures held-out accuracy).
        "reward=[{plugin = \"math-answer\", config = {extract = \"answer\"}, weight = 0.0}, \
         {plugin = \"length-penalty\", config = {max_length = 40.0, cache_length = 40.0}}]",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("train.runs_dir={:?}", runs.display().to_string())])
    .collect();
    let recipe = LoadedRecipe::load(&root().join("recipes/online-dpo-arithmetic.toml"), &overrides).unwrap();
    let RunOutcome::Lm(outcome) = rein_train::run(&recipe, &plugin_dir(), true).unwrap() else {
        panic!("a language-model outcome")
    };
    assert!(outcome.after.is_some());
    let records = stage_records(&runs, "online-dpo");
    assert_eq!(records.len(), 3);
    let mut learned = 0;
    for r in &records {
        let (pairs, ties) = (r["dpo/pairs"].as_u64().unwrap(), r["dpo/ties"].as_u64().unwrap());
        assert!(pairs + ties <= 4, "{r}");
        assert!(r["train/reward"].is_number(), "{r}");
        if pairs > 0 {
            learned += 1;
            assert!(r["dpo/loss"].is_number(), "{r}");
        }
    }
    assert!(learned > 0, "no step had a pair with different rewards: {records:?}");
    assert!(records[0]["dpo/pairs"].as_u64() > Some(0), "{:?}", records[0]);
    let first = records[0]["dpo/loss"].as_f64().unwrap();
    assert!((first - std::f64::consts::LN_2).abs() < 1e-5, "first loss {first}");
    let report = std::fs::read_to_string(outcome.run_dir.unwrap().join("report.md")).unwrap();
    assert!(report.contains("Online DPO: 3 steps"), "{report}");
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
