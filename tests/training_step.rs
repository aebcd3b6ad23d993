//! One GRPO training step of the tiny Qwen2 — the model's forward and backward passes, the
//! policy loss, gradient clipping and AdamW — against the same step in PyTorch (fixture written
//! by `tests/fixtures/gen_torch_step.py`): every parameter after the step within 1e-5 (1e-4
//! where its gradient is within a few ε of zero; see below). And on-policy distillation's full
//! reverse KL against TRL's `DistillationTrainer` loss (`gen_trl_distill.py`), every DPO loss
//! type against TRL's `DPOTrainer` (`gen_trl_dpo.py`), and the reward-model loss against TRL's
//! `RewardTrainer` (`gen_trl_reward.py`), and PPO's token advantages, losses and value model
//! against TRL's `PPOTrainer` formulas (`gen_trl_ppo.py`). The newer families (Qwen3, Gemma 3,
//! Gemma 2, Qwen3-MoE with its load-balancing loss) take the same GRPO loss's backward pass
//! against PyTorch's (`lm/gen_family_steps.py`), fully and with LoRA adapters (on every expert
//! of the MoE).

use std::path::Path;

use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module, ModuleMapper, Param};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::{Tensor, TensorData};
use rein_core::{Aggregation, KlEstimator, RatioLevel};
use rein_model::lm::{CausalLm, SequenceClassifier, load, peft, save};
use rein_optim::{
    DpoConfig, DpoLossKind, PolicyLossConfig, bradley_terry_loss, clip_grad_norm, full_reverse_kl, kl_estimate_scalar,
    masked_value_loss, masked_whiten, policy_loss, token_gae, token_rewards,
};
use rein_posttrain::{
    Critic, PreferencePair, TokenBatch, completion_log_probs, completion_logits, completion_outputs, dpo_batch_loss,
    pair_batch, pair_scores, reference_log_probs,
};
use safetensors::SafeTensors;
use serde::Deserialize;

type B = Autodiff<Flex>;

/// The batch and settings of `torch_grpo_step.json`, with PyTorch's loss and gradient norm.
#[derive(Deserialize)]
struct Step {
    lr: f64,
    betas: (f32, f32),
    eps: f32,
    weight_decay: f32,
    max_grad_norm: f32,
    temperature: f32,
    clip: f32,
    prompts: Vec<Vec<u32>>,
    completions: Vec<Vec<u32>>,
    old_log_prob: Vec<Vec<f32>>,
    advantages: Vec<f32>,
    loss: f64,
    grad_norm: f64,
}

