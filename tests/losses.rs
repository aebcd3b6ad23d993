//! The GRPO-family losses against TRL's `GRPOTrainer._compute_loss` on fixed log-probabilities,
//! advantages and masks, and their gradients with respect to the log-probabilities against
//! PyTorch autograd (fixture written by `tests/fixtures/gen_trl_loss.py`; the TRL version is in
//! the fixture's `generated_by`): the clipped objective with each aggregation, CISPO, SAPO and the
//! top-entropy token mask; GDPO's advantages against TRL's `normalize_then_sum` branch; the pass@k
//! advantages against verl's `grpo_passk` and the pass@k paper's formula; the adaptive entropy
//! coefficient against TRL's controller; PRIME's token advantages from process rewards against
//! its equations with verl's whitening, and its implicit PRM's loss and token rewards against the
//! equations of verl's recipe.

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Tensor, TensorData};
use rein_optim::{Aggregation, KlEstimator, PolicyLossConfig, PolicyObjective, RatioLevel, policy_loss};
use serde::Deserialize;

type B = Autodiff<Flex>;

#[derive(Deserialize)]
struct Fixture {
    max_completion_length: usize,
    mask: Vec<Vec<f32>>,
    log_prob: Vec<Vec<f32>>,
    old_log_prob: Vec<Vec<f32>>,
    ref_log_prob: Vec<Vec<f32>>,
    advantages: Vec<f32>,
    entropy: Vec<Vec<f32>>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    loss_type: String,
    level: String,
    beta: f32,
    epsilon_low: f32,
    epsilon_high: f32,
    sapo_temperature_pos: f32,
    sapo_temperature_neg: f32,
    top_entropy_quantile: f32,
    loss: f64,
    grad_log_prob: Vec<Vec<f32>>,
}

fn matrix(rows: &[Vec<f32>]) -> Tensor<B, 2> {
    let cols = rows[0].len();
    Tensor::from_data(TensorData::new(rows.concat(), [rows.len(), cols]), &Default::default())
}

#[test]
fn policy_losses_and_their_gradients_match_trl() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/trl_grpo_loss.json");
    let f: Fixture = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(f.cases.len(), 23);
    for case in &f.cases {
        // TRL's loss types name an objective and an aggregation at once.
        let sapo = PolicyObjective::Sapo {
            temperature_pos: case.sapo_temperature_pos,
            temperature_neg: case.sapo_temperature_neg,
        };
        let cispo = PolicyObjective::Cispo {
            max_weight: case.epsilon_high,
        };
        let (objective, aggregation) = match case.loss_type.as_str() {
            "grpo" => (PolicyObjective::Clip, Aggregation::SeqMeanTokenMean),
            "dapo" => (PolicyObjective::Clip, Aggregation::TokenMean),
            "dr_grpo" => (PolicyObjective::Clip, Aggregation::SeqMeanTokenSumNorm),
            "cispo" => (cispo, Aggregation::TokenMean),
            "sapo" => (sapo, Aggregation::SeqMeanTokenMean),
            other => panic!("unexpected loss type {other}"),
        };
        let config = PolicyLossConfig {
            level: if case.level == "sequence" {
                RatioLevel::Sequence
            } else {
                RatioLevel::Token
            },
            objective,
            clip_low: case.epsilon_low,
            clip_high: case.epsilon_high,
            dual_clip: None,
            aggregation,
            max_completion_len: f.max_completion_length,
            kl_coef: case.beta,
            kl_estimator: KlEstimator::K3,
            kl_importance_weighted: true,
            entropy_coef: 0.0,
            top_entropy_quantile: case.top_entropy_quantile,
        };
        let label = format!(
            "{} {} β={} ε_high={} τ=({}, {}) ρ={}",
            case.loss_type,
            case.level,
            case.beta,
            case.epsilon_high,
            case.sapo_temperature_pos,
            case.sapo_temperature_neg,
            case.top_entropy_quantile
        );
        let reference = (case.beta != 0.0).then(|| matrix(&f.ref_log_prob));
        let advantages = Tensor::from_data(
            TensorData::new(f.advantages.clone(), [f.advantages.len(), 1]),
            &Default::default(),
        );
        let log_prob = matrix(&f.log_prob).require_grad();
        let out = policy_loss(
            log_prob.clone(),
            matrix(&f.old_log_prob),
            advantages,
            matrix(&f.mask),
            reference,
            (case.top_entropy_quantile < 1.0).then(|| matrix(&f.entropy)),
            &config,
        );
        let grads = out.loss.backward();
        let grad: Vec<f32> = log_prob.grad(&grads).unwrap().into_data().to_vec().unwrap();
        for (at, (rein, torch)) in grad.iter().zip(case.grad_log_prob.concat()).enumerate() {
            assert!(
                (rein - torch).abs() < 1e-6,
                "{label}: ∂loss/∂log_prob[{}][{}]: rein {rein:.9} vs PyTorch {torch:.9}",
                at / f.mask[0].len(),
                at % f.mask[0].len()
            );
        }
        let loss = f64::from(out.loss.into_scalar());
        assert!(
            (loss - case.loss).abs() < 1e-6,
            "{label}: rein {loss:.9} vs TRL {:.9}",
            case.loss
        );
    }
}

