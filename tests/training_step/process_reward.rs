//! Process-reward-model training against TRL's `PRMTrainer` (fixture by
//! `tests/fixtures/gen_trl_prm.py`): its stepwise rows tokenized the same way under every
//! setting, and the step-label loss and its gradients on the same batch.

use super::*;
use rein_model::lm::{LmTokenizer, TokenClassifier};
use rein_optim::step_label_loss;
use rein_posttrain::{StepLabelled, StepTokenizing, StepwiseExample, step_logits, tokenize_steps};

#[derive(Deserialize)]
struct Row {
    prompt: String,
    completions: Vec<String>,
    labels: Vec<bool>,
}

#[derive(Deserialize)]
struct Tokenized {
    input_ids: Vec<u32>,
    labels: Vec<i64>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    bos: bool,
    step_separator: String,
    train_on_last_step_only: bool,
    max_completion_length: Option<usize>,
    max_length: Option<usize>,
    rows: Vec<Tokenized>,
}

#[derive(Deserialize)]
struct PrmFixture {
    rows: Vec<Row>,
    tokenizing: Vec<Case>,
    score_weight: Vec<Vec<f32>>,
    score_bias: Vec<f32>,
    loss: f64,
    grad_norm: f64,
}

fn examples(fixture: &PrmFixture) -> Vec<StepwiseExample> {
    (fixture.rows.iter().enumerate())
        .map(|(i, r)| StepwiseExample {
            prompt: r.prompt.clone(),
            steps: r.completions.clone(),
            labels: r.labels.clone(),
            row: format!("row {i}"),
        })
        .collect()
}

/// The tiny models' tokenizer, or a copy of it with a beginning-of-sequence token (as the
/// fixture script makes one).
fn tokenizer(bos: bool) -> LmTokenizer {
    let dir = fixtures().join("lm/qwen2-gqa");
    if !bos {
        return LmTokenizer::load(&dir, &[]).unwrap();
    }
    let copy = Path::new(env!("CARGO_TARGET_TMPDIR")).join("prm-tokenizer-bos");
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::copy(dir.join("tokenizer.json"), copy.join("tokenizer.json")).unwrap();
    let mut config: serde_json::Value = read_json(&dir.join("tokenizer_config.json"));
    config["bos_token"] = "<|im_start|>".into();
    std::fs::write(copy.join("tokenizer_config.json"), config.to_string()).unwrap();
    LmTokenizer::load(&copy, &[]).unwrap()
}

/// Every row under every setting (separators of one and several tokens, the last step only,
/// both cuts, a beginning-of-sequence token) gives TRL's tokens and TRL's labels.
#[test]
fn stepwise_rows_tokenize_as_trl_does() {
    let fixture: PrmFixture = read_json(&fixtures().join("trl_prm.json"));
    let rows = examples(&fixture);
    for case in &fixture.tokenizing {
        let tokenizer = tokenizer(case.bos);
        let settings = StepTokenizing {
            separator: &case.step_separator,
            last_step_only: case.train_on_last_step_only,
            max_length: case.max_length,
            max_completion_length: case.max_completion_length,
        };
        for (row, theirs) in rows.iter().zip(&case.rows) {
            let ours = tokenize_steps(row, &tokenizer, &settings, true).unwrap();
            assert_eq!(ours.input_ids, theirs.input_ids, "{}: {}", case.name, row.row);
            let labels: Vec<i64> = (ours.labels.iter()).map(|l| l.map_or(-100, i64::from)).collect();
            assert_eq!(labels, theirs.labels, "{}: {}", case.name, row.row);
        }
    }
}

/// The step-label loss of three rows of different lengths, batched and right-padded, within
/// 1e-6 of `PRMTrainer.compute_loss`, and each gradient tensor (the head's weight and bias
/// included) within 1e-6 of the gradient's norm.
#[test]
fn the_process_reward_model_loss_matches_trl() {
    let _graph = rein_model::one_graph();
    let fixtures = fixtures();
    let fixture: PrmFixture = read_json(&fixtures.join("trl_prm.json"));
    let device = Default::default();
    let decoder = load::<B>(&fixtures.join("lm/qwen2-gqa"), &device).unwrap();
    let hidden = fixture.score_weight[0].len();
    let weight: Vec<f32> = (0..hidden)
        .flat_map(|i| fixture.score_weight.iter().map(move |row| row[i]))
        .collect();
    let weight = Tensor::<B, 2>::from_data(TensorData::new(weight, [hidden, 2]), &device);
    let bias = Tensor::<B, 1>::from_data(TensorData::new(fixture.score_bias.clone(), [2]), &device);
    let model = TokenClassifier::with_head(decoder, weight, bias, Some(0));
    let rows: Vec<StepLabelled> = (fixture.tokenizing[0].rows.iter())
        .map(|r| {
            let labelled = r.labels.iter().enumerate().filter(|(_, l)| **l >= 0);
            let (at, labels) = labelled.map(|(i, &l)| (i, l as usize)).unzip();
            StepLabelled {
                ids: r.input_ids.clone(),
                at,
                labels,
            }
        })
        .collect();
    let picked: Vec<&StepLabelled> = rows.iter().collect();
    let (logits, labels) = step_logits(&model, &picked, &device);
    let loss = step_label_loss(logits, &labels);
    let value = f64::from(loss.clone().into_scalar());
    assert!(
        (value - fixture.loss).abs() < 1e-6,
        "loss: rein {value} vs TRL {}",
        fixture.loss
    );
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("prm-grads");
    let _ = std::fs::remove_dir_all(&dir);
    model
        .valid()
        .map(&mut GradientsAsValues { grads: &grads })
        .save(&dir)
        .unwrap();
    let theirs = std::fs::read(fixtures.join("trl_prm_grads.safetensors")).unwrap();
    assert_saved_gradients_match(&dir, &SafeTensors::deserialize(&theirs).unwrap(), "", fixture.grad_norm);
}