fn f32s(view: &safetensors::tensor::TensorView<'_>) -> Vec<f32> {
    assert_eq!(view.dtype(), safetensors::Dtype::F32);
    view.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> T {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The fixture's prompt/completion pairs as one batch (padding id 0).
fn token_batch(prompts: &[Vec<u32>], completions: &[Vec<u32>]) -> TokenBatch {
    let pairs: Vec<(&[u32], &[u32])> = (prompts.iter().zip(completions))
        .map(|(p, c)| (p.as_slice(), c.as_slice()))
        .collect();
    TokenBatch::new(&pairs, 0)
}

#[test]
fn one_grpo_step_matches_pytorch() {
    let fixtures = fixtures();
    let step: Step = read_json(&fixtures.join("torch_grpo_step.json"));
    let device = Default::default();
    let model = load::<B>(&fixtures.join("lm/qwen2-gqa"), &device).unwrap();

    let batch = token_batch(&step.prompts, &step.completions);
    let (log_prob, _) = completion_log_probs(&model, &batch, step.temperature, false, &device);
    let old: Vec<&[f32]> = step.old_log_prob.iter().map(Vec::as_slice).collect();
    let advantages = Tensor::<B, 2>::from_data(TensorData::new(step.advantages.clone(), [batch.rows, 1]), &device);
    let config = token_level_loss(step.clip, batch.completion_width);
    let out = policy_loss(
        log_prob,
        Tensor::<B, 2>::from_data(
            TensorData::new(batch.per_token_values(&old), [batch.rows, batch.completion_width]),
            &device,
        ),
        advantages,
        batch.mask::<B>(&device),
        None,
        None,
        &config,
    );
    let loss = f64::from(out.loss.clone().into_scalar());
    assert!(
        (loss - step.loss).abs() < 1e-6,
        "loss: rein {loss} vs PyTorch {}",
        step.loss
    );

    let mut grads = GradientsParams::from_grads(out.loss.backward(), &model);
    let norm = f64::from(clip_grad_norm(&model, &mut grads, step.max_grad_norm));
    assert!(
        (norm - step.grad_norm).abs() < 1e-5 * step.grad_norm,
        "gradient norm: rein {norm} vs PyTorch {}",
        step.grad_norm
    );
    assert!(norm > f64::from(step.max_grad_norm), "the step exercises clipping");
    let mut optimizer = AdamWConfig::new()
        .with_beta_1(step.betas.0)
        .with_beta_2(step.betas.1)
        .with_epsilon(step.eps)
        .with_weight_decay(step.weight_decay)
        .init::<B, CausalLm<B>>();
    let model = optimizer.step(step.lr, model, grads);

    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("grpo-step");
    let _ = std::fs::remove_dir_all(&dir);
    save(&model, &dir).unwrap();
    let ours = std::fs::read(dir.join("model.safetensors")).unwrap();
    let ours = SafeTensors::deserialize(&ours).unwrap();
    let theirs = std::fs::read(fixtures.join("torch_grpo_step.safetensors")).unwrap();
    let theirs = SafeTensors::deserialize(&theirs).unwrap();
    let before = std::fs::read(fixtures.join("lm/qwen2-gqa/model.safetensors")).unwrap();
    let before = SafeTensors::deserialize(&before).unwrap();
    let (mut compared, mut moved) = (0, 0);
    for (name, view) in theirs.tensors() {
        let expected = f32s(&view);
        let got = f32s(&ours.tensor(&name).unwrap_or_else(|_| panic!("rein saved no `{name}`")));
        let start = f32s(&before.tensor(&name).unwrap());
        assert_eq!(got.len(), expected.len(), "{name}");
        for (i, ((g, e), s)) in got.iter().zip(&expected).zip(&start).enumerate() {
            // AdamW's first step moves each parameter by `lr · g/(|g| + ε)`: by nearly `lr` for
            // any real gradient, but for one within a few ε of zero (~1e-8) by an amount that
            // the last bits of the backward pass decide (two equally exact summation orders
            // give steps 2 % apart). Those parameters are held to the 1e-4 of issue 14.
            let settled = (e - s).abs() > 0.9 * step.lr as f32;
            let tolerance = if settled { 1e-5 } else { 1e-4 };
            assert!(
                (g - e).abs() < tolerance,
                "{name}[{i}]: rein {g} vs PyTorch {e} (before the step {s})"
            );
            moved += usize::from(e != s);
        }
        compared += expected.len();
    }
    assert!(
        moved > compared / 2,
        "the step moves most parameters ({moved} of {compared})"
    );
}

/// A `gen_family_steps.py` step: the batch, PyTorch's loss and gradient norm (and the MoE's
/// load-balancing loss).
#[derive(Deserialize)]
struct FamilyStep {
    temperature: f32,
    clip: f32,
    prompts: Vec<Vec<u32>>,
    completions: Vec<Vec<u32>>,
    old_log_prob: Vec<Vec<f32>>,
    advantages: Vec<f32>,
    loss: f64,
    grad_norm: f64,
    aux_loss: Option<f64>,
}

/// Qwen3, Gemma 3, Gemma 2 and Qwen3-MoE: the GRPO loss (with the MoE's load-balancing loss at
/// the config's coefficient) within 1e-6 of PyTorch's and every gradient within 1e-6 of the
/// larger of its norm and the whole gradient's, training every parameter and training LoRA
/// adapters (loaded from the fixture in PEFT's format: attention, dense MLPs, every expert).
#[test]
fn a_grpo_step_of_the_newer_families_matches_pytorch() {
    for name in ["qwen3", "gemma3", "gemma2", "qwen3-moe"] {
        for lora in [false, true] {
            family_step(name, lora);
        }
    }
}

fn family_step(name: &str, lora: bool) {
    let fixtures = fixtures().join("lm");
    let tag = if lora { format!("{name}-lora") } else { name.to_string() };
    let step: FamilyStep = read_json(&fixtures.join(format!("{tag}.step.json")));
    let device = Default::default();
    let mut model = load::<B>(&fixtures.join(name), &device).unwrap();
    if lora {
        model = peft::load_adapter(model, &fixtures.join(&tag), &device).unwrap();
    }
    let batch = token_batch(&step.prompts, &step.completions);
    let out = completion_outputs(&model, &batch, step.temperature, false, None, &device);
    let old: Vec<&[f32]> = step.old_log_prob.iter().map(Vec::as_slice).collect();
    let config = token_level_loss(step.clip, batch.completion_width);
    let advantages = Tensor::<B, 2>::from_data(TensorData::new(step.advantages.clone(), [batch.rows, 1]), &device);
    let old = Tensor::from_data(
        TensorData::new(batch.per_token_values(&old), [batch.rows, batch.completion_width]),
        &device,
    );
    let policy = policy_loss(
        out.log_prob,
        old,
        advantages,
        batch.mask::<B>(&device),
        None,
        None,
        &config,
    );
    let loss = match (&out.routing, step.aux_loss) {
        (Some(routing), Some(theirs)) => {
            let aux = routing.load_balancing_loss().unwrap();
            let ours = f64::from(aux.clone().into_scalar());
            assert!(
                (ours - theirs).abs() < 1e-6,
                "{tag}: load-balancing loss {ours} vs {theirs}"
            );
            let coef = model.config().router_aux_loss_coef.unwrap() as f32;
            policy.loss + aux.mul_scalar(coef)
        }
        (None, None) => policy.loss,
        _ => panic!("{tag}: a load-balancing loss on one side only"),
    };
    let value = f64::from(loss.clone().into_scalar());
    assert!(
        (value - step.loss).abs() < 1e-6,
        "{tag}: loss {value} vs PyTorch {}",
        step.loss
    );
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let theirs = std::fs::read(fixtures.join(format!("{tag}.step.safetensors"))).unwrap();
    let theirs = SafeTensors::deserialize(&theirs).unwrap();
    if !lora {
        assert_gradients_match(&model, &grads, &theirs, "", step.grad_norm);
        return;
    }
    // The adapters' gradients, saved as adapters are (PEFT's names and layout).
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("grads-{tag}"));
    let _ = std::fs::remove_dir_all(&dir);
    peft::save_adapter(&model.valid().map(&mut GradientsAsValues { grads: &grads }), &dir, name).unwrap();
    assert_gradients_file_matches(&dir.join(peft::WEIGHTS_FILE), &theirs, "", step.grad_norm);
}

/// Router replay: what the sampler records of a mixture of experts' routing is what the trainer's
/// forward pass on the same tokens would choose itself (no token differs), and its log-
/// probabilities are the sampler's; given other experts, the trainer routes by them when
/// `replay_routes` is set (the record comes back from its routing, the log-probabilities move)
/// and only counts every token as differing when it is not (the log-probabilities stay).
#[test]
fn router_replay_routes_the_trainer_as_the_sampler_routed() {
    let device = Default::default();
    let model = load::<Flex>(&fixtures().join("lm/qwen3-moe"), &device).unwrap();
    let layers = model.config().num_hidden_layers;
    let k = model.config().moe().unwrap().top_k;
    let prompts: Vec<Vec<u32>> = vec![vec![5, 17, 300, 42, 7], vec![64, 3, 3]];
    let config = rein_sampler::GenerationConfig {
        max_new_tokens: 6,
        temperature: 1.0,
        n: 2,
        seed: 3,
        ..Default::default()
    };
    let generations = rein_sampler::generate(&model, &prompts, &config, 0, &mut |_, _| false, &device);
    let pairs: Vec<(&[u32], &[u32])> = (generations.iter())
        .map(|g| (prompts[g.prompt].as_slice(), g.tokens.as_slice()))
        .collect();
    let routed: usize = pairs.iter().map(|(p, c)| p.len() + c.len() - 1).sum();
    for g in &generations {
        let routes = g.routes.as_ref().expect("the sampler records a MoE's routing");
        let tokens = prompts[g.prompt].len() + g.tokens.len() - 1;
        assert_eq!(routes[0].len(), tokens * k, "prompt and completion but its last token");
        assert!(routes[1].is_empty(), "layer 1 is dense");
    }
    let mut batch = TokenBatch::new(&pairs, 0);
    batch.routes = generations.iter().map(|g| g.routes.clone()).collect();
    let run = |batch: &TokenBatch| {
        let out = completion_outputs(&model, batch, 1.0, false, None, &device);
        let routing = out.routing.expect("a MoE's routing");
        let log_prob: Vec<f32> = out.log_prob.into_data().to_vec().unwrap();
        (log_prob, routing.disagreement(), routing.chosen(layers))
    };
    // As sampled: the trainer's own choice is the sampler's, token for token.
    let (free, (differing, compared), _) = run(&batch);
    assert_eq!((differing, compared), (0, 2 * routed), "two sparse layers");
    let sampled = batch.per_token_values(&generations.iter().map(|g| g.logprobs.as_slice()).collect::<Vec<_>>());
    for (i, (t, s)) in free.iter().zip(&sampled).enumerate() {
        assert!((t - s).abs() < 1e-4, "token {i}: trainer {t} vs sampler {s}");
    }
    // Other experts recorded: followed with replay, only compared without.
    let shifted: Vec<Option<Vec<Vec<u32>>>> = (batch.routes.iter())
        .map(|r| {
            r.as_ref().map(|layers| {
                layers
                    .iter()
                    .map(|l| l.iter().map(|&e| (e + 1) % 8).collect())
                    .collect()
            })
        })
        .collect();
    batch.routes = shifted.clone();
    batch.replay_routes = true;
    let (replayed, (differing, compared), chosen) = run(&batch);
    assert_eq!(differing, compared, "every token's record differs from its own choice");
    assert_ne!(replayed, free, "the recorded experts were used");
    let packed: Vec<u32> = shifted.iter().flat_map(|r| r.as_ref().unwrap()[0].clone()).collect();
    assert_eq!(chosen[0], packed, "layer 0 routed as recorded");
    batch.replay_routes = false;
    let (compared_only, (differing, _), _) = run(&batch);
    assert_eq!(compared_only, free, "without replay the record changes nothing");
    assert_eq!(differing, 2 * routed);
}

/// `completion_log_probs` runs the model over the rows packed end to end; the same numbers
/// come from the padded batch (prompts left-padded, completions right-padded) through the
/// model's logits, for prompts and completions of every length, an empty prompt included.
#[test]
fn packed_log_probs_equal_the_padded_batch() {
    use burn::tensor::Int;
    use rein_model::lm::Context;

    let fixtures = fixtures();
    let device = Default::default();
    let model = load::<B>(&fixtures.join("lm/qwen2-gqa"), &device).unwrap();
    let prompts: [&[u32]; 4] = [&[5, 6, 7, 8, 9], &[11], &[], &[3, 4]];
    let completions: [&[u32]; 4] = [&[12, 13], &[14, 15, 16, 17, 18, 19], &[20, 21, 22], &[23]];
    let pairs: Vec<(&[u32], &[u32])> = prompts.iter().copied().zip(completions.iter().copied()).collect();
    let batch = TokenBatch::new(&pairs, 0);
    let temperature = 0.7;
    let (log_prob, entropy) = completion_log_probs(&model, &batch, temperature, true, &device);
    let (log_prob, entropy) = (
        log_prob.into_data().to_vec::<f32>().unwrap(),
        entropy.unwrap().into_data().to_vec::<f32>().unwrap(),
    );

    let (rows, p, c) = (batch.rows, batch.prompt_width, batch.completion_width);
    let width = p + c;
    let rope = model.rope(width, &device);
    let padding = batch.padding.iter().map(|&b| i64::from(b)).collect::<Vec<_>>();
    let ctx = Context {
        rope: &rope,
        positions: Tensor::from_data(TensorData::new(batch.positions.clone(), [rows, width]), &device),
        padding: Some(Tensor::<B, 2, Int>::from_data(TensorData::new(padding, [rows, width]), &device).bool()),
        sequence_lengths: None,
        fused: None,
        routing: None,
    };
    let tokens = Tensor::from_data(TensorData::new(batch.tokens.clone(), [rows, width]), &device);
    let logits = model.forward(tokens, &ctx, None).div_scalar(temperature);
    let log_p = burn::tensor::activation::log_softmax(logits, 2)
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    let vocab = model.config().vocab_size;
    let mut compared = 0;
    for row in 0..rows {
        for j in 0..completions[row].len() {
            let at = &log_p[(row * width + p - 1 + j) * vocab..][..vocab];
            let expected = at[completions[row][j] as usize];
            let expected_entropy: f32 = -at.iter().map(|&l| l.exp() * l).sum::<f32>();
            let (got, got_entropy) = (log_prob[row * c + j], entropy[row * c + j]);
            assert!(
                (got - expected).abs() < 1e-5,
                "row {row} token {j}: log-prob {got} vs padded {expected}"
            );
            assert!(
                (got_entropy - expected_entropy).abs() < 1e-4,
                "row {row} token {j}: entropy {got_entropy} vs padded {expected_entropy}"
            );
            compared += 1;
        }
        for j in completions[row].len()..c {
            assert_eq!(log_prob[row * c + j], 0.0, "row {row}: padding position {j}");
        }
    }
    assert_eq!(compared, 12);
}

/// The batch of `trl_distill.json` with TRL's loss.
#[derive(Deserialize)]
struct Distill {
    temperature: f32,
    prompts: Vec<Vec<u32>>,
    completions: Vec<Vec<u32>>,
    loss: f64,
    grad_norm: f64,
}

/// Each parameter's gradient in place of its value.
struct GradientsAsValues<'a> {
    grads: &'a GradientsParams,
}

