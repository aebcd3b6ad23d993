//! Process reward models: trained on step labels (`algorithm.name = "prm"`), saved as a token
//! classifier, and scoring completions as a `kind = "prm"` reward.

use super::*;
use rein_core::{Group, PrmSettings, RewardFn};
use rein_sampler::PrmReward;

/// Step-labelled rows for `What is a + 1?`: a worked step and an answer step, right; or the same
/// worked step and a non-answer, wrong.
fn stepwise_rows(range: std::ops::Range<usize>) -> String {
    let mut text = String::new();
    for a in range {
        let worked = format!("{a} + 1 = {}", a + 1);
        for (last, right) in [
            (format!("The answer is {}.", a + 1), true),
            ("I do not know.".into(), false),
        ] {
            let row = serde_json::json!({
                "prompt": format!("What is {a} + 1?"),
                "completions": [worked, last],
                "labels": [true, right],
            });
            text.push_str(&format!("{row}\n"));
        }
    }
    text
}

/// A process reward model on the tiny Qwen2 fixture from a stepwise file in TRL's format (a bad
/// row skipped and named): held-out step accuracy rises from the fresh head's to at least 90%,
/// `final/` is a `Qwen2ForTokenClassification` with transformers' own tensor names and shapes
/// (those of the model `gen_trl_prm.py` made with transformers), and as a `kind = "prm"` reward it
/// scores a right last step above a wrong one.
#[test]
fn a_process_reward_model_learns_step_labels_and_scores_as_a_reward() {
    let dir = common::scratch("lm-prm-training");
    std::fs::write(dir.join("train.jsonl"), stepwise_rows(0..40)).unwrap();
    let bad = "{\"prompt\": \"x\", \"completions\": [\"a\", \"b\"], \"labels\": [true]}\n";
    std::fs::write(dir.join("test.jsonl"), stepwise_rows(40..56) + bad).unwrap();
    let text = format!(
        r#"
seed = 2
[model]
path = {model:?}
[data]
train = "train.jsonl"
test = "test.jsonl"
[algorithm]
name = "prm"
steps = 30
batch_size = 8
lr = 3e-3
eval_every = 10
[train]
runs_dir = {runs:?}
"#,
        model = root().join("tests/fixtures/lm/qwen2-gqa").display().to_string(),
        runs = dir.join("runs").display().to_string(),
    );
    std::fs::write(dir.join("prm.toml"), text).unwrap();
    let recipe = LoadedRecipe::load(&dir.join("prm.toml"), &[]).unwrap();
    let RunOutcome::Lm(outcome) = rein_train::run(&recipe, &plugin_dir(), true).unwrap() else {
        panic!("a language-model outcome")
    };
    let trained = outcome.process_reward_model.unwrap();
    assert_eq!((trained.rows, trained.test_rows, trained.skipped), (80, 32, 1));
    let (before, after) = (trained.accuracy_before.unwrap(), trained.accuracy_after.unwrap());
    assert!(
        after >= 0.9 && after > before,
        "held-out step accuracy {before} → {after}"
    );
    let records = stage_records(&dir.join("runs"), "prm");
    assert_eq!(records.len(), 30);
    assert!(records[9]["eval/step_accuracy"].is_number(), "{:?}", records[9]);
    let run = outcome.run_dir.unwrap();
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(
        report.contains("| process reward model | held-out step accuracy |"),
        "{report}"
    );

    // transformers' names and shapes.
    let final_dir = run.join("final");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(final_dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "Qwen2ForTokenClassification");
    assert_eq!(config["num_labels"].as_u64(), Some(2));
    let shapes = |path: &Path| -> std::collections::BTreeMap<String, Vec<usize>> {
        let bytes = std::fs::read(path).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        (file.tensors().into_iter())
            .map(|(name, view)| (name, view.shape().to_vec()))
            .collect()
    };
    assert_eq!(
        shapes(&final_dir.join("model.safetensors")),
        shapes(&root().join("tests/fixtures/trl_prm_grads.safetensors"))
    );

    // As a reward: the trained separator after each step, steps split at lines.
    let settings = PrmSettings {
        tag: "\n".into(),
        ..PrmSettings::default()
    };
    let mut prm = PrmReward::<rein_model::Cpu>::load("prm", &final_dir, &settings, &Default::default()).unwrap();
    let group = Group {
        prompt: "What is 47 + 1?".into(),
        completions: vec![
            "47 + 1 = 48\nThe answer is 48.".into(),
            "47 + 1 = 48\nI do not know.".into(),
        ],
        reference: None,
        metadata: String::new(),
        tokens: Vec::new(),
        images: Vec::new(),
    };
    let scores = prm.score(std::slice::from_ref(&group)).unwrap().remove(0);
    let last = |i: usize| scores[i].steps[1].score;
    assert!(last(0) > 0.5 && last(1) < 0.5, "{scores:?}");
    assert!(scores[0].score.unwrap() > scores[1].score.unwrap(), "{scores:?}");
}
