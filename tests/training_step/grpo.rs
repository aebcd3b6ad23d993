//! One GRPO step against PyTorch's: the tiny Qwen2's whole step, the newer families' backward
//! passes (fully and with LoRA), router replay, packed rows equal to the padded batch.

use super::*;

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

#[test]
fn one_grpo_step_matches_pytorch() {
    let _graph = rein_model::one_graph();
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
    let _graph = rein_model::one_graph();
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
        sequences: None,
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
