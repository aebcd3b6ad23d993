//! The GRPO-family losses against TRL's `GRPOTrainer._compute_loss` on fixed log-probabilities,
//! advantages and masks, and their gradients with respect to the log-probabilities against
//! PyTorch autograd (fixture written by `tests/fixtures/gen_trl_loss.py`; the TRL version is in
//! the fixture's `generated_by`): the clipped objective with each aggregation, CISPO, SAPO and the
//! top-entropy token mask.

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
