//! Qwen2-VL and Qwen2.5-VL against transformers (`tests/fixtures/vlm/gen_qwen2_vl.py`): tiny random
//! `Qwen2VLForConditionalGeneration` and `Qwen2_5_VLForConditionalGeneration` (window attention
//! over windows of 2 × 2 merge blocks) read from the hub's layout, the test images through rein's
//! processor, the expanded prompt's token ids, the multimodal positions and rope delta, the
//! merger's image features, the logits of every position and greedy continuations through the KV
//! cache — for one image, two images, a small RGBA image and a prompt without images.

use burn::tensor::{Tensor, TensorData};
use rein_model::vision::{ImageLimits, ImageProcessor, ImageSide, ProcessedImage, Qwen2VlProcessor, decode_rgb};
use serde_json::Value;

use super::*;

fn vlm_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/vlm")
}

fn model_dir() -> PathBuf {
    family_dir("qwen2_vl")
}

fn family_dir(family: &str) -> PathBuf {
    vlm_fixtures().join(format!("{family}_model"))
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn expected_tensor(family: &str, name: &str) -> Vec<f64> {
    let bytes = std::fs::read(vlm_fixtures().join(format!("{family}.expected.safetensors"))).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let view = file.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    (view.data().chunks_exact(4))
        .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
        .collect()
}

fn worst_difference(got: Tensor<B, 2>, want: &[f64]) -> f64 {
    let got: Vec<f32> = got.into_data().to_vec().unwrap();
    assert_eq!(got.len(), want.len());
    (got.iter().zip(want))
        .map(|(g, w)| (f64::from(*g) - w).abs())
        .fold(0.0, f64::max)
}

fn ids(value: &Value) -> Vec<u32> {
    (value.as_array().unwrap().iter())
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

fn processed(processor: &Qwen2VlProcessor, case: &Value) -> Vec<ProcessedImage> {
    (case["images"].as_array().unwrap().iter())
        .map(|file| {
            let bytes = std::fs::read(vlm_fixtures().join("images").join(file.as_str().unwrap())).unwrap();
            let image = processor.process(&decode_rgb(&bytes, ImageLimits::default()).unwrap());
            ProcessedImage::Qwen2Vl(image.unwrap())
        })
        .collect()
}

/// The logits of every position of one prompt with its images, `[seq, vocab]`.
fn prompt_logits(model: &CausalLm<B>, tokens: &[u32], images: &[ProcessedImage]) -> Tensor<B, 2> {
    let hidden = (model.prefill_with_images(tokens, images, None, &Default::default()))
        .unwrap()
        .hidden;
    let logits = model.logits(hidden);
    let [_, seq, vocab] = logits.dims();
    logits.reshape([seq, vocab])
}

/// `a` and `b` give the same logits, bit for bit, on case `case` of `<family>.expected.json`.
fn assert_same_logits(a: &CausalLm<B>, b: &CausalLm<B>, family: &str, case: usize) {
    let expected = read_json(&vlm_fixtures().join(format!("{family}.expected.json")));
    let case = &expected["cases"][case];
    let images = processed(&Qwen2VlProcessor::load(&model_dir()).unwrap(), case);
    let tokens = ids(&case["input_ids"]);
    let logits = |m: &CausalLm<B>| -> Vec<f32> { prompt_logits(m, &tokens, &images).into_data().to_vec().unwrap() };
    assert_eq!(logits(a), logits(b));
}

fn grid(image: &ProcessedImage) -> (usize, usize, usize) {
    match image {
        ProcessedImage::Qwen2Vl(image) => image.grid,
        ProcessedImage::Idefics3(_) => unreachable!("Qwen2-VL's processor made it"),
    }
}

fn image_side(model: &CausalLm<B>) -> &ImageSide<B> {
    let side = model.vision.as_ref().expect("a vision-language model");
    assert!(matches!(side, ImageSide::Qwen2Vl(_)), "a Qwen2-VL image side");
    side
}

#[test]
fn qwen2_vl_positions_features_logits_and_greedy_continuations_match_transformers() {
    matches_transformers("qwen2_vl");
}

#[test]
fn qwen2_5_vl_with_window_attention_matches_transformers() {
    matches_transformers("qwen2_5_vl");
}

fn matches_transformers(family: &str) {
    let device = Default::default();
    let dir = family_dir(family);
    let model = load::<B>(&dir, &device).unwrap();
    let processor = Qwen2VlProcessor::load(&dir).unwrap();
    let tokenizer = LmTokenizer::load(&dir, &[]).unwrap();
    let expected = read_json(&vlm_fixtures().join(format!("{family}.expected.json")));
    for case in expected["cases"].as_array().unwrap() {
        let name = &format!("{family} {}", case["name"].as_str().unwrap());
        let tensor = |what: &str| expected_tensor(family, &format!("{}.{what}", case["name"].as_str().unwrap()));
        let images = processed(&processor, case);
        let grids: Vec<Value> = images
            .iter()
            .map(|i| serde_json::json!([grid(i).0, grid(i).1, grid(i).2]))
            .collect();
        assert_eq!(Value::from(grids), case["grids"], "{name}: grids");
        // The chat template's `<|image_pad|>`, one per image, expanded.
        let text = ImageProcessor::Qwen2Vl(processor.clone())
            .expand_prompt(case["text"].as_str().unwrap(), &images)
            .unwrap();
        let tokens = tokenizer.encode(&text).unwrap();
        assert_eq!(tokens, ids(&case["input_ids"]), "{name}: token ids");

        let positions = image_side(&model).positions(&tokens, &images).unwrap().unwrap();
        let axes: Vec<Vec<i64>> = (0..3)
            .map(|axis| positions.positions.iter().map(|p| p[axis]).collect())
            .collect();
        assert_eq!(serde_json::json!(axes), case["position_ids"], "{name}: positions");
        let delta = positions.next - tokens.len() as i64;
        assert_eq!(Value::from(delta), case["rope_delta"], "{name}: rope delta");

        if !images.is_empty() {
            let features = image_side(&model).image_features(&images, &device);
            let worst = worst_difference(features, &tensor("image_features"));
            assert!(worst < 1e-4, "{name}: image features differ by up to {worst}");
        }

        let seq = tokens.len();
        let greedy = ids(&case["greedy"]);
        let mut cache = KvCache::new(model.config(), 1, seq + greedy.len(), &device);
        let prefill = (model.prefill_with_images(&tokens, &images, Some(&mut cache), &device)).unwrap();
        let logits = model.logits(prefill.hidden);
        let [_, _, vocab] = logits.dims();
        let worst = worst_difference(logits.clone().reshape([seq, vocab]), &tensor("logits"));
        assert!(worst < 1e-4, "{name}: logits differ by up to {worst}");

        // Greedy decoding from the cache at positions past the prompt's largest: the images are
        // encoded once, in the prefill.
        let rope = model.rope(prefill.next + greedy.len(), &device);
        let mut next = logits.slice([0..1, seq - 1..seq]).argmax(2).into_scalar() as u32;
        let mut continuation = vec![next];
        for step in 0..greedy.len() - 1 {
            let token = Tensor::<B, 2, Int>::from_data(TensorData::new(vec![i64::from(next)], [1, 1]), &device);
            let ctx = Context::single(&rope, prefill.next + step, 1, &device);
            let logits = model.forward(token, &ctx, Some(&mut cache));
            next = logits.argmax(2).into_scalar() as u32;
            continuation.push(next);
        }
        assert_eq!(continuation, greedy, "{name}: greedy continuation");
    }
}

#[test]
fn qwen2_vl_reads_transformers_in_memory_layout_too() {
    // transformers 5 names the parts `model.language_model.*` and `model.visual.*` in memory;
    // a checkpoint written that way loads to the same model.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("qwen2-vl-renamed");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(model_dir().join("config.json"), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(model_dir().join("model.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let renamed: Vec<(String, safetensors::tensor::TensorView<'_>)> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let name = match name.strip_prefix("visual.") {
                Some(rest) => format!("model.visual.{rest}"),
                None => name.replacen("model.", "model.language_model.", 1),
            };
            (name, view)
        })
        .collect();
    safetensors::serialize_to_file(renamed, None, &dir.join("model.safetensors")).unwrap();
    let device = Default::default();
    let ours = load::<B>(&model_dir(), &device).unwrap();
    let theirs = load::<B>(&dir, &device).unwrap();
    assert_same_logits(&ours, &theirs, "qwen2_vl", 0);
}

