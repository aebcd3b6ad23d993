//! Learning from preferences: DPO, KTO, reward-model training, online DPO.

use super::*;

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

/// KTO on the tiny Qwen2 fixture from a file of unpaired rows (TRL's `prompt`/`completion`/
/// `label`) with paired rows mixed in (each split into a desirable and an undesirable
/// completion), its bad rows skipped and named: the first step's loss is ½ (the policy is its
/// reference, so every implicit reward and the reference point are 0), and the desirable
/// completions' implicit reward rises above the undesirable ones' as it learns.
#[test]
fn kto_learns_from_labelled_completions_and_skips_bad_rows() {
    let dir = common::scratch("lm-kto");
    let mut rows = vec![
        serde_json::json!({"prompt": "broken", "completion": "x"}),
        serde_json::json!({"prompt": "label?", "completion": "y", "label": "yes"}),
    ];
    for a in 0..24 {
        let (right, wrong) = (format!("<answer>{}</answer>", a + 1), format!("I do not know {a}."));
        let prompt = format!("What is {a} + 1?");
        match a % 3 {
            0 => rows.push(serde_json::json!({"prompt": prompt, "chosen": right, "rejected": wrong})),
            _ => {
                rows.push(serde_json::json!({"prompt": prompt, "completion": right, "label": true}));
                if a % 3 == 1 {
                    rows.push(serde_json::json!({
                        "prompt": [{"role": "user", "content": prompt}],
                        "completion": [{"role": "assistant", "content": wrong}],
                        "label": false,
                    }));
                }
            }
        }
    }
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(dir.join("labelled.jsonl"), text).unwrap();
    let recipe = format!(
        r#"
seed = 5
[model]
path = {model:?}
[data]
train = "labelled.jsonl"
[algorithm]
name = "kto"
steps = 25
batch_size = 8
lr = 3e-3
beta = 0.5
desirable_weight = 0.8
[train]
runs_dir = {runs:?}
"#,
        model = root().join("tests/fixtures/lm/qwen2-gqa").display().to_string(),
        runs = dir.join("runs").display().to_string(),
    );
    std::fs::write(dir.join("kto.toml"), recipe).unwrap();
    let recipe = LoadedRecipe::load(&dir.join("kto.toml"), &[]).unwrap();
    let RunOutcome::Lm(outcome) = rein_train::run(&recipe, &plugin_dir(), true).unwrap() else {
        panic!("a language-model outcome")
    };
    let kto = outcome.kto.unwrap();
    // 8 paired rows give 8 + 8, 16 unpaired rows 16 desirable, 8 unpaired rows 8 undesirable.
    assert_eq!(
        (kto.desirable, kto.undesirable, kto.skipped, kto.steps),
        (24, 16, 2, 25)
    );
    let report = std::fs::read_to_string(outcome.run_dir.unwrap().join("report.md")).unwrap();
    assert!(
        report.contains("on 24 desirable and 16 undesirable completions (2 rows skipped)"),
        "{report}"
    );
    let records = stage_records(&dir.join("runs"), "kto");
    let value = |r: &serde_json::Value, key: &str| r[key].as_f64().unwrap_or(f64::NAN);
    // ½ · (mean weight of the batch's completions), the weights 0.8 and 1.
    let first = value(&records[0], "kto/loss");
    assert!((0.4..=0.5).contains(&first), "first loss {first}");
    assert_eq!(value(&records[0], "kto/kl"), 0.0);
    let mean = |key: &str, range: std::ops::Range<usize>| {
        let values: Vec<f64> = records[range]
            .iter()
            .map(|r| value(r, key))
            .filter(|v| v.is_finite())
            .collect();
        values.iter().sum::<f64>() / values.len() as f64
    };
    let (early, late) = (mean("kto/reward_margin", 0..5), mean("kto/reward_margin", 20..25));
    assert!(late > early + 0.5, "margin {early} → {late}");
    assert!(mean("kto/rewards_chosen", 20..25) > 0.0, "{records:?}");
    assert!(mean("kto/rewards_rejected", 20..25) < 0.0, "{records:?}");
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
