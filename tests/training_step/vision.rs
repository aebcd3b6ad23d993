//! One GRPO step of a vision-language model against PyTorch's: Idefics3's
//! (`fixtures/vlm/gen_idefics3_step.py`), Qwen2-VL's and Qwen2.5-VL's
//! (`fixtures/vlm/gen_qwen2_vl_step.py`) loss and every gradient — vision encoder, connector
//! (patch merger) and decoder — with the encoder trained, and with it frozen (no gradient reaches
//! it, the rest unchanged).

use burn::tensor::Int;
use rein_model::vision::{
    Idefics3Image, Idefics3Processor, Idefics3Vision, ImageLimits, ImageSide, Pixels, ProcessedImage, Qwen2VlProcessor,
    decode_rgb,
};

use super::*;

/// The image side of a vision-language model.
fn image_side(model: &CausalLm<B>) -> &Idefics3Vision<B> {
    match model.vision.as_ref() {
        Some(ImageSide::Idefics3(vision)) => vision,
        _ => panic!("an Idefics3 model"),
    }
}

#[derive(Deserialize)]
struct Row {
    images: Vec<String>,
    prompt: Vec<u32>,
    completion: Vec<u32>,
}

#[derive(Deserialize)]
struct Outcome {
    loss: f64,
    grad_norm: f64,
    parameters: usize,
}

#[derive(Deserialize)]
struct Step {
    temperature: f32,
    clip: f32,
    rows: Vec<Row>,
    old_log_prob: Vec<Vec<f32>>,
    advantages: Vec<f32>,
    full: Outcome,
    frozen: Outcome,
}

fn vlm() -> std::path::PathBuf {
    fixtures().join("vlm")
}

fn row_images(row: &Row) -> Vec<Pixels> {
    (row.images.iter())
        .map(|name| {
            let bytes = std::fs::read(vlm().join("images").join(name)).unwrap();
            decode_rgb(&bytes, ImageLimits::default()).unwrap()
        })
        .collect()
}

/// The log-probabilities at `temperature` of the completion that follows the prompt's hidden
/// states `hidden` (prompt and completion, `[1, seq, hidden]`), `[C]`.
fn row_log_probs(model: &CausalLm<B>, hidden: Tensor<B, 3>, row: &Row, temperature: f32) -> Tensor<B, 1> {
    let (p, c) = (row.prompt.len(), row.completion.len());
    let width = model.config().hidden_size;
    let before_each = hidden.slice([0..1, p - 1..p + c - 1]).reshape([c, width]);
    let targets: Vec<i64> = row.completion.iter().map(|&t| i64::from(t)).collect();
    let targets = Tensor::<B, 1, Int>::from_data(TensorData::new(targets, [c]), &Default::default());
    model
        .log_prob_entropy(before_each, targets, 1.0 / temperature)
        .narrow(1, 0, 1)
        .reshape([c])
}

/// An Idefics3 model's completion log-probabilities, the row's images in its prompt.
fn idefics3_log_probs(model: &CausalLm<B>, processor: &Idefics3Processor, row: &Row, temperature: f32) -> Tensor<B, 1> {
    let device = Default::default();
    let images: Vec<_> = row_images(row).iter().map(|i| processor.process(i)).collect();
    let features = image_side(model).image_features(Idefics3Image::stack(&images, &device));
    let tokens: Vec<u32> = row.prompt.iter().chain(&row.completion).copied().collect();
    let seq = tokens.len();
    let rope = model.rope(seq, &device);
    let ctx = rein_model::lm::Context::single(&rope, 0, seq, &device);
    let hidden = model.hidden_with_images(&[tokens], features, &ctx, None);
    row_log_probs(model, hidden, row, temperature)
}

/// The step's rows as the trainer lays them out, each row's images (processed by `processor`)
/// beside it.
fn batch_with_images(step: &Step, processor: &Qwen2VlProcessor) -> TokenBatch {
    let prompts: Vec<Vec<u32>> = step.rows.iter().map(|r| r.prompt.clone()).collect();
    let completions: Vec<Vec<u32>> = step.rows.iter().map(|r| r.completion.clone()).collect();
    let mut batch = token_batch(&prompts, &completions);
    batch.images = (step.rows.iter())
        .map(|row| {
            (row_images(row).iter())
                .map(|i| ProcessedImage::Qwen2Vl(processor.process(i).unwrap()))
                .collect()
        })
        .collect();
    batch
}