#[test]
fn qwen2_vl_prompts_whose_image_tokens_do_not_match_their_images_are_refused() {
    let device = Default::default();
    let model = load::<B>(&model_dir(), &device).unwrap();
    let processor = Qwen2VlProcessor::load(&model_dir()).unwrap();
    let expected = read_json(&vlm_fixtures().join("qwen2_vl.expected.json"));
    let case = &expected["cases"][0];
    let images = processed(&processor, case);
    let tokens = ids(&case["input_ids"]);
    let image = image_side(&model).image_token_id();
    // One image token short of the image's merged patches.
    let short: Vec<u32> = {
        let at = tokens.iter().position(|&t| t == image).unwrap();
        [&tokens[..at], &tokens[at + 1..]].concat()
    };
    let err = (model.prefill_with_images(&short, &images, None, &device)).unwrap_err();
    assert!(err.contains("image 0 has") && err.contains("image tokens"), "{err}");
    // The image tokens without their image.
    let err = (model.prefill_with_images(&tokens, &[], None, &device)).unwrap_err();
    assert!(err.contains("past the last of the 0 images"), "{err}");
}

#[test]
fn a_qwen2_5_vl_model_saved_loads_back_with_the_same_logits() {
    let device = Default::default();
    let model = load::<B>(&family_dir("qwen2_5_vl"), &device).unwrap();
    let saved = Path::new(env!("CARGO_TARGET_TMPDIR")).join("qwen2-5-vl-saved");
    let _ = std::fs::remove_dir_all(&saved);
    save(&model, &saved).unwrap();
    let back = load::<B>(&saved, &device).unwrap();
    assert!(matches!(back.vision, Some(ImageSide::Qwen2Vl(_))));
    assert_same_logits(&model, &back, "qwen2_5_vl", 1);
}