#[derive(Deserialize)]
struct GdpoFixture {
    trl_version: String,
    cases: Vec<GdpoCase>,
}

#[derive(Deserialize)]
struct GdpoCase {
    name: String,
    rewards: Vec<Vec<Option<f64>>>,
    weights: Vec<f64>,
    group_size: usize,
    advantages: Vec<f64>,
}

/// GDPO's advantages against TRL's `normalize_then_sum` branch, run on the same per-reward
/// scores (fixture written by `tests/fixtures/gen_trl_gdpo.py`).
#[test]
fn gdpo_advantages_match_trls_normalize_then_sum() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/trl_gdpo.json");
    let f: GdpoFixture = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(f.cases.len() >= 6, "TRL {}: too few cases", f.trl_version);
    for case in &f.cases {
        let rewards: Vec<Vec<f64>> = (case.rewards.iter())
            .map(|column| column.iter().map(|r| r.unwrap_or(f64::NAN)).collect())
            .collect();
        let got = rein_optim::decoupled_normalized(&rewards, &case.weights, case.group_size);
        assert_advantages(
            &got,
            &case.advantages,
            &format!("{} (TRL {})", case.name, f.trl_version),
        );
    }
}

#[derive(Deserialize)]
struct PassAtKFixture {
    verl_version: String,
    grpo_passk: Vec<BestOfGroupCase>,
    pass_at_k: Vec<PassAtKCase>,
}

#[derive(Deserialize)]
struct BestOfGroupCase {
    rewards: Vec<f32>,
    group_size: usize,
    scale_by_std: bool,
    advantages: Vec<f64>,
}

#[derive(Deserialize)]
struct PassAtKCase {
    correct: Vec<bool>,
    group_size: usize,
    k: usize,
    advantages: Vec<f64>,
}

fn assert_advantages(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((f64::from(*g) - w).abs() < 1e-6, "{what}: completion {i}: {g} vs {w}");
    }
}

/// The pass@k advantages against verl's `compute_grpo_passk_outcome_advantage` (run from its
/// source) and the pass@k paper's formula (fixture written by `tests/fixtures/gen_pass_at_k.py`).
#[test]
fn pass_at_k_advantages_match_verl_and_the_paper() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/pass_at_k.json");
    let f: PassAtKFixture = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for case in &f.grpo_passk {
        let got = rein_optim::best_of_group(&case.rewards, case.group_size, case.scale_by_std);
        let what = format!(
            "verl {} grpo_passk, groups of {}, scaled {}",
            f.verl_version, case.group_size, case.scale_by_std
        );
        assert_advantages(&got, &case.advantages, &what);
    }
    for case in &f.pass_at_k {
        let got = rein_optim::pass_at_k(&case.correct, case.group_size, case.k);
        assert_advantages(
            &got,
            &case.advantages,
            &format!("pass@{}, groups of {}", case.k, case.group_size),
        );
    }
    assert!(f.grpo_passk.len() >= 6 && f.pass_at_k.len() >= 8);
}

#[derive(Deserialize)]
struct AdaptiveEntropyFixture {
    generated_by: String,
    settings: AdaptiveEntropySettings,
    steps: Vec<AdaptiveEntropyStep>,
}

#[derive(Deserialize)]
struct AdaptiveEntropySettings {
    entropy_coef: f64,
    entropy_coef_min: f64,
    entropy_coef_max: f64,
    entropy_coef_delta: f64,
    entropy_target: f64,
}

#[derive(Deserialize)]
struct AdaptiveEntropyStep {
    mean_entropy: f64,
    applied: f64,
    coef_after: f64,
}