/// The step's loss, each row's completion log-probabilities from `log_probs`.
fn grpo_loss(step: &Step, log_probs: impl Fn(&Row) -> Tensor<B, 1>) -> Tensor<B, 1> {
    let device = Default::default();
    let prompts: Vec<Vec<u32>> = step.rows.iter().map(|r| r.prompt.clone()).collect();
    let completions: Vec<Vec<u32>> = step.rows.iter().map(|r| r.completion.clone()).collect();
    let batch = token_batch(&prompts, &completions);
    let width = batch.completion_width;
    let log_prob = Tensor::cat(
        (step.rows.iter())
            .map(|row| {
                let padding = Tensor::zeros([width - row.completion.len()], &device);
                Tensor::cat(vec![log_probs(row), padding], 0).reshape([1, width])
            })
            .collect(),
        0,
    );
    batch_grpo_loss(step, &batch, log_prob)
}

/// The step's loss over `batch`, whose completions' log-probabilities are `log_prob`
/// (`[rows, C]`).
fn batch_grpo_loss(step: &Step, batch: &TokenBatch, log_prob: Tensor<B, 2>) -> Tensor<B, 1> {
    let device = Default::default();
    let width = batch.completion_width;
    let old: Vec<&[f32]> = step.old_log_prob.iter().map(Vec::as_slice).collect();
    policy_loss(
        log_prob,
        Tensor::from_data(
            TensorData::new(batch.per_token_values(&old), [batch.rows, width]),
            &device,
        ),
        Tensor::from_data(TensorData::new(step.advantages.clone(), [batch.rows, 1]), &device),
        batch.mask::<B>(&device),
        None,
        None,
        &token_level_loss(step.clip, width),
    )
    .loss
}

fn assert_loss_matches(loss: &Tensor<B, 1>, expected: &Outcome, what: &str) {
    let loss = f64::from(loss.clone().into_scalar());
    assert!(
        (loss - expected.loss).abs() < 1e-6,
        "{what}: loss {loss} vs PyTorch {}",
        expected.loss
    );
}

/// Every gradient saved as a model in `dir` within 1e-5 of the fixture `fixture`'s
/// `<prefix>/<name>` (relative to the larger of its norm and the whole gradient's), and zero
/// where the fixture has none.
///
/// 1e-5, not the text models' 1e-6: with prompts of 60-130 tokens both f32 computations are
/// ~2.5e-6 (relative) from the same step in f64 — PyTorch's 2.45e-6 and rein's 2.64e-6 for the
/// embeddings' gradient — so they can be 5e-6 apart while each is as exact as f32 allows.
fn assert_gradients_match(dir: &Path, fixture: &str, prefix: &str, expected: &Outcome) {
    let ours = std::fs::read(dir.join("model.safetensors")).unwrap();
    let ours = SafeTensors::deserialize(&ours).unwrap();
    let theirs = std::fs::read(vlm().join(fixture)).unwrap();
    let theirs = SafeTensors::deserialize(&theirs).unwrap();
    let (mut norm, mut compared) = (0.0f64, 0);
    for (name, view) in ours.tensors() {
        let got = f32s(&view);
        let Ok(reference) = theirs.tensor(&format!("{prefix}/{name}")) else {
            assert!(
                got.iter().all(|&g| g == 0.0),
                "{prefix}: `{name}` has a gradient PyTorch does not"
            );
            continue;
        };
        let reference = f32s(&reference);
        let size = reference.iter().map(|&e| f64::from(e).powi(2)).sum::<f64>().sqrt();
        let error = (got.iter().zip(&reference))
            .map(|(&g, &e)| f64::from(g - e).powi(2))
            .sum::<f64>()
            .sqrt();
        assert!(
            error <= 1e-5 * expected.grad_norm.max(size),
            "{prefix}: gradient of {name}: ‖rein − PyTorch‖ = {error:e} (‖PyTorch‖ = {size:e})"
        );
        norm += size * size;
        compared += 1;
    }
    assert_eq!(compared, expected.parameters, "{prefix}: parameters with a gradient");
    assert!(
        (norm.sqrt() - expected.grad_norm).abs() < 1e-5 * expected.grad_norm,
        "{prefix}: gradient norm"
    );
}