impl ModuleMapper<Flex> for GradientsAsValues<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<Flex, D>>) -> Param<Tensor<Flex, D>> {
        let (id, value, mapper) = param.consume();
        let grad = (self.grads.get::<Flex, D>(id)).unwrap_or_else(|| value.zeros_like());
        Param::from_mapped_value(id, grad, mapper)
    }
}

/// Each of `model`'s gradients in `grads` equals the fixture's tensor `<prefix><Hugging Face
/// name>` within 1e-6 of the larger of its norm and the whole gradient's (`grad_norm`), every
/// parameter has one, and together they have the fixture's norm.
fn assert_gradients_match(
    model: &CausalLm<B>,
    grads: &GradientsParams,
    theirs: &SafeTensors,
    prefix: &str,
    grad_norm: f64,
) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("grads-{}", prefix.trim_end_matches('/')));
    let _ = std::fs::remove_dir_all(&dir);
    save(&model.valid().map(&mut GradientsAsValues { grads }), &dir).unwrap();
    assert_saved_gradients_match(&dir, theirs, prefix, grad_norm);
}

/// As [`assert_gradients_match`], for gradients saved as a model in `dir`.
fn assert_saved_gradients_match(dir: &Path, theirs: &SafeTensors, prefix: &str, grad_norm: f64) {
    assert_gradients_file_matches(&dir.join("model.safetensors"), theirs, prefix, grad_norm);
}

