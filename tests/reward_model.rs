//! Reward models (sequence classifiers) against Hugging Face transformers, and as rewards; a
//! process reward model's step scores against Math-Shepherd's convention in transformers
//! (`gen_prm_scores.py`), a token-classifier PRM's against transformers'
//! `AutoModelForTokenClassification` (`gen_trl_prm.py`), and Qwen's process reward model class
//! against its head as Qwen's code defines it (`gen_qwen_prm.py`).
//!
//! Fixtures: `tests/fixtures/lm/{llama,qwen2}-rm`, written by `gen_classifiers.py`
//! (transformers 5.24): tiny random `LlamaForSequenceClassification` (one label) and
//! `Qwen2ForSequenceClassification` (three named labels) with the scores
//! `AutoModelForSequenceClassification` gives four prompt–completion pairs rendered through the
//! chat template, right-padded in one batch as TRL batches reward-model inputs.

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use rein_core::{Group, RewardFn};
use rein_core::{PrmAggregate, PrmSettings};
use rein_model::lm::{LoadError, SequenceClassifier, TokenClassifier};
use rein_sampler::{ModelReward, PrmError, PrmReward, RewardModelError};
use safetensors::SafeTensors;

type B = Flex;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lm")
}

/// A tensor of `<name>.expected.safetensors` as (shape, values).
fn expected(name: &str, tensor: &str) -> (Vec<usize>, Vec<f64>) {
    let bytes = std::fs::read(fixtures().join(format!("{name}.expected.safetensors"))).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let view = file.tensor(tensor).unwrap();
    let values = match view.dtype() {
        safetensors::Dtype::F32 => (view.data().chunks_exact(4))
            .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
            .collect(),
        safetensors::Dtype::I64 => (view.data().chunks_exact(8))
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f64)
            .collect(),
        other => panic!("unexpected dtype {other:?}"),
    };
    (view.shape().to_vec(), values)
}

/// The fixture's sequences, padding removed (the attention mask's ones).
fn sequences(name: &str) -> Vec<Vec<u32>> {
    let (shape, ids) = expected(name, "input_ids");
    let (_, mask) = expected(name, "attention_mask");
    (ids.chunks_exact(shape[1]).zip(mask.chunks_exact(shape[1])))
        .map(|(ids, mask)| {
            (ids.iter().zip(mask))
                .filter(|(_, m)| **m == 1.0)
                .map(|(id, _)| *id as u32)
                .collect()
        })
        .collect()
}

fn pairs(name: &str) -> (Vec<(String, String)>, Vec<String>) {
    let text = std::fs::read_to_string(fixtures().join(format!("{name}.texts.json"))).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let pairs = (json["pairs"].as_array().unwrap().iter())
        .map(|p| (p[0].as_str().unwrap().to_string(), p[1].as_str().unwrap().to_string()))
        .collect();
    let texts = (json["texts"].as_array().unwrap().iter())
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    (pairs, texts)
}

fn assert_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-5, "{what}[{i}]: rein {g} vs transformers {w}");
    }
}

#[test]
fn classifier_scores_equal_transformers() {
    for name in ["llama-rm", "qwen2-rm"] {
        let device = Default::default();
        let classifier = SequenceClassifier::<B>::load(&fixtures().join(name), &device).unwrap();
        let sequences = sequences(name);
        let scores = classifier
            .scores(&sequences, &device)
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        let scores: Vec<f64> = scores.into_iter().map(f64::from).collect();
        let (shape, want) = expected(name, "scores");
        assert_eq!(shape, [sequences.len(), classifier.labels().len()], "{name}");
        assert_close(name, &scores, &want);
        // Each sequence alone gives the same bits as in the padded batch.
        for (i, ids) in sequences.iter().enumerate() {
            let alone = classifier
                .scores(std::slice::from_ref(ids), &device)
                .into_data()
                .to_vec::<f32>()
                .unwrap();
            let width = alone.len();
            let batched: Vec<f32> = scores[i * width..(i + 1) * width].iter().map(|&v| v as f32).collect();
            assert_eq!(alone, batched, "{name}: sequence {i} alone");
        }
    }
    let qwen = SequenceClassifier::<B>::load(&fixtures().join("qwen2-rm"), &Default::default()).unwrap();
    assert_eq!(qwen.labels(), ["harmful", "helpful", "honest"]);
}