/// A fresh directory for the gradients of `what`.
fn gradients_dir(what: &str) -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("vlm-grads-{what}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn one_vision_language_grpo_step_matches_pytorch_with_the_encoder_trained_and_frozen() {
    let _graph = rein_model::one_graph();
    let step: Step = read_json(&vlm().join("idefics3_step.json"));
    let dir = vlm().join("idefics3");
    let model = load::<B>(&dir, &Default::default()).unwrap();
    let processor = Idefics3Processor::load(&dir, image_side(&model).image_seq_len()).unwrap();
    for (prefix, expected, model) in [
        ("full", &step.full, model.clone()),
        ("frozen", &step.frozen, model.clone().with_frozen_vision()),
    ] {
        let loss = grpo_loss(&step, |row| {
            idefics3_log_probs(&model, &processor, row, step.temperature)
        });
        assert_loss_matches(&loss, expected, prefix);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let dir = gradients_dir(&format!("idefics3-{prefix}"));
        save(&model.valid().map(&mut GradientsAsValues { grads: &grads }), &dir).unwrap();
        assert_gradients_match(&dir, "idefics3_step.safetensors", prefix, expected);
    }
}

#[test]
fn one_qwen2_vl_and_qwen2_5_vl_grpo_step_matches_pytorch_with_the_encoder_trained_and_frozen() {
    let _graph = rein_model::one_graph();
    for family in ["qwen2_vl", "qwen2_5_vl"] {
        let step: Step = read_json(&vlm().join(format!("{family}_step.json")));
        let dir = vlm().join(format!("{family}_model"));
        let model = load::<B>(&dir, &Default::default()).unwrap();
        // The trainer's own path: the rows concatenated, each at its multimodal positions.
        let batch = batch_with_images(&step, &Qwen2VlProcessor::load(&dir).unwrap());
        for (prefix, expected, model) in [
            ("full", &step.full, model.clone()),
            ("frozen", &step.frozen, model.clone().with_frozen_vision()),
        ] {
            let what = format!("{family} {prefix}");
            let (log_prob, _) =
                rein_posttrain::completion_log_probs(&model, &batch, step.temperature, false, &Default::default());
            let loss = batch_grpo_loss(&step, &batch, log_prob);
            assert_loss_matches(&loss, expected, &what);
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            let dir = gradients_dir(&format!("{family}-{prefix}"));
            save(&model.valid().map(&mut GradientsAsValues { grads: &grads }), &dir).unwrap();
            assert_gradients_match(&dir, &format!("{family}_step.safetensors"), prefix, expected);
        }
    }
}

/// A Qwen2-VL batch whose prompts carry no images reads their image tokens as text, at the
/// tokens' indices — as the sampler reads such a batch — instead of refusing it mid-step.
#[test]
fn a_qwen2_vl_row_without_images_reads_its_image_tokens_as_text() {
    let model = load::<B>(&vlm().join("qwen2_vl_model"), &Default::default()).unwrap();
    let image = match &model.vision {
        Some(ImageSide::Qwen2Vl(side)) => side.image_token_id(),
        _ => panic!("a Qwen2-VL model"),
    };
    let row = Row {
        images: Vec::new(),
        prompt: vec![5, 6, image, 7],
        completion: vec![8, 9, 10],
    };
    let batch = token_batch(std::slice::from_ref(&row.prompt), std::slice::from_ref(&row.completion));
    let (packed, _) = rein_posttrain::completion_log_probs(&model, &batch, 1.0, false, &Default::default());
    let device = Default::default();
    let tokens: Vec<u32> = row.prompt.iter().chain(&row.completion).copied().collect();
    let rope = model.rope(tokens.len(), &device);
    let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, tokens.len()]), &device);
    let hidden = model.hidden(
        ids,
        &rein_model::lm::Context::single(&rope, 0, tokens.len(), &device),
        None,
    );
    let plain = row_log_probs(&model, hidden, &row, 1.0);
    let (packed, plain): (Vec<f32>, Vec<f32>) = (
        packed.into_data().to_vec().unwrap(),
        plain.into_data().to_vec().unwrap(),
    );
    for (a, b) in packed.iter().zip(&plain) {
        assert!((a - b).abs() < 1e-6, "{packed:?} vs {plain:?}");
    }
}