/// The adaptive entropy coefficient replayed on the entropies TRL measured: the coefficient
/// each update applies and the one it carries on, as TRL's controller gave them (fixture
/// written by `tests/fixtures/gen_trl_adaptive_entropy.py`).
#[test]
fn the_adaptive_entropy_coefficient_follows_trls() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/trl_adaptive_entropy.json");
    let f: AdaptiveEntropyFixture = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let s = &f.settings;
    let control = rein_core::AdaptiveEntropy {
        target: s.entropy_target,
        delta: s.entropy_coef_delta,
        min: s.entropy_coef_min,
        max: s.entropy_coef_max,
    };
    let mut coefficient = rein_optim::EntropyCoefficient::new(s.entropy_coef);
    let (mut on, mut off) = (0, 0);
    for (t, step) in f.steps.iter().enumerate() {
        let applied = coefficient.applied(&control);
        assert!(
            (applied - step.applied).abs() < 1e-6,
            "{}: update {t} applied {applied}, TRL {}",
            f.generated_by,
            step.applied
        );
        coefficient.observe(step.mean_entropy, &control);
        assert!(
            (coefficient.coef - step.coef_after).abs() < 1e-9,
            "{}: after update {t}",
            f.generated_by
        );
        if applied > 0.0 { on += 1 } else { off += 1 }
    }
    assert!(
        on >= 2 && off >= 2,
        "the fixture switches the bonus on and off ({on} on, {off} off)"
    );
}

#[derive(Deserialize)]
struct PrimeFixture {
    width: usize,
    group: usize,
    mask: Vec<f32>,
    cases: std::collections::BTreeMap<String, PrimeCase>,
}

#[derive(Deserialize)]
struct PrimeCase {
    sources: Vec<PrimeSource>,
    advantages: Vec<f32>,
    returns: Vec<f32>,
}

#[derive(Deserialize)]
struct PrimeSource {
    rewards: Vec<f32>,
    mask: Vec<f32>,
    weight: f32,
}

/// PRIME's advantages and returns from token rewards — an implicit PRM's on every token, step
/// scores at step ends, the outcome on the last token, alone and together — against its
/// equations with verl's `masked_whiten` (fixture written by
/// `tests/fixtures/gen_prime_advantages.py`), within 1e-6 (relative, above 1).
#[test]
fn process_advantages_match_prime() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/prime_advantages.json");
    let f: PrimeFixture = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for (name, case) in &f.cases {
        let sources: Vec<rein_optim::TokenRewards<'_>> = (case.sources.iter())
            .map(|s| rein_optim::TokenRewards {
                rewards: &s.rewards,
                mask: &s.mask,
                weight: s.weight,
            })
            .collect();
        let (advantages, returns) = rein_optim::process_advantages(&sources, &f.mask, f.width, f.group, 1.0);
        for (what, got, want) in [
            ("advantages", &advantages, &case.advantages),
            ("returns", &returns, &case.returns),
        ] {
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                    "{name} {what}[{i}]: rein {g} vs PRIME {w}"
                );
            }
        }
    }
    assert_eq!(f.cases.len(), 3);
}

#[derive(Deserialize)]
struct ImplicitRewards {
    lambda: f32,
    outcome: bool,
    rewards: Vec<f64>,
}

#[derive(Deserialize)]
struct ImplicitPrmFixture {
    beta: f32,
    width: usize,
    lengths: Vec<usize>,
    log_ratios: Vec<f32>,
    sums: Vec<f32>,
    outcomes: Vec<f32>,
    loss: f64,
    loss_grad: Vec<f64>,
    token_rewards: std::collections::BTreeMap<String, ImplicitRewards>,
    batch_normalized: Vec<f64>,
}

/// PRIME's implicit PRM against its equations in verl's recipe (fixture written by
/// `tests/fixtures/gen_prime_implicit_prm.py`): the cross-entropy loss on the summed log-ratios
/// (one row past torch's −100 clamp) and its gradient, the token rewards with λ = 0, with λ and
/// with the outcome on the last token, and the batch normalisation, each within 1e-6.
#[test]
fn the_implicit_prm_matches_prime() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/prime_implicit_prm.json");
    let f: ImplicitPrmFixture = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let close = |what: &str, got: &[f32], want: &[f64]| {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let g = f64::from(*g);
            assert!(
                (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                "{what}[{i}]: rein {g} vs PRIME {w}"
            );
        }
    };
    let sums =
        Tensor::<B, 1>::from_data(TensorData::new(f.sums.clone(), [f.sums.len()]), &Default::default()).require_grad();
    let loss = rein_optim::implicit_prm_loss(sums.clone(), &f.outcomes, f.beta);
    close("loss", &[loss.clone().into_scalar()], &[f.loss]);
    let grads = loss.backward();
    let grad = sums.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap();
    close("the loss's gradient", &grad, &f.loss_grad);
    for (name, case) in &f.token_rewards {
        let outcomes = case.outcome.then_some(f.outcomes.as_slice());
        let got = rein_optim::implicit_token_rewards(&f.log_ratios, &f.lengths, f.width, f.beta, case.lambda, outcomes);
        close(name, &got, &case.rewards);
    }
    let plain = rein_optim::implicit_token_rewards(&f.log_ratios, &f.lengths, f.width, f.beta, 0.0, None);
    close(
        "batch_norm",
        &rein_optim::batch_normalized(&plain, f.width),
        &f.batch_normalized,
    );
    assert_eq!(f.token_rewards.len(), 3);
}
