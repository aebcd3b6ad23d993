//! A vision-language model trained from a recipe: SFT, then GRPO, on rows whose prompts carry
//! images, with the tiny Idefics3 of `fixtures/vlm` (its processor, tokenizer and SmolVLM chat
//! template). The sampler and the trainer read the same images (their log-probabilities agree),
//! the vision encoder stays frozen unless `model.train_vision_encoder`, and the models the run
//! writes read images as the start did.

use safetensors::SafeTensors;

use super::*;

fn vlm() -> std::path::PathBuf {
    root().join("tests/fixtures/vlm")
}

/// Four rows, one image each (the fixture's odd sizes, grey and RGBA), with an answer and a
/// target completion, as `rows.jsonl` in `dir`; `image` names the first row's image.
fn write_rows(dir: &Path, first_image: &str) {
    let images = vlm().join("images");
    let rows: Vec<String> = [first_image, "tall.png", "grey.png", "small_rgba.png"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            serde_json::json!({
                "prompt": "How many shapes are there?",
                "images": [images.join(name).display().to_string()],
                "answer": (i + 1).to_string(),
                "completion": format!("<answer>{}</answer>", i + 1),
            })
            .to_string()
        })
        .collect();
    std::fs::write(dir.join("rows.jsonl"), rows.join("\n")).unwrap();
}

/// The recipe: two SFT steps, two GRPO steps on the sampler's self-certainty (the answer
/// checker, at weight 0, measures held-out accuracy), with `model` as the policy.
fn recipe(dir: &Path, model: &Path, overrides: &[&str]) -> LoadedRecipe {
    let recipe = format!(
        r#"
[model]
path = {model:?}
[data]
train = "rows.jsonl"
test = "rows.jsonl"
[sft]
steps = 2
batch_size = 2
lr = 1e-3
[sampler]
n = 2
max_new_tokens = 6
[algorithm]
name = "grpo"
steps = 2
prompts_per_step = 2
[optimizer]
lr = 1e-3
[[reward]]
signal = "self_certainty"
[[reward]]
plugin = "math-answer"
weight = 0.0
[eval]
k = 1
[train]
runs_dir = {runs:?}
"#,
        model = model.display().to_string(),
        runs = dir.join("runs").display().to_string(),
    );
    std::fs::write(dir.join("recipe.toml"), recipe).unwrap();
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    LoadedRecipe::load(&dir.join("recipe.toml"), &overrides).unwrap()
}

/// The f32 values of every tensor in `dir/model.safetensors` whose name starts with `prefix`.
fn tensors(dir: &Path, prefix: &str) -> Vec<(String, Vec<u8>)> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let mut named: Vec<(String, Vec<u8>)> = (file.tensors().into_iter())
        .filter(|(name, _)| name.starts_with(prefix))
        .map(|(name, view)| (name, view.data().to_vec()))
        .collect();
    named.sort();
    assert!(!named.is_empty(), "no `{prefix}` tensors in {}", dir.display());
    named
}

#[test]
fn a_vision_language_model_trains_with_sft_then_grpo_on_image_rows() {
    let dir = common::scratch("lm-vlm-train");
    write_rows(&dir, "wide.png");
    let start = vlm().join("idefics3");
    let RunOutcome::Lm(outcome) = rein_train::run(&recipe(&dir, &start, &[]), &plugin_dir(), true).unwrap() else {
        panic!("a language-model outcome")
    };
    assert_eq!(outcome.grpo.unwrap().steps, 2);
    let (before, after) = (outcome.before.unwrap(), outcome.after.unwrap());
    assert_eq!((before.examples, after.examples), (4, 4));

    // The trainer recomputes the sampler's log-probabilities with the same images in place.
    let grpo = stage_records(&dir.join("runs"), "grpo");
    assert_eq!(grpo.len(), 2);
    for r in &grpo {
        let mismatch = r["train/mismatch_kl"].as_f64().unwrap();
        assert!(mismatch < 1e-6, "the trainer read other inputs than the sampler: {r}");
    }
    assert_eq!(stage_records(&dir.join("runs"), "sft").len(), 2);

    // Frozen by default: the encoder as it was; the connector and the decoder trained.
    let run = outcome.run_dir.unwrap();
    let final_dir = run.join("final");
    assert_eq!(
        tensors(&final_dir, "model.vision_model."),
        tensors(&start, "model.vision_model.")
    );
    assert_ne!(
        tensors(&final_dir, "model.connector."),
        tensors(&start, "model.connector.")
    );
    assert_ne!(
        tensors(&final_dir, "model.text_model."),
        tensors(&start, "model.text_model.")
    );
    // The models the run writes are vision-language models that read images as the start did.
    for saved in [run.join("sft"), final_dir] {
        assert!(saved.join("processor_config.json").is_file(), "{}", saved.display());
        let model = rein_model::lm::load::<burn::backend::Flex>(&saved, &Default::default()).unwrap();
        assert!(model.vision.is_some(), "{} lost its image side", saved.display());
    }

    let dir = common::scratch("lm-vlm-train-encoder");
    write_rows(&dir, "wide.png");
    let loaded = recipe(&dir, &start, &["model.train_vision_encoder=true", "algorithm.steps=1"]);
    let RunOutcome::Lm(outcome) = rein_train::run(&loaded, &plugin_dir(), true).unwrap() else {
        panic!("a language-model outcome")
    };
    let final_dir = outcome.run_dir.unwrap().join("final");
    assert_ne!(
        tensors(&final_dir, "model.vision_model."),
        tensors(&start, "model.vision_model.")
    );
}