#[test]
fn the_sampler_decodes_qwen2_vl_prompts_at_their_multimodal_positions_as_transformers_does() {
    // Five prompts of different lengths and rope deltas, left-padded into one batch: each row
    // prefilled at its own positions and decoded from one past its largest.
    for family in ["qwen2_vl", "qwen2_5_vl"] {
        let dir = family_dir(family);
        let device = Default::default();
        let model = load::<B>(&dir, &device).unwrap();
        let processor = Qwen2VlProcessor::load(&dir).unwrap();
        let expected = read_json(&vlm_fixtures().join(format!("{family}.expected.json")));
        let cases = expected["cases"].as_array().unwrap();
        let prompts: Vec<Vec<u32>> = cases.iter().map(|c| ids(&c["input_ids"])).collect();
        let images: Vec<Vec<ProcessedImage>> = cases.iter().map(|c| processed(&processor, c)).collect();
        let images: Vec<&[ProcessedImage]> = images.iter().map(Vec::as_slice).collect();
        let greedy: Vec<Vec<u32>> = cases.iter().map(|c| ids(&c["greedy"])).collect();
        let config = rein_sampler::GenerationConfig {
            max_new_tokens: 8,
            temperature: 0.0,
            ..Default::default()
        };
        let prompt_images = || {
            rein_sampler::PromptImages::of_prompts(model.vision.as_ref(), &prompts, &images, &device)
                .unwrap()
                .unwrap()
        };
        let whole = rein_sampler::generate_with_images(
            &model,
            &prompts,
            prompt_images(),
            &config,
            0,
            &mut |_, _| false,
            &device,
        )
        .unwrap();
        assert_eq!(
            whole.iter().map(|g| g.tokens.clone()).collect::<Vec<_>>(),
            greedy,
            "{family}"
        );

        let seeds: Vec<u64> = (0..prompts.len()).map(|p| rein_sampler::prompt_seed(0, p)).collect();
        let mut chunked = rein_sampler::Decoding::in_chunks(&model, &prompts, &seeds, &config, 0, 16, &device)
            .with_images(prompt_images())
            .unwrap();
        chunked.advance(usize::MAX, &mut |_, _| false);
        let chunked: Vec<Vec<u32>> = chunked.into_generations().into_iter().map(|g| g.tokens).collect();
        assert_eq!(chunked, greedy, "{family}: prefilled 16 columns at a time");

        // A prompt whose images are not its image tokens' is refused by number.
        let mut swapped = images.clone();
        swapped.swap(0, 1);
        let error = rein_sampler::PromptImages::of_prompts(model.vision.as_ref(), &prompts, &swapped, &device)
            .err()
            .unwrap();
        assert!(error.starts_with("prompt 0: "), "{error}");
    }
}

