//! Qwen2-VL and Qwen2.5-VL against transformers (`tests/fixtures/vlm/gen_qwen2_vl.py`): tiny random
//! `Qwen2VLForConditionalGeneration` and `Qwen2_5_VLForConditionalGeneration` (window attention
//! over windows of 2 × 2 merge blocks) read from the hub's layout, the test images through rein's
//! processor, the expanded prompt's token ids, the multimodal positions and rope delta, the
//! merger's image features, the logits of every position and greedy continuations through the KV
//! cache — for one image, two images, a small RGBA image and a prompt without images.

use burn::tensor::{Tensor, TensorData};
use rein_model::vision::{ImageLimits, Qwen2Vl, Qwen2VlImage, Qwen2VlProcessor, decode_rgb};
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

fn processed(processor: &Qwen2VlProcessor, case: &Value) -> Vec<Qwen2VlImage> {
    (case["images"].as_array().unwrap().iter())
        .map(|file| {
            let bytes = std::fs::read(vlm_fixtures().join("images").join(file.as_str().unwrap())).unwrap();
            processor
                .process(&decode_rgb(&bytes, ImageLimits::default()).unwrap())
                .unwrap()
        })
        .collect()
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
    let model = Qwen2Vl::<B>::load(&dir, &device).unwrap();
    let processor = Qwen2VlProcessor::from_json(&read_json(&dir.join("preprocessor_config.json"))).unwrap();
    let tokenizer = LmTokenizer::load(&dir, &[]).unwrap();
    let expected = read_json(&vlm_fixtures().join(format!("{family}.expected.json")));
    for case in expected["cases"].as_array().unwrap() {
        let name = &format!("{family} {}", case["name"].as_str().unwrap());
        let tensor = |what: &str| expected_tensor(family, &format!("{}.{what}", case["name"].as_str().unwrap()));
        let images = processed(&processor, case);
        let grids: Vec<Value> = images
            .iter()
            .map(|i| serde_json::json!([i.grid.0, i.grid.1, i.grid.2]))
            .collect();
        assert_eq!(Value::from(grids), case["grids"], "{name}: grids");
        let text = processor
            .expand_prompt(case["text"].as_str().unwrap(), &images)
            .unwrap();
        let tokens = tokenizer.encode(&text).unwrap();
        assert_eq!(tokens, ids(&case["input_ids"]), "{name}: token ids");

        let positions = model.positions(&tokens, &images).unwrap();
        let axes: Vec<Vec<i64>> = (0..3)
            .map(|axis| positions.positions.iter().map(|p| p[axis]).collect())
            .collect();
        assert_eq!(serde_json::json!(axes), case["position_ids"], "{name}: positions");
        let delta = positions.next - tokens.len() as i64;
        assert_eq!(Value::from(delta), case["rope_delta"], "{name}: rope delta");

        if !images.is_empty() {
            let features = model.image_features(&images, &device);
            let worst = worst_difference(features, &tensor("image_features"));
            assert!(worst < 1e-4, "{name}: image features differ by up to {worst}");
        }

        let seq = tokens.len();
        let greedy = ids(&case["greedy"]);
        let mut cache = KvCache::new(model.lm.config(), 1, seq + greedy.len(), &device);
        let prefill = model.prefill(&tokens, &images, Some(&mut cache), &device).unwrap();
        let logits = model.lm.logits(prefill.hidden);
        let [_, _, vocab] = logits.dims();
        let worst = worst_difference(logits.clone().reshape([seq, vocab]), &tensor("logits"));
        assert!(worst < 1e-4, "{name}: logits differ by up to {worst}");

        // Greedy decoding from the cache at positions past the prompt's largest: the images are
        // encoded once, in the prefill.
        let rope = model.lm.rope(prefill.next + greedy.len(), &device);
        let mut next = logits.slice([0..1, seq - 1..seq]).argmax(2).into_scalar() as u32;
        let mut continuation = vec![next];
        for step in 0..greedy.len() - 1 {
            let token = Tensor::<B, 2, Int>::from_data(TensorData::new(vec![i64::from(next)], [1, 1]), &device);
            let ctx = Context::single(&rope, prefill.next + step, 1, &device);
            let logits = model.lm.forward(token, &ctx, Some(&mut cache));
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
    let ours = Qwen2Vl::<B>::load(&model_dir(), &device).unwrap();
    let theirs = Qwen2Vl::<B>::load(&dir, &device).unwrap();
    let processor = Qwen2VlProcessor::from_json(&read_json(&model_dir().join("preprocessor_config.json"))).unwrap();
    let expected = read_json(&vlm_fixtures().join("qwen2_vl.expected.json"));
    let case = &expected["cases"][0];
    let images = processed(&processor, case);
    let tokens = ids(&case["input_ids"]);
    let logits = |m: &Qwen2Vl<B>| -> Vec<f32> {
        let hidden = m.prefill(&tokens, &images, None, &device).unwrap().hidden;
        m.lm.logits(hidden).into_data().to_vec().unwrap()
    };
    assert_eq!(logits(&ours), logits(&theirs));
}

#[test]
fn qwen2_vl_prompts_whose_image_tokens_do_not_match_their_images_are_refused() {
    let device = Default::default();
    let model = Qwen2Vl::<B>::load(&model_dir(), &device).unwrap();
    let processor = Qwen2VlProcessor::from_json(&read_json(&model_dir().join("preprocessor_config.json"))).unwrap();
    let expected = read_json(&vlm_fixtures().join("qwen2_vl.expected.json"));
    let case = &expected["cases"][0];
    let images = processed(&processor, case);
    let tokens = ids(&case["input_ids"]);
    let image = model.image_token_id();
    // One image token short of the image's merged patches.
    let short: Vec<u32> = {
        let at = tokens.iter().position(|&t| t == image).unwrap();
        [&tokens[..at], &tokens[at + 1..]].concat()
    };
    let err = model.prefill(&short, &images, None, &device).unwrap_err();
    assert!(err.contains("image 0 has") && err.contains("image tokens"), "{err}");
    // The image tokens without their image.
    let err = model.prefill(&tokens, &[], None, &device).unwrap_err();
    assert!(err.contains("past the last of the 0 images"), "{err}");
    // `lm::load` names what to load a Qwen2-VL checkpoint with.
    let err = load::<B>(&model_dir(), &device).unwrap_err().to_string();
    assert!(
        err.contains("Qwen2VLForConditionalGeneration") && err.contains("Qwen2Vl"),
        "{err}"
    );
}

#[test]
fn a_qwen2_5_vl_model_saved_loads_back_with_the_same_logits() {
    let device = Default::default();
    let model = Qwen2Vl::<B>::load(&family_dir("qwen2_5_vl"), &device).unwrap();
    let saved = Path::new(env!("CARGO_TARGET_TMPDIR")).join("qwen2-5-vl-saved");
    let _ = std::fs::remove_dir_all(&saved);
    model.save(&saved).unwrap();
    let back = Qwen2Vl::<B>::load(&saved, &device).unwrap();
    let processor = Qwen2VlProcessor::from_json(&read_json(&model_dir().join("preprocessor_config.json"))).unwrap();
    let expected = read_json(&vlm_fixtures().join("qwen2_5_vl.expected.json"));
    let case = &expected["cases"][1];
    let images = processed(&processor, case);
    let tokens = ids(&case["input_ids"]);
    let logits = |m: &Qwen2Vl<B>| -> Vec<f32> {
        let hidden = m.prefill(&tokens, &images, None, &device).unwrap().hidden;
        m.lm.logits(hidden).into_data().to_vec().unwrap()
    };
    assert_eq!(logits(&model), logits(&back));
}