/// As [`assert_gradients_match`], for gradients saved in the safetensors file `file`.
fn assert_gradients_file_matches(file: &Path, theirs: &SafeTensors, prefix: &str, grad_norm: f64) {
    let ours = std::fs::read(file).unwrap();
    let ours = SafeTensors::deserialize(&ours).unwrap();
    let (mut norm, mut compared) = (0.0f64, 0);
    for (name, view) in theirs.tensors() {
        let Some(name) = name.strip_prefix(prefix) else {
            continue;
        };
        let expected = f32s(&view);
        let got = f32s(
            &ours
                .tensor(name)
                .unwrap_or_else(|_| panic!("rein has no gradient `{name}`")),
        );
        let size = expected.iter().map(|&e| f64::from(e).powi(2)).sum::<f64>().sqrt();
        let error = (got.iter().zip(&expected))
            .map(|(&g, &e)| f64::from(g - e).powi(2))
            .sum::<f64>()
            .sqrt();
        assert!(
            error <= 1e-6 * grad_norm.max(size),
            "gradient of {prefix}{name}: ‖rein − reference‖ = {error:e} (‖reference‖ = {size:e})"
        );
        norm += size * size;
        compared += 1;
    }
    assert_eq!(
        compared,
        ours.tensors().len(),
        "every parameter has a gradient in the fixture ({prefix})"
    );
    assert!(
        (norm.sqrt() - grad_norm).abs() < 1e-5 * grad_norm,
        "gradient norm ({prefix})"
    );
}