/// transformers reads a sequence at its last token that is not the padding token: a trailing
/// padding token (an end-of-sequence token that doubles as padding) is skipped.
#[test]
fn pooling_skips_trailing_padding_tokens_as_transformers_does() {
    let classifier = SequenceClassifier::<B>::load(&fixtures().join("llama-rm"), &Default::default()).unwrap();
    let config = std::fs::read_to_string(fixtures().join("llama-rm/config.json")).unwrap();
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    let pad = config["pad_token_id"].as_u64().unwrap() as u32;
    assert_eq!(classifier.pooled_position(&[5, 7, 9]), 2);
    assert_eq!(classifier.pooled_position(&[5, 7, pad, pad]), 1);
    assert_eq!(classifier.pooled_position(&[5, pad, 7]), 2);
    assert_eq!(classifier.pooled_position(&[pad, pad]), 0);
    let device = Default::default();
    let trailing = classifier
        .scores(&[vec![5, 7, pad]], &device)
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    let without = classifier
        .scores(&[vec![5, 7]], &device)
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(trailing, without);
}

#[test]
fn a_reward_model_scores_completions_through_its_chat_template() {
    let device = Default::default();
    for (name, label, column) in [("llama-rm", None, 0), ("qwen2-rm", Some("helpful"), 1)] {
        let mut reward = ModelReward::<B>::load("rm", &fixtures().join(name), label, 3, &device).unwrap();
        let (pairs, texts) = pairs(name);
        for ((prompt, completion), text) in pairs.iter().zip(&texts) {
            assert_eq!(&reward.text(prompt, completion).unwrap(), text, "{name}");
        }
        // Two groups, as GRPO hands them over; batches of 3 cut across them.
        let group = |range: std::ops::Range<usize>| Group {
            prompt: pairs[range.start].0.clone(),
            completions: pairs[range.clone()].iter().map(|p| p.1.clone()).collect(),
            ..Group::default()
        };
        // Each group's completions share its first prompt; score the fixture's pairs one per group.
        let groups: Vec<Group> = (0..pairs.len()).map(|i| group(i..i + 1)).collect();
        let scores = reward.score(&groups).unwrap();
        let got: Vec<f64> = scores.iter().map(|g| g[0].score.unwrap()).collect();
        let (shape, all) = expected(name, "scores");
        let want: Vec<f64> = all.chunks_exact(shape[1]).map(|row| row[column]).collect();
        assert_close(name, &got, &want);
        assert_eq!(reward.name(), "rm");
        // A group of several completions: one score each, in order.
        let many = Group {
            prompt: pairs[0].0.clone(),
            completions: vec![pairs[0].1.clone(), String::new(), pairs[0].1.clone()],
            ..Group::default()
        };
        let scores = reward.score(std::slice::from_ref(&many)).unwrap();
        assert_eq!(scores[0].len(), 3);
        assert_eq!(scores[0][0], scores[0][2]);
        assert_close(name, &[scores[0][0].score.unwrap()], &want[..1]);
    }
}

