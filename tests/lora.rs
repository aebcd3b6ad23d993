//! LoRA: a fresh adapter changes nothing, adapters saved by PEFT give PEFT's logits (attached
//! and merged), rein writes them back as PEFT wrote them, and training moves only the adapters.
//! Fixtures and their script: `tests/fixtures/lora/`.

#[path = "common/logits.rs"]
mod common_logits;

use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend as _;
use burn::tensor::{Int, Tensor, TensorData};
use rein_model::lm::lora::LoraSpec;
use rein_model::lm::peft::{CONFIG_FILE, WEIGHTS_FILE, load_adapter, save_adapter};
use rein_model::lm::{CausalLm, LoadError, load};
use rein_posttrain::{TokenBatch, completion_log_probs};
use rein_sampler::{GenerationConfig, SeededRng, generate};

type B = Autodiff<Flex>;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lora")
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rein-lora-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn expected() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected.json")).unwrap()).unwrap()
}

fn inputs() -> Vec<Vec<i64>> {
    serde_json::from_value(expected()["inputs"].clone()).unwrap()
}

/// Logits `[batch × seq × vocab]` of `inputs`, flattened; through the fused projections (what
/// generation uses) when `fused`.
fn logits(model: &CausalLm<B>, inputs: &[Vec<i64>], fused: bool) -> Vec<f32> {
    let (batch, seq) = (inputs.len(), inputs[0].len());
    let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(inputs.concat(), [batch, seq]), &Default::default());
    common_logits::logits(model, tokens, fused)
}

fn flat(value: &serde_json::Value) -> Vec<f32> {
    let nested: Vec<Vec<Vec<f32>>> = serde_json::from_value(value.clone()).unwrap();
    nested.concat().concat()
}

fn assert_close(what: &str, ours: &[f32], theirs: &[f32], tolerance: f32) {
    assert_eq!(ours.len(), theirs.len(), "{what}");
    let worst = ours
        .iter()
        .zip(theirs)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst <= tolerance,
        "{what}: largest difference {worst:e} > {tolerance:e}"
    );
}

fn base() -> CausalLm<B> {
    load(&fixtures().join("base"), &Default::default()).unwrap()
}

fn spec(targets: &[&str], rank: usize) -> LoraSpec {
    LoraSpec {
        rank,
        alpha: 2.0 * rank as f32,
        dropout: 0.0,
        targets: targets.iter().map(|t| t.to_string()).collect(),
        rslora: false,
        vision: false,
    }
}

#[test]
fn the_base_fixture_gives_transformers_logits() {
    assert_close(
        "base",
        &logits(&base(), &inputs(), false),
        &flat(&expected()["base"]),
        1e-4,
    );
}

#[test]
fn a_fresh_adapter_leaves_the_logits_unchanged() {
    B::seed(&Default::default(), 7);
    let model = base();
    let adapted = model
        .clone()
        .with_lora(&spec(&["all-linear"], 4), &mut SeededRng::new(1), &Default::default());
    for fused in [false, true] {
        assert_eq!(
            logits(&model, &inputs(), fused),
            logits(&adapted, &inputs(), fused),
            "fused: {fused}"
        );
    }
}

#[test]
fn peft_adapters_give_peft_logits_attached_and_merged() {
    let expected = expected();
    for name in ["adapter", "adapter-all"] {
        let model = load_adapter(base(), &fixtures().join(name), &Default::default()).unwrap();
        let attached = logits(&model, &inputs(), false);
        assert_close(name, &attached, &flat(&expected[name]), 1e-4);
        // Generation's fused projections merge q/k/v/gate/up and keep o/down separate.
        assert_close(
            &format!("{name}, fused"),
            &logits(&model, &inputs(), true),
            &attached,
            1e-5,
        );
        let merged = model.merged();
        assert!(merged.lora.is_none());
        let merged_logits = logits(&merged, &inputs(), false);
        assert_close(&format!("{name} merged"), &merged_logits, &attached, 1e-5);
        assert_close(
            &format!("{name} merged vs PEFT's merge_and_unload"),
            &merged_logits,
            &flat(&expected[format!("{name}-merged")]),
            1e-4,
        );
    }
    // Without the adapter the logits differ: the comparison above is not vacuous.
    let base_logits = logits(&base(), &inputs(), false);
    let diff = base_logits
        .iter()
        .zip(flat(&expected["adapter"]))
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(diff > 1e-2, "the adapter barely changes the logits ({diff})");
}

/// What rein writes is what PEFT wrote: the same tensor names, shapes and values, and a config
/// with PEFT's keys; reading it back gives the same model.
#[test]
fn rein_writes_adapters_as_peft_does() {
    let dir = scratch("save");
    let model = load_adapter(base(), &fixtures().join("adapter"), &Default::default()).unwrap();
    save_adapter(&model, &dir, "tests/fixtures/lora/base").unwrap();
    let read = |path: PathBuf| std::fs::read(path).unwrap();
    let (ours, theirs) = (
        read(dir.join(WEIGHTS_FILE)),
        read(fixtures().join("adapter").join(WEIGHTS_FILE)),
    );
    let (ours, theirs) = (
        safetensors::SafeTensors::deserialize(&ours).unwrap(),
        safetensors::SafeTensors::deserialize(&theirs).unwrap(),
    );
    let mut names: Vec<_> = ours.names();
    names.sort();
    let mut their_names: Vec<_> = theirs.names();
    their_names.sort();
    assert_eq!(names, their_names);
    for name in names {
        let (a, b) = (ours.tensor(name).unwrap(), theirs.tensor(name).unwrap());
        assert_eq!(a.shape(), b.shape(), "{name}");
        assert_eq!(a.data(), b.data(), "{name}");
    }
    let config: serde_json::Value = serde_json::from_slice(&read(dir.join(CONFIG_FILE))).unwrap();
    assert_eq!(config["peft_type"], "LORA");
    assert_eq!(
        (config["r"].as_u64(), config["lora_alpha"].as_f64()),
        (Some(4), Some(8.0))
    );
    assert_eq!(
        config["target_modules"],
        serde_json::json!(["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"])
    );
    let reloaded = load_adapter(base(), &dir, &Default::default()).unwrap();
    assert_eq!(logits(&reloaded, &inputs(), false), logits(&model, &inputs(), false));
}

