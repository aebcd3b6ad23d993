//! Every DPO loss type against TRL's `DPOTrainer`, both KTO loss types against TRL's
//! `KTOTrainer`, and the reward-model loss against TRL's `RewardTrainer`.

use super::*;

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
    let _graph = rein_model::one_graph();
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

/// The labelled completions of `trl_kto.json` with TRL's loss for each loss type.
#[derive(Deserialize)]
struct KtoFixture {
    beta: f32,
    desirable_weight: f32,
    undesirable_weight: f32,
    prompts: Vec<Vec<u32>>,
    completions: Vec<Vec<u32>>,
    labels: Vec<bool>,
    losses: std::collections::BTreeMap<String, f64>,
    kl: std::collections::BTreeMap<String, f64>,
    grad_norms: std::collections::BTreeMap<String, f64>,
}

/// Both KTO loss types against TRL's `KTOTrainer._compute_loss` on the same labelled completions
/// (fixture by `tests/fixtures/gen_trl_kto.py`; the policy the tiny Llama, the reference the tiny
/// Qwen2): the reference point from the rotated mismatched pairs, the loss within 1e-6 and each
/// gradient tensor within 1e-6 of the gradient's norm.
#[test]
fn kto_losses_match_trl() {
    let _graph = rein_model::one_graph();
    let fixtures = fixtures();
    let fixture: KtoFixture = read_json(&fixtures.join("trl_kto.json"));
    let device = Default::default();
    let reference = load::<Flex>(&fixtures.join("lm/qwen2-gqa"), &device).unwrap();
    let examples: Vec<LabelledCompletion> = (0..fixture.prompts.len())
        .map(|i| LabelledCompletion {
            prompt: fixture.prompts[i].clone(),
            completion: fixture.completions[i].clone(),
            desirable: fixture.labels[i],
        })
        .collect();
    let picked: Vec<usize> = (0..examples.len()).collect();
    let (batch, mismatched) = (
        labelled_batch(&examples, &picked, 0),
        mismatched_batch(&examples, &picked, 0),
    );
    let sums = |model: &CausalLm<Flex>, batch: &TokenBatch| {
        let (log_prob, _) = completion_log_probs(model, batch, 1.0, false, &device);
        let sums = (log_prob * batch.mask::<Flex>(&device)).sum_dim(1);
        sums.into_data().to_vec::<f32>().unwrap()
    };
    let (reference_matched, reference_mismatched) = (sums(&reference, &batch), sums(&reference, &mismatched));
    let theirs = std::fs::read(fixtures.join("trl_kto_grads.safetensors")).unwrap();
    let theirs = SafeTensors::deserialize(&theirs).unwrap();
    for (name, kind) in [
        ("kto", KtoLossKind::Kto),
        ("apo_zero_unpaired", KtoLossKind::ApoZeroUnpaired),
    ] {
        let policy = load::<B>(&fixtures.join("lm/llama"), &device).unwrap();
        let kl = reference_point(&policy.valid(), &mismatched, &reference_mismatched, &device);
        let config = KtoConfig {
            kind,
            beta: fixture.beta,
            desirable_weight: fixture.desirable_weight,
            undesirable_weight: fixture.undesirable_weight,
        };
        let (out, _) = kto_batch_loss(
            &policy,
            &batch,
            &fixture.labels,
            &reference_matched,
            kl,
            &config,
            &device,
        );
        // The reference point is a difference of log-probability sums (about −40 here): f32
        // rounding of the sums shows at 1e-6 of their size, not of the difference's.
        let scale = reference_mismatched
            .iter()
            .map(|s| f64::from(s.abs()))
            .fold(1.0, f64::max);
        assert!(
            (f64::from(out.kl) - fixture.kl[name]).abs() < 1e-6 * scale,
            "{name}: reference point rein {} vs TRL {}",
            out.kl,
            fixture.kl[name]
        );
        let loss = f64::from(out.loss.clone().into_scalar());
        let expected = fixture.losses[name];
        assert!((loss - expected).abs() < 1e-6, "{name}: rein {loss} vs TRL {expected}");
        let grads = GradientsParams::from_grads(out.loss.backward(), &policy);
        assert_gradients_match(&policy, &grads, &theirs, &format!("{name}/"), fixture.grad_norms[name]);
    }
    assert!(
        fixture.kl["kto"] > 0.0,
        "the fixture exercises an unclamped reference point"
    );
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
    let _graph = rein_model::one_graph();
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