/// `teacher.kl = "full"`: the reverse KL over the vocabulary at each completion position,
/// averaged over the batch's completion tokens, equals TRL's `DistillationTrainer` loss at β = 1
/// (its `_chunked_divergence_loss`; fixture by `tests/fixtures/gen_trl_distill.py`), and so do
/// the student's gradients, tensor by tensor.
#[test]
fn full_reverse_kl_matches_trl_distillation() {
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

/// The pairs of `trl_dpo.json` with TRL's loss for each loss type.
#[derive(Deserialize)]
struct DpoFixture {
    beta: f32,
    label_smoothing: f32,
    sft_weight: f32,
    optimizer: DpoOptimizer,
    prompts: Vec<Vec<u32>>,
    chosen: Vec<Vec<u32>>,
    rejected: Vec<Vec<u32>>,
    losses: std::collections::BTreeMap<String, f64>,
    grad_norms: std::collections::BTreeMap<String, f64>,
}

#[derive(Deserialize)]
struct DpoOptimizer {
    lr: f64,
    betas: (f32, f32),
    eps: f32,
    weight_decay: f32,
    max_grad_norm: f32,
}

/// Every DPO loss type, and RPO's added likelihood term, against TRL's `DPOTrainer._compute_loss` on the same pairs (fixture by
/// `tests/fixtures/gen_trl_dpo.py`; the policy the tiny Qwen2, the reference the tiny Llama):
/// the loss within 1e-6 (relative, above 1) and each gradient tensor within 1e-6 of the gradient's norm; then, for
/// `sigmoid`, clipping and one AdamW step against PyTorch's, parameter by parameter.
#[test]
fn dpo_losses_match_trl() {
    let fixtures = fixtures();
    let fixture: DpoFixture = read_json(&fixtures.join("trl_dpo.json"));
    let device = Default::default();
    let reference = load::<Flex>(&fixtures.join("lm/llama"), &device).unwrap();
    let pairs: Vec<PreferencePair> = (0..fixture.prompts.len())
        .map(|i| PreferencePair {
            prompt: fixture.prompts[i].clone(),
            chosen: fixture.chosen[i].clone(),
            rejected: fixture.rejected[i].clone(),
            margin: 0.0,
        })
        .collect();
    let batch = pair_batch(&pairs, &[0, 1, 2, 3], 0);
    let reference = reference_log_probs(&reference, &batch, &device);
    let theirs = std::fs::read(fixtures.join("trl_dpo_grads.safetensors")).unwrap();
    let theirs = SafeTensors::deserialize(&theirs).unwrap();
    let cases = [
        ("sigmoid", DpoLossKind::Sigmoid, 0.0),
        ("hinge", DpoLossKind::Hinge, 0.0),
        ("ipo", DpoLossKind::Ipo, 0.0),
        ("robust", DpoLossKind::Robust, 0.0),
        ("rpo", DpoLossKind::Sigmoid, fixture.sft_weight),
    ];
    for (name, kind, sft_weight) in cases {
        let policy = load::<B>(&fixtures.join("lm/qwen2-gqa"), &device).unwrap();
        let smoothing = if kind == DpoLossKind::Robust {
            fixture.label_smoothing
        } else {
            0.0
        };
        let config = DpoConfig {
            kind,
            beta: fixture.beta,
            label_smoothing: smoothing,
            sft_weight,
        };
        let (out, _) = dpo_batch_loss(&policy, &batch, &reference, &config, &device);
        let loss = f64::from(out.loss.clone().into_scalar());
        let expected = fixture.losses[name];
        // 1e-6 relative: IPO's loss (~6 here) squares the margin, so f32 rounding of the
        // log-probability sums shows at its magnitude.
        assert!(
            (loss - expected).abs() < 1e-6 * expected.abs().max(1.0),
            "{name}: rein {loss} vs TRL {expected}"
        );
        let mut grads = GradientsParams::from_grads(out.loss.backward(), &policy);
        let grad_norm = fixture.grad_norms[name];
        assert_gradients_match(&policy, &grads, &theirs, &format!("{name}/"), grad_norm);
        if name != "sigmoid" {
            continue;
        }
        let o = &fixture.optimizer;
        assert!(grad_norm > f64::from(o.max_grad_norm), "the step exercises clipping");
        clip_grad_norm(&policy, &mut grads, o.max_grad_norm);
        let mut optimizer = AdamWConfig::new()
            .with_beta_1(o.betas.0)
            .with_beta_2(o.betas.1)
            .with_epsilon(o.eps)
            .with_weight_decay(o.weight_decay)
            .init::<B, CausalLm<B>>();
        let stepped = optimizer.step(o.lr, policy, grads);
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dpo-step");
        let _ = std::fs::remove_dir_all(&dir);
        save(&stepped, &dir).unwrap();
        let ours = std::fs::read(dir.join("model.safetensors")).unwrap();
        let ours = SafeTensors::deserialize(&ours).unwrap();
        let mut compared = 0;
        for (name, view) in theirs.tensors() {
            let Some(name) = name.strip_prefix("step/") else {
                continue;
            };
            let (got, expected) = (f32s(&ours.tensor(name).unwrap()), f32s(&view));
            for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                // As in the GRPO step: all within 1e-4 and nearly all within 1e-5; a gradient
                // within a few ε of zero makes AdamW's first step depend on its last bits.
                assert!((g - e).abs() < 1e-4, "{name}[{i}]: rein {g} vs PyTorch {e}");
            }
            let close = got
                .iter()
                .zip(&expected)
                .filter(|(g, e)| (*g - *e).abs() < 1e-5)
                .count();
            assert!(
                close * 100 >= got.len() * 99,
                "{name}: {close} of {} within 1e-5",
                got.len()
            );
            compared += 1;
        }
        assert_eq!(compared, ours.tensors().len(), "every parameter after the step");
    }
}

