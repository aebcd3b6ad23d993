//! Mixed precision (`model.dtype = "bf16"`): a model trained with bf16 products keeps `f32`
//! master weights, which hold updates too small for bf16 to represent, and follows the `f32`
//! model's training within bf16's rounding.

use std::collections::BTreeMap;
use std::time::Duration;

use rein_core::ModelDtype;
use rein_model::CpuAutodiff;
use rein_model::lm::CausalLm;
use rein_posttrain::{Prompt, Sft};
use rein_recipe::SftSection;
use rein_run::driver::Trainer;
use rein_run::watchdog::Phases;

#[path = "common/tiny_lm.rs"]
#[allow(dead_code)]
mod tiny_lm;

fn examples() -> Vec<Prompt> {
    (0..6u32)
        .map(|i| Prompt {
            text: format!("example {i}"),
            tokens: (0..2 + i % 3).map(|j| (i * 7 + j + 2) % 40).collect(),
            answer: None,
            target: Some((0..3 + i % 4).map(|j| (i * 5 + j * 3 + 1) % 40).collect()),
            target_trained: None,
            metadata: String::new(),
            source: String::new(),
            images: Default::default(),
            image_files: Default::default(),
        })
        .collect()
}

fn parameters(model: &CausalLm<CpuAutodiff>) -> Vec<f32> {
    let mut all = Vec::new();
    for layer in &model.layers {
        for (_, linear) in layer.linears() {
            all.extend(linear.weight.val().into_data().to_vec::<f32>().expect("f32 weights"));
        }
    }
    all
}

/// Three SFT steps at `lr` in `dtype`: each step's loss, and the linear weights before and after.
fn train(dtype: ModelDtype, lr: f64) -> (Vec<f64>, Vec<f32>, Vec<f32>) {
    let model = tiny_lm::tiny_model_on::<CpuAutodiff>(3).with_dtype(dtype);
    let before = parameters(&model);
    let section = SftSection {
        steps: 3,
        batch_size: 6,
        lr,
        warmup_steps: 0,
        ..SftSection::default()
    };
    let examples = examples();
    let mut sft = Sft::new(model, &examples, 0, &section, 9, vec![Default::default()]).unwrap();
    let phases = Phases::new(Duration::ZERO, BTreeMap::new());
    let losses = (1..=3)
        .map(|step| sft.step(step, &phases).unwrap().record["sft/loss"].as_f64().unwrap())
        .collect();
    (losses, before, parameters(&sft.model))
}

fn bf16(v: f32) -> f32 {
    half::bf16::from_f32(v).to_f32()
}

/// At a learning rate whose steps are below half a bf16 ulp of most weights (1e-4 against
/// weights of std 0.3), the `f32` master weights still move: weights held in bf16 would round
/// most of these updates away. The weights stay `f32` (`parameters` reads them as such).
#[test]
fn mixed_precision_keeps_updates_too_small_for_bf16() {
    let (losses, before, after) = train(ModelDtype::Bf16, 1e-4);
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
    let invisible = (before.iter().zip(&after))
        .filter(|&(b, a)| b != a && bf16(*b) == bf16(*a))
        .count();
    eprintln!(
        "{moved} of {} weights moved, {invisible} by less than bf16 shows",
        before.len()
    );
    assert!(
        moved > before.len() * 9 / 10,
        "{moved} of {} weights moved",
        before.len()
    );
    assert!(
        invisible > moved / 2,
        "only {invisible} of {moved} updates are below bf16's resolution"
    );
}

/// With bf16 products the losses follow the f32 model's within bf16's rounding, and are not the
/// f32 losses (the products really are rounded).
#[test]
fn mixed_precision_trains_as_f32_does_within_bf16_rounding() {
    let (mixed, before, mixed_after) = train(ModelDtype::Bf16, 3e-3);
    let (full, _, full_after) = train(ModelDtype::F32, 3e-3);
    for (m, f) in mixed.iter().zip(&full) {
        assert!(
            (m - f).abs() < 1e-2 * f.abs(),
            "losses {mixed:?} against f32's {full:?}"
        );
    }
    assert_ne!(mixed, full, "bf16 products gave the f32 losses");
    assert!(mixed[2] < mixed[0], "mixed precision did not learn: {mixed:?}");
    // Adam's steps are ±lr where gradients are small, whichever their rounding: compare on average.
    let mean =
        |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| f64::from((x - y).abs())).sum::<f64>() / a.len() as f64;
    let (apart, update) = (mean(&mixed_after, &full_after), mean(&full_after, &before));
    eprintln!("losses {mixed:?} vs {full:?}; weights {apart:.2e} apart on average, updates {update:.2e}");
    assert!(
        apart < 0.2 * update,
        "mixed and f32 weights {apart} apart on average, updates {update}"
    );
}
