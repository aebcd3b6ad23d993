//! One GRPO step of a vision-language model against PyTorch's
//! (`fixtures/vlm/gen_idefics3_step.py`): Idefics3's loss and every gradient — vision encoder,
//! connector and decoder — with the encoder trained, and with it frozen (no gradient reaches it,
//! the rest unchanged).

use burn::tensor::Int;
use rein_model::vision::{Idefics3Processor, Idefics3Vision, ImageLimits, ProcessedImage, decode_rgb};

use super::*;

/// The image side of a vision-language model.
fn image_side(model: &CausalLm<B>) -> &Idefics3Vision<B> {
    model.vision.as_ref().expect("a vision-language model")
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

/// The completion's log-probabilities at `temperature`, the row's images in its prompt, `[C]`.
fn completion_log_probs(
    model: &CausalLm<B>,
    processor: &Idefics3Processor,
    row: &Row,
    temperature: f32,
) -> Tensor<B, 1> {
    let device = Default::default();
    let images: Vec<_> = (row.images.iter())
        .map(|name| {
            let bytes = std::fs::read(vlm().join("images").join(name)).unwrap();
            processor.process(&decode_rgb(&bytes, ImageLimits::default()).unwrap())
        })
        .collect();
    let features = image_side(model).image_features(ProcessedImage::stack(&images, &device));
    let tokens: Vec<u32> = row.prompt.iter().chain(&row.completion).copied().collect();
    let (p, seq) = (row.prompt.len(), tokens.len());
    let rope = model.rope(seq, &device);
    let ctx = rein_model::lm::Context::single(&rope, 0, seq, &device);
    let hidden = model.hidden_with_images(&[tokens], features, &ctx, None);
    let width = model.config().hidden_size;
    let c = row.completion.len();
    let before_each = hidden.slice([0..1, p - 1..seq - 1]).reshape([c, width]);
    let targets: Vec<i64> = row.completion.iter().map(|&t| i64::from(t)).collect();
    let targets = Tensor::<B, 1, Int>::from_data(TensorData::new(targets, [c]), &device);
    model
        .log_prob_entropy(before_each, targets, 1.0 / temperature)
        .narrow(1, 0, 1)
        .reshape([c])
}

/// The step's loss and gradients for `model`.
fn grpo_step(model: &CausalLm<B>, processor: &Idefics3Processor, step: &Step) -> (f64, GradientsParams) {
    let device = Default::default();
    let prompts: Vec<Vec<u32>> = step.rows.iter().map(|r| r.prompt.clone()).collect();
    let completions: Vec<Vec<u32>> = step.rows.iter().map(|r| r.completion.clone()).collect();
    let batch = token_batch(&prompts, &completions);
    let width = batch.completion_width;
    let log_prob = Tensor::cat(
        (step.rows.iter())
            .map(|row| {
                let lp = completion_log_probs(model, processor, row, step.temperature);
                let padding = Tensor::zeros([width - row.completion.len()], &device);
                Tensor::cat(vec![lp, padding], 0).reshape([1, width])
            })
            .collect(),
        0,
    );
    let old: Vec<&[f32]> = step.old_log_prob.iter().map(Vec::as_slice).collect();
    let out = policy_loss(
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
    );
    let loss = f64::from(out.loss.clone().into_scalar());
    (loss, GradientsParams::from_grads(out.loss.backward(), model))
}

/// Every gradient of `model` in `grads` within 1e-5 of the fixture's `<prefix>/<name>` (relative
/// to the larger of its norm and the whole gradient's), and zero where the fixture has none.
///
/// 1e-5, not the text models' 1e-6: with prompts of 60-130 tokens both f32 computations are
/// ~2.5e-6 (relative) from the same step in f64 — PyTorch's 2.45e-6 and rein's 2.64e-6 for the
/// embeddings' gradient — so they can be 5e-6 apart while each is as exact as f32 allows.
fn assert_gradients_match(model: &CausalLm<B>, grads: &GradientsParams, prefix: &str, expected: &Outcome) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("idefics3-grads-{prefix}"));
    let _ = std::fs::remove_dir_all(&dir);
    save(&model.valid().map(&mut GradientsAsValues { grads }), &dir).unwrap();
    let ours = std::fs::read(dir.join("model.safetensors")).unwrap();
    let ours = SafeTensors::deserialize(&ours).unwrap();
    let theirs = std::fs::read(vlm().join("idefics3_step.safetensors")).unwrap();
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

#[test]
fn one_vision_language_grpo_step_matches_pytorch_with_the_encoder_trained_and_frozen() {
    let step: Step = read_json(&vlm().join("idefics3_step.json"));
    let dir = vlm().join("idefics3");
    let model = load::<B>(&dir, &Default::default()).unwrap();
    let processor = Idefics3Processor::load(&dir, image_side(&model).image_seq_len()).unwrap();
    for (prefix, expected, model) in [
        ("full", &step.full, model.clone()),
        ("frozen", &step.frozen, model.clone().with_frozen_vision()),
    ] {
        let (loss, grads) = grpo_step(&model, &processor, &step);
        assert!(
            (loss - expected.loss).abs() < 1e-6,
            "{prefix}: loss {loss} vs PyTorch {}",
            expected.loss
        );
        assert_gradients_match(&model, &grads, prefix, expected);
    }
}
