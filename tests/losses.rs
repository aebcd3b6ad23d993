//! The GRPO-family losses against TRL's `GRPOTrainer._compute_loss` on fixed log-probabilities,
//! advantages and masks, and their gradients with respect to the log-probabilities against
//! PyTorch autograd (fixture written by `tests/fixtures/gen_trl_loss.py`, TRL 1.16).

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Tensor, TensorData};
use rein_optim::{Aggregation, KlEstimator, PolicyLossConfig, RatioLevel, policy_loss};
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
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    loss_type: String,
    level: String,
    beta: f32,
    epsilon_low: f32,
    epsilon_high: f32,
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
    assert_eq!(f.cases.len(), 12);
    for case in &f.cases {
        let aggregation = match case.loss_type.as_str() {
            "grpo" => Aggregation::SeqMeanTokenMean,
            "dapo" => Aggregation::TokenMean,
            "dr_grpo" => Aggregation::SeqMeanTokenSumNorm,
            other => panic!("unexpected loss type {other}"),
        };
        let config = PolicyLossConfig {
            level: if case.level == "sequence" {
                RatioLevel::Sequence
            } else {
                RatioLevel::Token
            },
            clip_low: case.epsilon_low,
            clip_high: case.epsilon_high,
            dual_clip: None,
            aggregation,
            max_completion_len: f.max_completion_length,
            kl_coef: case.beta,
            kl_estimator: KlEstimator::K3,
            kl_importance_weighted: true,
            entropy_coef: 0.0,
        };
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
            None,
            &config,
        );
        let grads = out.loss.backward();
        let grad: Vec<f32> = log_prob.grad(&grads).unwrap().into_data().to_vec().unwrap();
        for (at, (rein, torch)) in grad.iter().zip(case.grad_log_prob.concat()).enumerate() {
            assert!(
                (rein - torch).abs() < 1e-6,
                "{} {} β={} ε_high={}: ∂loss/∂log_prob[{}][{}]: rein {rein:.9} vs PyTorch {torch:.9}",
                case.loss_type,
                case.level,
                case.beta,
                case.epsilon_high,
                at / f.mask[0].len(),
                at % f.mask[0].len()
            );
        }
        let loss = f64::from(out.loss.into_scalar());
        assert!(
            (loss - case.loss).abs() < 1e-6,
            "{} {} β={} ε_high={}: rein {loss:.9} vs TRL {:.9}",
            case.loss_type,
            case.level,
            case.beta,
            case.epsilon_high,
            case.loss
        );
    }
}