/// Qwen2-VL and Qwen2.5-VL checkpoints train from the same recipe: the sampler and the trainer
/// put every token at the same multimodal positions (their log-probabilities agree), the vision
/// transformer stays frozen while the patch merger and the decoder learn, and the run's models
/// load back as the same family with their processor.
#[test]
fn qwen2_vl_models_train_with_sft_then_grpo_on_image_rows() {
    for family in ["qwen2_vl", "qwen2_5_vl"] {
        let dir = common::scratch(&format!("lm-{family}-train"));
        write_rows(&dir, "wide.png");
        let start = vlm().join(format!("{family}_model"));
        let RunOutcome::Lm(outcome) = rein_train::run(&recipe(&dir, &start, &[]), &plugin_dir(), true).unwrap() else {
            panic!("a language-model outcome")
        };
        assert_eq!(outcome.grpo.unwrap().steps, 2);
        for r in &stage_records(&dir.join("runs"), "grpo") {
            let mismatch = r["train/mismatch_kl"].as_f64().unwrap();
            assert!(
                mismatch < 1e-6,
                "{family}: the trainer read other positions or images than the sampler: {r}"
            );
        }
        let final_dir = outcome.run_dir.unwrap().join("final");
        for frozen in ["visual.patch_embed.", "visual.blocks."] {
            assert_eq!(
                tensors(&final_dir, frozen),
                tensors(&start, frozen),
                "{family}: {frozen}"
            );
        }
        for trained in ["visual.merger.", "model.layers."] {
            assert_ne!(
                tensors(&final_dir, trained),
                tensors(&start, trained),
                "{family}: {trained}"
            );
        }
        assert!(final_dir.join("preprocessor_config.json").is_file());
        let model = rein_model::lm::load::<burn::backend::Flex>(&final_dir, &Default::default()).unwrap();
        assert!(
            matches!(model.vision, Some(rein_model::vision::ImageSide::Qwen2Vl(_))),
            "{family}: the saved model is not a Qwen2-VL model"
        );
    }
}

/// Multi-turn GRPO on image rows: each episode opens from its row's prompt and image (the
/// sandboxed calculator offered), and the trainer reads the image where the sampler showed it.
#[test]
fn a_qwen2_vl_model_trains_on_episodes_that_open_with_the_rows_images() {
    let dir = common::scratch("lm-qwen2_vl-episodes");
    write_rows(&dir, "wide.png");
    recipe(&dir, &vlm().join("qwen2_vl_model"), &[]);
    let path = dir.join("recipe.toml");
    // Signals score single-turn completions: the episodes are scored by their length instead.
    let written = std::fs::read_to_string(&path).unwrap().replace(
        "signal = \"self_certainty\"",
        "plugin = \"length-penalty\"\nconfig = { max_length = 40, cache_length = 30 }",
    );
    let agent = "\n[[tool]]\nplugin = \"calculator\"\n[agent]\nmax_turns = 2\n";
    std::fs::write(&path, written + agent).unwrap();
    let loaded = LoadedRecipe::load(&path, &[]).unwrap();
    let RunOutcome::Lm(outcome) = rein_train::run(&loaded, &plugin_dir(), true).unwrap() else {
        panic!("a language-model outcome")
    };
    assert_eq!(outcome.grpo.unwrap().steps, 2);
    assert!(outcome.after.unwrap().episodes.is_some(), "held-out episodes");
    for r in &stage_records(&dir.join("runs"), "grpo") {
        assert!(r["episode/turns"].as_f64().unwrap() >= 1.0, "{r}");
        let mismatch = r["train/mismatch_kl"].as_f64().unwrap();
        assert!(
            mismatch < 1e-6,
            "the trainer read other images than the episodes showed: {r}"
        );
    }
}