/// The pairs of `trl_reward.json` with TRL's loss.
#[derive(Deserialize)]
struct RewardFixture {
    center_rewards_coefficient: f32,
    score: Vec<f32>,
    prompts: Vec<Vec<u32>>,
    chosen: Vec<Vec<u32>>,
    rejected: Vec<Vec<u32>>,
    margins: Vec<f32>,
    loss: f64,
    grad_norm: f64,
}

/// Reward-model training's Bradley–Terry loss, with margins and TRL's centering term, against
/// TRL's `RewardTrainer.compute_loss` on the same pairs (fixture by
/// `tests/fixtures/gen_trl_reward.py`; the tiny Qwen2's decoder with a fresh one-score head):
/// the loss within 1e-6 and each gradient tensor, the score head's included, within 1e-6 of the
/// gradient's norm.
#[test]
fn the_reward_model_loss_matches_trl() {
    let fixtures = fixtures();
    let fixture: RewardFixture = read_json(&fixtures.join("trl_reward.json"));
    let device = Default::default();
    let decoder = load::<B>(&fixtures.join("lm/qwen2-gqa"), &device).unwrap();
    let hidden = fixture.score.len();
    let score = Tensor::<B, 2>::from_data(TensorData::new(fixture.score.clone(), [hidden, 1]), &device);
    let model = SequenceClassifier::with_score(decoder, score, Some(0));
    let pairs: Vec<PreferencePair> = (0..fixture.prompts.len())
        .map(|i| PreferencePair {
            prompt: fixture.prompts[i].clone(),
            chosen: fixture.chosen[i].clone(),
            rejected: fixture.rejected[i].clone(),
            margin: fixture.margins[i],
        })
        .collect();
    let picked: Vec<&PreferencePair> = pairs.iter().collect();
    let scores = pair_scores(&model, &picked, &device);
    let margin = Tensor::<B, 1>::from_data(TensorData::new(fixture.margins.clone(), [pairs.len()]), &device);
    let loss = bradley_terry_loss(
        scores.chosen,
        scores.rejected,
        margin,
        fixture.center_rewards_coefficient,
    );
    let value = f64::from(loss.clone().into_scalar());
    assert!(
        (value - fixture.loss).abs() < 1e-6,
        "loss: rein {value} vs TRL {}",
        fixture.loss
    );
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("reward-grads");
    let _ = std::fs::remove_dir_all(&dir);
    model
        .valid()
        .map(&mut GradientsAsValues { grads: &grads })
        .save(&dir)
        .unwrap();
    let theirs = std::fs::read(fixtures.join("trl_reward_grads.safetensors")).unwrap();
    assert_saved_gradients_match(&dir, &SafeTensors::deserialize(&theirs).unwrap(), "", fixture.grad_norm);
}