#[test]
fn a_hub_config_with_the_decoder_at_the_top_level_and_mrope_scaling_loads_alike() {
    // The released checkpoints' config.json (transformers 4): the decoder's keys at the top
    // level, `rope_scaling = {"type": "mrope", "mrope_section": …}`, the vision config's
    // `in_chans`.
    let mut config = read_json(&model_dir().join("config.json"));
    let text = config["text_config"].as_object().unwrap().clone();
    let map = config.as_object_mut().unwrap();
    map.remove("text_config");
    for (key, value) in text {
        map.entry(key).or_insert(value);
    }
    let section = map["rope_parameters"]["mrope_section"].clone();
    map.remove("rope_parameters");
    map.insert("rope_theta".into(), 10000.0.into());
    map.insert(
        "rope_scaling".into(),
        serde_json::json!({"type": "mrope", "mrope_section": section}),
    );
    map.insert("model_type".into(), "qwen2_vl".into());
    map["vision_config"]["in_chans"] = 3.into();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("qwen2-vl-flat-config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), serde_json::to_string(&config).unwrap()).unwrap();
    std::fs::copy(model_dir().join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let device = Default::default();
    let (ours, flat) = (
        load::<B>(&model_dir(), &device).unwrap(),
        load::<B>(&dir, &device).unwrap(),
    );
    assert_same_logits(&ours, &flat, "qwen2_vl", 0);

    // An mrope_section that does not split the rotary frequencies is refused by key.
    config["rope_scaling"]["mrope_section"] = serde_json::json!([2, 2, 3]);
    std::fs::write(dir.join("config.json"), serde_json::to_string(&config).unwrap()).unwrap();
    let err = load::<B>(&dir, &device).unwrap_err().to_string();
    assert!(err.contains("mrope_section") && err.contains("[2, 2, 3]"), "{err}");
}

#[test]
fn peft_adapters_on_a_qwen2_vl_decoder_load_and_save_under_transformers_names() {
    // PEFT's adapters (`gen_qwen2_vl_lora.py`) by module names and by a regular expression over
    // the decoder's paths (`model.language_model.layers…`): rein's adapted model gives PEFT's
    // logits, and the adapter it saves holds PEFT's tensor names and loads back to the same.
    let device = Default::default();
    let bytes = std::fs::read(vlm_fixtures().join("qwen2_vl_lora.expected.safetensors")).unwrap();
    let expected = SafeTensors::deserialize(&bytes).unwrap();
    let case = &read_json(&vlm_fixtures().join("qwen2_vl.expected.json"))["cases"][0];
    let images = processed(&Qwen2VlProcessor::load(&model_dir()).unwrap(), case);
    let tokens = ids(&case["input_ids"]);
    let logits = |m: &CausalLm<B>| prompt_logits(m, &tokens, &images);
    for name in ["names", "pattern"] {
        let adapter = vlm_fixtures().join("qwen2_vl_lora").join(name);
        let base = load::<B>(&model_dir(), &device).unwrap();
        let model = rein_model::lm::peft::load_adapter(base, &adapter, &device).unwrap();
        let want: Vec<f64> = (expected
            .tensor(&format!("{name}.logits"))
            .unwrap()
            .data()
            .chunks_exact(4))
        .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
        .collect();
        let worst = worst_difference(logits(&model), &want);
        assert!(worst < 1e-4, "{name}: logits differ from PEFT's by up to {worst}");

        let saved = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("qwen2-vl-lora-{name}"));
        rein_model::lm::peft::save_adapter(&model, &saved, "qwen2_vl_model").unwrap();
        let names = |dir: &Path| -> Vec<String> {
            let bytes = std::fs::read(dir.join("adapter_model.safetensors")).unwrap();
            let mut names: Vec<String> = SafeTensors::deserialize(&bytes)
                .unwrap()
                .names()
                .into_iter()
                .map(String::from)
                .collect();
            names.sort();
            names
        };
        assert_eq!(names(&saved), names(&adapter), "{name}: tensor names");
        let config = read_json(&saved.join("adapter_config.json"));
        let pattern = config["target_modules"].as_str().unwrap();
        assert!(pattern.starts_with(r"model\.language_model\.layers"), "{pattern}");
        let again =
            rein_model::lm::peft::load_adapter(load::<B>(&model_dir(), &device).unwrap(), &saved, &device).unwrap();
        let (a, b): (Vec<f32>, Vec<f32>) = (
            logits(&model).into_data().to_vec().unwrap(),
            logits(&again).into_data().to_vec().unwrap(),
        );
        assert_eq!(a, b, "{name}: saved and loaded back");
    }
}
