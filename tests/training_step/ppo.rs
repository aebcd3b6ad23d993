//! PPO's token advantages, losses and value model against TRL's `PPOTrainer` formulas.

use super::*;

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
    let _graph = rein_model::one_graph();
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
        objective: PolicyObjective::Clip,
        clip_low: f.cliprange,
        clip_high: f.cliprange,
        dual_clip: None,
        aggregation: Aggregation::TokenMean,
        max_completion_len: width,
        kl_coef: 0.0,
        kl_estimator: KlEstimator::K1,
        kl_importance_weighted: false,
        entropy_coef: 0.0,
        top_entropy_quantile: 1.0,
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