/// The inputs and TRL's results of `trl_ppo.json`, `[rows, width]` row-major.
#[derive(Deserialize)]
struct PpoFixture {
    width: usize,
    lengths: Vec<usize>,
    kl_coef: f32,
    gamma: f32,
    lam: f32,
    cliprange: f32,
    cliprange_value: f32,
    vf_coef: f32,
    logprobs: Vec<f32>,
    ref_logprobs: Vec<f32>,
    values: Vec<f32>,
    scores: Vec<f32>,
    new_logprobs: Vec<f32>,
    new_values: Vec<f32>,
    cases: std::collections::BTreeMap<String, PpoCase>,
    minibatch: Vec<usize>,
    loss: f64,
    pg_loss: f64,
    vf_loss: f64,
    grad_logprobs: Vec<f64>,
    grad_values: Vec<f64>,
    critic_score: Vec<f32>,
    critic_rows: Vec<CriticRow>,
}

#[derive(Deserialize)]
struct PpoCase {
    kl: Vec<f64>,
    rewards: Vec<f64>,
    raw_advantages: Vec<f64>,
    returns: Vec<f64>,
    advantages: Vec<f64>,
}

#[derive(Deserialize)]
struct CriticRow {
    prompt: Vec<u32>,
    completion: Vec<u32>,
    values: Vec<f64>,
}

fn assert_close(what: &str, ours: &[f32], theirs: &[f64], tolerance: f64) {
    assert_eq!(ours.len(), theirs.len(), "{what}: lengths");
    for (i, (&a, &b)) in ours.iter().zip(theirs).enumerate() {
        assert!(
            (f64::from(a) - b).abs() <= tolerance * (1.0 + b.abs()),
            "{what}[{i}]: rein {a} vs TRL {b}"
        );
    }
}