/// `[lora]` on a Qwen2-VL: the decoder's adapters train and nothing else (the vision tower and
/// the merger stay as they were), and the adapter the run writes names the decoder's modules as
/// transformers does (`model.language_model.layers…`), its targets a pattern over the decoder's
/// paths (the vision tower has modules of the same names in Qwen2.5-VL).
#[test]
fn a_lora_run_on_a_qwen2_vl_trains_the_decoders_adapters_only() {
    let dir = common::scratch("lm-qwen2-vl-lora");
    write_rows(&dir, "wide.png");
    let start = vlm().join("qwen2_vl_model");
    let overrides = [
        "lora.rank=2",
        "lora.alpha=4.0",
        "lora.targets=[\"q_proj\", \"down_proj\"]",
    ];
    let RunOutcome::Lm(outcome) = rein_train::run(&recipe(&dir, &start, &overrides), &plugin_dir(), true).unwrap()
    else {
        panic!("a language-model outcome")
    };
    let run = outcome.run_dir.unwrap();
    for unchanged in ["visual.", "model.embed_tokens.", "lm_head."] {
        assert_eq!(
            tensors(&run.join("final"), unchanged),
            tensors(&start, unchanged),
            "{unchanged}"
        );
    }
    assert_ne!(
        tensors(&run.join("final"), "model.layers."),
        tensors(&start, "model.layers.")
    );
    let bytes = std::fs::read(run.join("adapter/adapter_model.safetensors")).unwrap();
    let adapter = SafeTensors::deserialize(&bytes).unwrap();
    let names = adapter.names();
    assert!(!names.is_empty());
    assert!(
        names
            .iter()
            .all(|n| n.starts_with("base_model.model.model.language_model.layers.")),
        "{names:?}"
    );
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("adapter/adapter_config.json")).unwrap()).unwrap();
    let pattern = config["target_modules"].as_str().unwrap();
    assert!(
        pattern.starts_with(r"model\.language_model\.layers") && pattern.contains("q_proj|down_proj"),
        "{pattern}"
    );
}

/// `[lora] vision = true`: the vision blocks' adapters train beside the decoder's (their `B`
/// factors leave zero), the run's adapter names them as PEFT does, and the merged model's vision
/// blocks carry them while the patch embedding and the merger stay as they were.
#[test]
fn a_lora_run_with_vision_adapters_trains_the_vision_blocks_adapters_too() {
    let dir = common::scratch("lm-qwen2-vl-vision-lora");
    write_rows(&dir, "wide.png");
    let start = vlm().join("qwen2_vl_model");
    let overrides = [
        "lora.rank=2",
        "lora.alpha=4.0",
        "lora.targets=[\"q_proj\"]",
        "lora.vision=true",
    ];
    let RunOutcome::Lm(outcome) = rein_train::run(&recipe(&dir, &start, &overrides), &plugin_dir(), true).unwrap()
    else {
        panic!("a language-model outcome")
    };
    let run = outcome.run_dir.unwrap();
    let bytes = std::fs::read(run.join("adapter/adapter_model.safetensors")).unwrap();
    let adapter = SafeTensors::deserialize(&bytes).unwrap();
    let trained = |name: &str| {
        let view = adapter.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        view.data()
            .chunks_exact(4)
            .any(|b| f32::from_le_bytes(b.try_into().unwrap()) != 0.0)
    };
    for module in ["attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"] {
        let name = format!("base_model.model.model.visual.blocks.1.{module}.lora_B.weight");
        assert!(trained(&name), "{name} did not train");
    }
    assert!(trained(
        "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_B.weight"
    ));
    for unchanged in ["visual.patch_embed.", "visual.merger.", "model.embed_tokens."] {
        assert_eq!(
            tensors(&run.join("final"), unchanged),
            tensors(&start, unchanged),
            "{unchanged}"
        );
    }
    assert_ne!(
        tensors(&run.join("final"), "visual.blocks."),
        tensors(&start, "visual.blocks.")
    );
}