/// A policy-gradient-shaped step moves the adapters only: the base weights get no gradient,
/// no optimiser state, and stay bit for bit what they were.
#[test]
fn training_moves_only_the_adapters() {
    // One graph at a time in the process (rein_model::one_graph: tracel-ai/burn#5573).
    let _graph = rein_model::one_graph();
    let device = Default::default();
    B::seed(&device, 3);
    let model = base().with_lora(&spec(&["q_proj", "down_proj"], 2), &mut SeededRng::new(2), &device);
    let before = model.clone();
    let batch = TokenBatch::new(&[(&[1, 5, 9], &[3, 7, 2]), (&[4, 4], &[8, 15, 16, 23])], 0);
    let (log_prob, _) = completion_log_probs(&model, &batch, 1.0, false, &device);
    let grads = GradientsParams::from_grads(log_prob.sum().neg().backward(), &model);
    // Two factors on two modules of two layers.
    assert_eq!(grads.len(), 2 * 2 * 2);
    let mut optimizer = AdamWConfig::new().with_weight_decay(0.0).init::<B, CausalLm<B>>();
    let after = optimizer.step(1e-2, model, grads);
    assert_eq!(optimizer.to_record().len(), 8, "optimiser state only for the adapters");
    let values = |m: &CausalLm<B>| rein_model::safetensors_file::module_tensors(m);
    let (old, new) = (values(&before), values(&after));
    let mut moved = Vec::new();
    for (name, (_, value)) in &new {
        if old[name].1 != *value {
            moved.push(name.clone());
        }
    }
    moved.sort();
    assert!(
        moved.iter().all(|n| n.starts_with("lora.")),
        "base weights moved: {moved:?}"
    );
    // `B` starts at zero, so only it moves on the first step (`A`'s gradient is `x·∂y·Bᵀ` = 0).
    assert_eq!(moved.len(), 4, "{moved:?}");
    assert!(moved.iter().all(|n| n.ends_with(".b")), "{moved:?}");
}

/// Greedy generation with adapters (fused, merged on the fly) equals generation with the
/// merged checkpoint.
#[test]
fn generation_with_adapters_equals_the_merged_model() {
    let device = Default::default();
    let model = load_adapter(base(), &fixtures().join("adapter-all"), &device).unwrap();
    let config = GenerationConfig {
        max_new_tokens: 12,
        temperature: 0.0,
        top_k: None,
        top_p: None,
        min_p: None,
        n: 1,
        stop_token_ids: vec![],
        seed: 1,
        top_logprobs: 0,
        ..GenerationConfig::default()
    };
    let prompts = vec![vec![1, 5, 9], vec![4, 4, 8, 15]];
    let run = |m: &CausalLm<B>| -> Vec<Vec<u32>> {
        generate(&m.valid(), &prompts, &config, 0, &mut |_, _| false, &device)
            .into_iter()
            .map(|g| g.tokens)
            .collect()
    };
    assert_eq!(run(&model), run(&model.merged()));
    assert_ne!(
        run(&model),
        run(&base()),
        "the adapter changes nothing greedy decoding sees"
    );
}

#[test]
fn bad_adapters_are_refused_naming_the_field_or_tensor() {
    let device = Default::default();
    let copy = |tag: &str| {
        let dir = scratch(tag);
        for file in [CONFIG_FILE, WEIGHTS_FILE] {
            std::fs::copy(fixtures().join("adapter").join(file), dir.join(file)).unwrap();
        }
        dir
    };
    let edit_config = |dir: &Path, key: &str, value: serde_json::Value| {
        let path = dir.join(CONFIG_FILE);
        let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        config[key] = value;
        std::fs::write(&path, config.to_string()).unwrap();
    };
    let error = |dir: &Path| load_adapter(base(), dir, &device).unwrap_err().to_string();

    let dora = copy("dora");
    edit_config(&dora, "use_dora", true.into());
    assert!(error(&dora).contains("`use_dora`: DoRA"), "{}", error(&dora));

    let rank = copy("rank");
    edit_config(&rank, "r", 3.into());
    let message = error(&rank);
    assert!(
        message.contains("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight") && message.contains("r = 3"),
        "{message}"
    );

    let zero = copy("zero");
    edit_config(&zero, "r", 0.into());
    assert!(error(&zero).contains("`rank`: must be at least 1"), "{}", error(&zero));

    let fewer = copy("fewer");
    edit_config(&fewer, "target_modules", serde_json::json!(["q_proj"]));
    let message = error(&fewer);
    assert!(
        message.contains("target_modules do not have: base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"),
        "{message}"
    );

    let missing = copy("missing");
    std::fs::remove_file(missing.join(WEIGHTS_FILE)).unwrap();
    assert!(matches!(
        load_adapter(base(), &missing, &device),
        Err(LoadError::Adapter { path, .. }) if path.ends_with(WEIGHTS_FILE)
    ));
}