#[test]
fn bad_reward_models_are_refused_naming_what_is_wrong() {
    let device = Default::default();
    // A causal language model is not a classifier.
    let err = SequenceClassifier::<B>::load(&fixtures().join("llama"), &device).unwrap_err();
    assert!(err.to_string().contains("not a sequence classifier"), "{err}");
    // A label the classifier does not have.
    let err = ModelReward::<B>::load("rm", &fixtures().join("qwen2-rm"), Some("funny"), 4, &device)
        .err()
        .unwrap();
    assert!(matches!(err, RewardModelError::NoSuchLabel { .. }), "{err}");
    assert!(err.to_string().contains("harmful, helpful, honest"), "{err}");
    // A head that is not num_labels × hidden: the config claims two labels, the weight has one.
    let dir = std::env::temp_dir().join(format!("rein-reward-model-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixtures().join("llama-rm").join(f), dir.join(f)).unwrap();
    }
    let config = std::fs::read_to_string(fixtures().join("llama-rm/config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&config).unwrap();
    config["id2label"] = serde_json::json!({"0": "bad", "1": "good"});
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let err = SequenceClassifier::<B>::load(&dir, &device).unwrap_err();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(matches!(err, LoadError::Shape { .. }), "{err}");
    assert!(err.to_string().contains("score.weight"), "{err}");
    // A missing directory.
    let err = SequenceClassifier::<B>::load(Path::new("/nonexistent/rm"), &device).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/rm"), "{err}");
}

#[derive(serde::Deserialize)]
struct PrmFixture {
    settings: PrmSettings,
    prompt: String,
    completions: Vec<String>,
    step_scores: Vec<Vec<f64>>,
}

/// Math-Shepherd's step scores (transformers' logits of `good` against `bad` at each step's tag)
/// within 1e-5; each aggregate of them is the completion's reward, and a completion without a
/// step gets none.
#[test]
fn a_process_reward_model_scores_each_step_as_math_shepherd_does() {
    let path = fixtures().join("../prm_scores.json");
    let fixture: PrmFixture = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let dir = fixtures().join("qwen2-gqa");
    let device = Default::default();
    let mut prm = PrmReward::<B>::load("prm", &dir, &fixture.settings, &device).unwrap();
    for (completion, want) in fixture.completions.iter().zip(&fixture.step_scores) {
        let got = prm.step_scores(&fixture.prompt, completion).unwrap();
        assert_close(completion, &got, want);
    }
    let group = Group {
        prompt: fixture.prompt.clone(),
        completions: vec![fixture.completions[1].clone(), "\n \n".into()],
        reference: None,
        metadata: String::new(),
        tokens: Vec::new(),
        images: Vec::new(),
    };
    let scores = prm.score(std::slice::from_ref(&group)).unwrap().remove(0);
    let steps = &fixture.step_scores[1];
    let min = steps.iter().copied().fold(f64::INFINITY, f64::min);
    assert!((scores[0].score.unwrap() - min).abs() < 1e-5, "{scores:?}");
    assert_eq!(scores[1].score, None, "no step, no score");
    // Each step's score is also reported on the step's characters, for process advantages.
    let completion: Vec<char> = group.completions[0].chars().collect();
    let texts: Vec<String> = (scores[0].steps.iter())
        .map(|s| completion[s.start..s.end].iter().collect())
        .collect();
    assert_eq!(texts, prm.steps(&group.completions[0]));
    for (step, want) in scores[0].steps.iter().zip(steps) {
        assert!((step.score - want).abs() < 1e-5, "{step:?}");
    }
    assert!(scores[1].steps.is_empty());
    for (aggregate, want) in [
        (PrmAggregate::Mean, steps.iter().sum::<f64>() / 3.0),
        (PrmAggregate::Last, steps[2]),
        (PrmAggregate::Prod, steps.iter().product()),
    ] {
        let settings = PrmSettings {
            aggregate,
            ..fixture.settings.clone()
        };
        let prm = PrmReward::<B>::load("prm", &dir, &settings, &device).unwrap();
        assert!((prm.aggregate(steps).unwrap() - want).abs() < 1e-12, "{aggregate:?}");
    }
}

/// A `good` token that is not one token of the vocabulary is refused when the model loads,
/// naming the key; a step that contains the tag fails the scoring call with a reason.
#[test]
fn a_process_reward_model_refuses_conventions_its_vocabulary_cannot_follow() {
    let dir = fixtures().join("qwen2-gqa");
    let device = Default::default();
    let settings = PrmSettings {
        tag: " #".into(),
        good: "good".into(),
        ..PrmSettings::default()
    };
    let Err(error) = PrmReward::<B>::load("prm", &dir, &settings, &device) else {
        panic!("a four-token `good` loaded")
    };
    assert!(
        matches!(
            error,
            PrmError::NotOneToken {
                key: "good",
                count: 4,
                ..
            }
        ),
        "{error}"
    );
    assert!(
        error.to_string().contains("prm.good = \"good\" encodes to 4 tokens"),
        "{error}"
    );
    let settings = PrmSettings {
        tag: " #".into(),
        ..PrmSettings::default()
    };
    let prm = PrmReward::<B>::load("prm", &dir, &settings, &device).unwrap();
    let reason = prm.step_scores("q", "Step 1: # one\nStep 2").unwrap_err();
    assert!(reason.contains("appears 3 times in the text of 2 steps"), "{reason}");
}

/// The token classifier of `trl_prm.json` (the tiny Qwen2's decoder with its fresh two-label
/// head), saved in Hugging Face format with the tokenizer, in a directory of its own.
fn saved_token_classifier(name: &str) -> PathBuf {
    #[derive(serde::Deserialize)]
    struct Head {
        score_weight: Vec<Vec<f32>>,
        score_bias: Vec<f32>,
    }
    let path = fixtures().join("../trl_prm.json");
    let head: Head = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let device = Default::default();
    let source = fixtures().join("qwen2-gqa");
    let decoder = rein_model::lm::load::<B>(&source, &device).unwrap();
    let hidden = head.score_weight[0].len();
    let weight: Vec<f32> = (0..hidden)
        .flat_map(|i| head.score_weight.iter().map(move |row| row[i]))
        .collect();
    let weight = Tensor::<B, 2>::from_data(TensorData::new(weight, [hidden, 2]), &device);
    let bias = Tensor::<B, 1>::from_data(TensorData::new(head.score_bias, [2]), &device);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    TokenClassifier::with_head(decoder, weight, bias, Some(0))
        .save(&dir)
        .unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(source.join(file), dir.join(file)).unwrap();
    }
    dir
}

/// A token-classifier PRM (`*ForTokenClassification`, as TRL's `PRMTrainer` and rein train
/// one), saved by rein and loaded as `kind = "prm"`, scores each step with transformers'
/// probability of label 1 at the step's separator (`trl_prm.json`, the fresh classifier on its
/// first row) within 1e-5; `good` and `bad` play no part. A group is judged in one padded
/// batch, with the scores of one completion at a time.
#[test]
fn a_token_classifier_prm_scores_each_step_as_transformers_does() {
    #[derive(serde::Deserialize)]
    struct Row {
        prompt: String,
        completions: Vec<String>,
    }
    #[derive(serde::Deserialize)]
    struct Fixture {
        rows: Vec<Row>,
        step_probabilities: Vec<f64>,
    }
    let path = fixtures().join("../trl_prm.json");
    let fixture: Fixture = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let dir = saved_token_classifier("prm-token-classifier");
    let settings = PrmSettings {
        separator: "\n".into(),
        tag: "\n".into(),
        good: "a word that is not one token".into(),
        ..PrmSettings::default()
    };
    let prm = PrmReward::<B>::load("prm", &dir, &settings, &Default::default()).unwrap();
    let row = &fixture.rows[0];
    let got = prm.step_scores(&row.prompt, &row.completions.join("\n")).unwrap();
    assert_close("the first row's steps", &got, &fixture.step_probabilities);

    // A group is judged in one padded batch: the same scores as one completion at a time.
    let completions = [
        "one step".to_string(),
        row.completions.join("\n"),
        "\n".into(),
        "a\nlonger second step, with more words than the first".into(),
    ];
    let completions: Vec<&str> = completions.iter().map(String::as_str).collect();
    let batched = prm.group_step_scores(&row.prompt, &completions).unwrap();
    for (completion, batched) in completions.iter().zip(&batched) {
        let alone = prm.step_scores(&row.prompt, completion).unwrap();
        assert_close(completion, batched, &alone);
    }
    assert!(batched[2].is_empty(), "no step, no score");

    // A tag with no token to judge at is refused naming the key, as for a causal LM.
    let empty = PrmSettings {
        tag: String::new(),
        ..settings.clone()
    };
    let Err(error) = PrmReward::<B>::load("prm", &dir, &empty, &Default::default()) else {
        panic!("a tag of no token loaded")
    };
    assert!(
        matches!(
            error,
            PrmError::NotOneToken {
                key: "tag",
                count: 0,
                ..
            }
        ),
        "{error}"
    );

    // A classifier with another number of labels is refused, naming it.
    let device = Default::default();
    let decoder = rein_model::lm::load::<B>(&fixtures().join("qwen2-gqa"), &device).unwrap();
    let hidden = decoder.config().hidden_size;
    let three = dir.with_file_name("prm-three-labels");
    let head = (
        Tensor::<B, 2>::zeros([hidden, 3], &device),
        Tensor::<B, 1>::zeros([3], &device),
    );
    TokenClassifier::with_head(decoder, head.0, head.1, None)
        .save(&three)
        .unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(dir.join(file), three.join(file)).unwrap();
    }
    let Err(error) = PrmReward::<B>::load("prm", &three, &settings, &device) else {
        panic!("a three-label classifier loaded as a PRM")
    };
    assert!(matches!(error, PrmError::NotTwoLabels { labels: 3, .. }), "{error}");
}

/// Qwen's process reward model (`Qwen2ForProcessRewardModel`, Qwen2.5-Math-PRM's class: a
/// two-layer head, `score.0` → ReLU → `score.2`), written by rein under Qwen's tensor names and
/// read back, gives each step tag token the logits and label-1 probabilities of the class as
/// Qwen's code defines it (`qwen_prm.json`, by `gen_qwen_prm.py`) within 1e-5, the two texts
/// judged in one padded batch; as a `kind = "prm"` reward it reads that class as a token
/// classifier.
#[test]
fn a_qwen_process_reward_model_scores_steps_as_its_code_does() {
    #[derive(serde::Deserialize)]
    struct Sequence {
        input_ids: Vec<u32>,
        tag_positions: Vec<usize>,
        logits: Vec<Vec<f64>>,
        step_probabilities: Vec<f64>,
    }
    #[derive(serde::Deserialize)]
    struct Fixture {
        score_0_weight: Vec<Vec<f32>>,
        score_0_bias: Vec<f32>,
        score_2_weight: Vec<Vec<f32>>,
        score_2_bias: Vec<f32>,
        sequences: Vec<Sequence>,
    }
    let path = fixtures().join("../qwen_prm.json");
    let fixture: Fixture = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let device = Default::default();
    // torch's `[out, in]` as rein's `[in, out]`.
    let transposed = |rows: &[Vec<f32>]| {
        let (outputs, inputs) = (rows.len(), rows[0].len());
        let values: Vec<f32> = (0..inputs).flat_map(|i| rows.iter().map(move |row| row[i])).collect();
        Tensor::<B, 2>::from_data(TensorData::new(values, [inputs, outputs]), &device)
    };
    let vector = |v: &[f32]| Tensor::<B, 1>::from_data(TensorData::new(v.to_vec(), [v.len()]), &device);
    let source = fixtures().join("qwen2-gqa");
    let decoder = rein_model::lm::load::<B>(&source, &device).unwrap();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("qwen-process-reward-model");
    let _ = std::fs::remove_dir_all(&dir);
    TokenClassifier::with_process_reward_head(
        decoder,
        (transposed(&fixture.score_0_weight), vector(&fixture.score_0_bias)),
        transposed(&fixture.score_2_weight),
        vector(&fixture.score_2_bias),
        Some(0),
    )
    .save(&dir)
    .unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(source.join(file), dir.join(file)).unwrap();
    }
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    assert!(config.contains("\"Qwen2ForProcessRewardModel\""), "{config}");
    assert!(TokenClassifier::<B>::is_token_classifier(&dir));

    let model = TokenClassifier::<B>::load(&dir, &device).unwrap();
    let sequences: Vec<&[u32]> = fixture.sequences.iter().map(|s| s.input_ids.as_slice()).collect();
    let at: Vec<(usize, usize)> = (fixture.sequences.iter().enumerate())
        .flat_map(|(row, s)| s.tag_positions.iter().map(move |&t| (row, t)))
        .collect();
    let logits: Vec<f64> = (model.logits_at(&sequences, &at, &device).into_data())
        .convert::<f64>()
        .to_vec()
        .unwrap();
    let want: Vec<f64> = fixture
        .sequences
        .iter()
        .flat_map(|s| s.logits.iter().flatten().copied())
        .collect();
    assert_close("the logits at the step tags", &logits, &want);
    let probabilities: Vec<f64> = (logits.chunks_exact(2))
        .map(|z| 1.0 / (1.0 + (z[0] - z[1]).exp()))
        .collect();
    let want: Vec<f64> = fixture
        .sequences
        .iter()
        .flat_map(|s| s.step_probabilities.clone())
        .collect();
    assert_close("label 1's probability", &probabilities, &want);

    let settings = PrmSettings {
        separator: "\n".into(),
        tag: "\n".into(),
        ..PrmSettings::default()
    };
    let prm = PrmReward::<B>::load("prm", &dir, &settings, &device).unwrap();
    assert_eq!(prm.step_scores("q", "one\ntwo").unwrap().len(), 2);
}