/// `lora.vision` on a model without a vision encoder is refused naming the key.
#[test]
fn vision_adapters_on_a_text_model_are_refused_naming_the_key() {
    let runs = common::scratch("lm-text-vision-lora");
    let loaded = crate::tiny_default(&runs, &["lora.vision=true"]);
    let error = rein_train::run(&loaded, &plugin_dir(), true).err().unwrap().to_string();
    assert!(
        error.contains("lora.vision") && error.contains("no vision encoder"),
        "{error}"
    );
}

/// An image that is not there stops the run before training, naming the key, the row and the
/// file (a text-only policy on image rows: `grpo::image_rows_are_read_and_a_recipe_for_a_text_only_policy_refuses_them`).
#[test]
fn a_missing_image_is_refused_naming_the_row_and_the_file() {
    let dir = common::scratch("lm-vlm-missing-image");
    write_rows(&dir, "missing.png");
    let err = rein_train::run(&recipe(&dir, &vlm().join("idefics3"), &[]), &plugin_dir(), true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("data.train row 1") && err.contains("missing.png"), "{err}");
}

/// The visual task's recipe (`recipes/grpo-shapes.toml`) shrunk to seconds: the data generated
/// with its images, a vision-language model initialised from scratch (`model.vision`) and
/// trained with SFT then GRPO, rewarded by a plugin that reads the prompts' images, and saved
/// as an Idefics3 checkpoint with its processor; a misspelt `model.vision` key is refused,
/// naming it.
#[test]
fn the_shapes_recipe_trains_a_vision_language_model_from_scratch() {
    let dir = common::scratch("lm-shapes");
    let runs = format!("train.runs_dir={:?}", dir.join("runs").display().to_string());
    let shrunk = [
        "data.shapes_task.train=64",
        "data.shapes_task.test=8",
        "sft.steps=4",
        "sft.batch_size=8",
        "algorithm.steps=1",
        "algorithm.prompts_per_step=2",
        "sampler.n=4",
        "eval.k=2",
        &runs,
    ];
    let load = |extra: &[&str]| {
        let overrides: Vec<String> = shrunk.iter().chain(extra).map(|s| s.to_string()).collect();
        LoadedRecipe::load(&root().join("recipes/grpo-shapes.toml"), &overrides).unwrap()
    };
    let RunOutcome::Lm(outcome) = rein_train::run(&load(&[]), &plugin_dir(), true).unwrap() else {
        panic!("a language-model outcome")
    };
    assert_eq!(outcome.after.unwrap().examples, 8);
    let run = outcome.run_dir.unwrap();
    let rows = read(&run.join("data/train.jsonl"), &Fields::default()).unwrap();
    assert_eq!(rows.len(), 64);
    assert!(rows.iter().all(|r| r.images.len() == 1), "every row has its board");
    for r in stage_records(&dir.join("runs"), "grpo") {
        assert!(r["train/mismatch_kl"].as_f64().unwrap() < 1e-6, "{r}");
        // `count-shapes` counts the squares in the prompt's image: it applied (a completion
        // without the image would be "not applicable", and the metric absent).
        let answered = r["train/reward/count-shapes/answered"].as_f64();
        assert!(answered.is_some_and(f64::is_finite), "{r}");
    }
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("final/config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "Idefics3ForConditionalGeneration");
    assert_eq!(config["vision_config"]["patch_size"], 6);
    assert!(run.join("final/processor_config.json").is_file());
    let model = rein_model::lm::load::<burn::backend::Flex>(&run.join("final"), &Default::default()).unwrap();
    match model.vision.as_ref() {
        Some(rein_model::vision::ImageSide::Idefics3(vision)) => assert_eq!(vision.image_seq_len(), 16),
        _ => panic!("an Idefics3 image side"),
    }

    let err = rein_train::run(&load(&["model.vision.patch=4"]), &plugin_dir(), true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model.vision") && err.contains("unknown key `patch`"),
        "{err}"
    );
}