/// PPO with a critic on a language model against TRL's `PPOTrainer` formulas (fixture by
/// `tests/fixtures/gen_trl_ppo.py`): the per-token KL penalty and rewards (the score on the last
/// token), GAE's advantages and returns, whitened advantages, with and without whitened
/// rewards; one minibatch's policy and value losses and their gradients with respect to the new
/// log-probabilities and values, all within 1e-6; and a value model's per-token values (the
/// tiny Qwen2's decoder with a one-score head) within 1e-5 of transformers'.
#[test]
fn ppo_advantages_and_losses_match_trl() {
    let fixtures = fixtures();
    let f: PpoFixture = read_json(&fixtures.join("trl_ppo.json"));
    let width = f.width;
    let mask: Vec<f32> = (f.lengths.iter())
        .flat_map(|&len| (0..width).map(move |t| if t < len { 1.0 } else { 0.0 }))
        .collect();
    let kl: Vec<f32> = (f.logprobs.iter().zip(&f.ref_logprobs).zip(&mask))
        .map(|((&lp, &r), &m)| {
            if m > 0.0 {
                kl_estimate_scalar(lp, r, KlEstimator::K1)
            } else {
                0.0
            }
        })
        .collect();
    let mut targets = None;
    for (name, case) in &f.cases {
        assert_close(&format!("{name} kl"), &kl, &case.kl, 1e-6);
        let mut rewards = token_rewards(&f.scores, &kl, &mask, width, f.kl_coef);
        if name == "whiten_rewards" {
            rewards = masked_whiten(&rewards, &mask, false);
        }
        assert_close(&format!("{name} rewards"), &rewards, &case.rewards, 1e-6);
        let out = token_gae(&rewards, &f.values, &mask, width, f.gamma, f.lam);
        assert_close(
            &format!("{name} advantages before whitening"),
            &out.advantages,
            &case.raw_advantages,
            1e-6,
        );
        assert_close(&format!("{name} returns"), &out.returns, &case.returns, 1e-6);
        let advantages = masked_whiten(&out.advantages, &mask, true);
        assert_close(
            &format!("{name} whitened advantages"),
            &advantages,
            &case.advantages,
            1e-6,
        );
        if name == "plain" {
            targets = Some((advantages, out.returns));
        }
    }
    let (advantages, returns) = targets.expect("the fixture has the plain case");

    // One minibatch's loss, as rein's PPO computes it, and its gradients.
    let device = Default::default();
    let picked = |values: &[f32]| -> Tensor<B, 2> {
        let rows: Vec<f32> = (f.minibatch.iter())
            .flat_map(|&row| values[row * width..(row + 1) * width].iter().copied())
            .collect();
        Tensor::from_data(TensorData::new(rows, [f.minibatch.len(), width]), &device)
    };
    let new_log_prob = picked(&f.new_logprobs).require_grad();
    let new_values = picked(&f.new_values).require_grad();
    let config = PolicyLossConfig {
        level: RatioLevel::Token,
        clip_low: f.cliprange,
        clip_high: f.cliprange,
        dual_clip: None,
        aggregation: Aggregation::TokenMean,
        max_completion_len: width,
        kl_coef: 0.0,
        kl_estimator: KlEstimator::K1,
        kl_importance_weighted: false,
        entropy_coef: 0.0,
    };
    let policy = policy_loss(
        new_log_prob.clone(),
        picked(&f.logprobs),
        picked(&advantages),
        picked(&mask),
        None,
        None,
        &config,
    );
    let value = masked_value_loss(
        new_values.clone(),
        picked(&f.values),
        picked(&returns),
        picked(&mask),
        Some(f.cliprange_value),
    );
    let loss = policy.loss.clone() + value.clone().mul_scalar(f.vf_coef);
    let scalar = |t: Tensor<B, 1>| f64::from(t.into_scalar());
    for (what, ours, theirs) in [
        ("policy loss", scalar(policy.loss), f.pg_loss),
        ("value loss", scalar(value), f.vf_loss),
        ("loss", scalar(loss.clone()), f.loss),
    ] {
        assert!((ours - theirs).abs() < 1e-6, "{what}: rein {ours} vs TRL {theirs}");
    }
    let grads = loss.backward();
    let grad = |t: &Tensor<B, 2>| -> Vec<f32> { t.grad(&grads).unwrap().into_data().to_vec().unwrap() };
    assert_close("d loss / d log-probs", &grad(&new_log_prob), &f.grad_logprobs, 1e-6);
    assert_close("d loss / d values", &grad(&new_values), &f.grad_values, 1e-6);

    // The value model's values before each completion token.
    let decoder = load::<B>(&fixtures.join("lm/qwen2-gqa"), &device).unwrap();
    let hidden = f.critic_score.len();
    let score = Tensor::<B, 2>::from_data(TensorData::new(f.critic_score.clone(), [hidden, 1]), &device);
    let critic = Critic::from_reward_model(SequenceClassifier::with_score(decoder.clone(), score, Some(0))).unwrap();
    let prompts: Vec<Vec<u32>> = f.critic_rows.iter().map(|r| r.prompt.clone()).collect();
    let completions: Vec<Vec<u32>> = f.critic_rows.iter().map(|r| r.completion.clone()).collect();
    let batch = token_batch(&prompts, &completions);
    let values: Vec<f32> = critic.values(&decoder, &batch, &device).into_data().to_vec().unwrap();
    for (i, row) in f.critic_rows.iter().enumerate() {
        let ours = &values[i * batch.completion_width..][..row.values.len()];
        assert_close(&format!("critic row {i}"), ours, &row.values, 1e-5);
    }
}

/// The fixtures' policy loss: token-level ratios clipped at `clip` on both sides, sequence-mean
/// of token means, no KL or entropy term (TRL's GRPO loss as the step scripts compute it).
fn token_level_loss(clip: f32, max_completion_len: usize) -> PolicyLossConfig {
    PolicyLossConfig {
        level: RatioLevel::Token,
        clip_low: clip,
        clip_high: clip,
        dual_clip: None,
        aggregation: Aggregation::SeqMeanTokenMean,
        max_completion_len,
        kl_coef: 0.0,
        kl_estimator: KlEstimator::K3,
        kl_importance_weighted: false,
        entropy_coef: 0.0,
    }
}
