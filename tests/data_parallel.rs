//! Data parallelism: an SFT step with its batch split across 2 or 3 devices (the CPU backend
//! several times, peers of burn-collective's all-reduce) gives the loss, the gradient norm and
//! the parameters of the same step on one device, within 1e-6.

use std::collections::BTreeMap;
use std::time::Duration;

use burn::tensor::backend::Backend as _;
use rein_model::CpuAutodiff;
use rein_model::lm::{CausalLm, LmConfig, LmInit};
use rein_recipe::SftSection;
use rein_train::data_parallel::devices;
use rein_train::driver::Trainer;
use rein_train::lm::{Prompt, Sft};
use rein_train::watchdog::Phases;

fn model() -> CausalLm<CpuAutodiff> {
    let config = LmConfig::from_json(serde_json::json!({
        "model_type": "qwen2", "vocab_size": 40, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64
    }))
    .unwrap();
    CpuAutodiff::seed(&Default::default(), 3);
    LmInit { config, std: 0.3 }.init::<CpuAutodiff>(&mut rein_core::SeededRng::new(1), &Default::default())
}

/// Seven examples of different lengths; one a multi-turn trace whose middle tokens (a tool's
/// result) are not trained on.
fn examples() -> Vec<Prompt> {
    (0..7u32)
        .map(|i| {
            let target: Vec<u32> = (0..2 + i % 4).map(|j| (i * 5 + j * 3 + 1) % 40).collect();
            let trained = (i == 4).then(|| (0..target.len()).map(|j| j != 1).collect());
            Prompt {
                text: format!("example {i}"),
                tokens: (0..1 + i % 3).map(|j| (i * 7 + j + 2) % 40).collect(),
                answer: None,
                target: Some(target),
                target_trained: trained,
                metadata: String::new(),
            }
        })
        .collect()
}

/// Three SFT steps on `n` devices: each step's loss and gradient norm, and the parameters after.
fn train(n: usize) -> (Vec<(f64, f64)>, rein_gguf::tensors_file::Tensors) {
    let examples = examples();
    let section = SftSection {
        steps: 3,
        batch_size: 7,
        lr: 3e-3,
        warmup_steps: 0,
        ..SftSection::default()
    };
    let mut sft = Sft::new(model(), &examples, 0, &section, 9, devices(&Default::default(), n)).unwrap();
    let phases = Phases::new(Duration::ZERO, BTreeMap::new());
    let steps = (1..=3)
        .map(|step| {
            let record = sft.step(step, &phases).unwrap().record;
            (
                record["sft/loss"].as_f64().unwrap(),
                record["sft/grad_norm"].as_f64().unwrap(),
            )
        })
        .collect();
    (steps, rein_model::safetensors_file::module_tensors(&sft.model))
}

#[test]
fn sft_split_across_devices_equals_one_device() {
    let (one, params) = train(1);
    for n in [2, 3] {
        let (split, split_params) = train(n);
        for (step, ((loss, norm), (loss_n, norm_n))) in one.iter().zip(&split).enumerate() {
            assert!(
                (loss - loss_n).abs() < 1e-6,
                "{n} devices, step {step}: loss {loss_n} vs {loss}"
            );
            assert!(
                (norm - norm_n).abs() < 1e-6 * norm.max(1.0),
                "{n} devices, step {step}: gradient norm {norm_n} vs {norm}"
            );
        }
        assert_eq!(params.len(), split_params.len());
        for (name, (_, values)) in &params {
            let worst = values
                .iter()
                .zip(&split_params[name].1)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(worst < 1e-6, "{n} devices: `{name}` differs by {worst} after 3 steps");
        }
        // The steps moved the parameters: the comparison is not of an untouched model.
        let before = rein_model::safetensors_file::module_tensors(&model());
        assert!(params.iter().any(|(name, (_, v))| before[name].1 != *v));
    }
}
