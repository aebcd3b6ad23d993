//! On-policy distillation's full reverse KL against TRL's `DistillationTrainer` loss.

use super::*;

/// The batch of `trl_distill.json` with TRL's loss.
#[derive(Deserialize)]
struct Distill {
    temperature: f32,
    prompts: Vec<Vec<u32>>,
    completions: Vec<Vec<u32>>,
    loss: f64,
    grad_norm: f64,
}

/// `teacher.kl = "full"`: the reverse KL over the vocabulary at each completion position,
/// averaged over the batch's completion tokens, equals TRL's `DistillationTrainer` loss at β = 1
/// (its `_chunked_divergence_loss`; fixture by `tests/fixtures/gen_trl_distill.py`), and so do
/// the student's gradients, tensor by tensor.
#[test]
fn full_reverse_kl_matches_trl_distillation() {
    let _graph = rein_model::one_graph();
    let fixtures = fixtures();
    let step: Distill = read_json(&fixtures.join("trl_distill.json"));
    let device = Default::default();
    let student = load::<B>(&fixtures.join("lm/qwen2-gqa"), &device).unwrap();
    let teacher = load::<Flex>(&fixtures.join("lm/llama"), &device).unwrap();
    let batch = token_batch(&step.prompts, &step.completions);

    let ours = completion_logits(&student, &batch, step.temperature, &device);
    let theirs = completion_logits(&teacher, &batch, step.temperature, &device).logits;
    let per_token = ours.per_token(full_reverse_kl(ours.logits.clone(), Tensor::from_inner(theirs)));
    let mask = batch.mask::<B>(&device);
    let loss = (per_token * mask.clone()).sum().div(mask.sum());
    let value = f64::from(loss.clone().into_scalar());
    assert!(
        (value - step.loss).abs() < 1e-6,
        "loss: rein {value} vs TRL {}",
        step.loss
    );

    let grads = GradientsParams::from_grads(loss.backward(), &student);
    let theirs = std::fs::read(fixtures.join("trl_distill_grads.safetensors")).unwrap();
    assert_gradients_match(
        &student,
        &grads,
        &SafeTensors::deserialize(&theirs).unwrap(),
        "",
        step.grad_norm,
    );
}
