//! Idefics3 / SmolVLM against transformers (`tests/fixtures/vlm/gen_idefics3.py`): the image
//! processor's pixel values (Pillow's LANCZOS, tiling, the global view, RGBA over white, a grey
//! image, an image smaller than a tile), the expanded prompt's token ids, the connector's image
//! features, the logits of every position and greedy continuations through the KV cache.

use burn::tensor::{Tensor, TensorData};
use rein_model::vision::{Idefics3Image, Idefics3Processor, Idefics3Vision, ImageLimits, ImageSide, decode_rgb};
use serde_json::Value;

use super::*;

/// The image side of a vision-language model.
fn image_side(model: &CausalLm<B>) -> &Idefics3Vision<B> {
    match model.vision.as_ref() {
        Some(ImageSide::Idefics3(vision)) => vision,
        _ => panic!("an Idefics3 model"),
    }
}

fn vlm_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/vlm")
}

fn cases() -> Vec<Value> {
    let text = std::fs::read_to_string(vlm_fixtures().join("idefics3.expected.json")).unwrap();
    let json: Value = serde_json::from_str(&text).unwrap();
    json["cases"].as_array().unwrap().clone()
}

fn expected_tensor(name: &str) -> (Vec<usize>, Vec<f64>) {
    let bytes = std::fs::read(vlm_fixtures().join("idefics3.expected.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let view = file.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let values = view
        .data()
        .chunks_exact(4)
        .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
        .collect();
    (view.shape().to_vec(), values)
}

fn worst_difference(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(g, w)| (f64::from(*g) - w).abs())
        .fold(0.0, f64::max)
}

/// The case's images processed as transformers processed them.
fn processed(processor: &Idefics3Processor, case: &Value) -> Vec<Idefics3Image> {
    let processor = processor.clone().with_splitting(case["split"].as_bool().unwrap());
    (case["images"].as_array().unwrap().iter())
        .map(|name| {
            let bytes = std::fs::read(vlm_fixtures().join("images").join(name.as_str().unwrap())).unwrap();
            processor.process(&decode_rgb(&bytes, ImageLimits::default()).unwrap())
        })
        .collect()
}

fn ids(case: &Value, key: &str) -> Vec<u32> {
    (case[key].as_array().unwrap().iter())
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn idefics3_pixel_values_and_prompt_tokens_match_transformers() {
    let dir = vlm_fixtures().join("idefics3");
    let model = load::<B>(&dir, &Default::default()).unwrap();
    let processor = Idefics3Processor::load(&dir, image_side(&model).image_seq_len()).unwrap();
    let tokenizer = LmTokenizer::load(&dir, &[]).unwrap();
    for case in cases() {
        let name = case["name"].as_str().unwrap();
        let images = processed(&processor, &case);
        let got: Vec<f32> = images.iter().flat_map(|i| i.pixel_values.iter().copied()).collect();
        let (shape, want) = expected_tensor(&format!("{name}.pixel_values"));
        assert_eq!(shape[0], images.iter().map(|i| i.tiles).sum::<usize>(), "{name}: tiles");
        // Pillow's 8-bit arithmetic reproduced: the same samples, rescaled and normalised alike.
        assert_eq!(worst_difference(&got, &want), 0.0, "{name}: pixel values");
        let text = processor
            .expand_prompt(case["text"].as_str().unwrap(), &images)
            .unwrap();
        assert_eq!(
            tokenizer.encode(&text).unwrap(),
            ids(&case, "input_ids"),
            "{name}: token ids"
        );
    }
}

#[test]
fn idefics3_features_logits_and_greedy_continuations_match_transformers() {
    let dir = vlm_fixtures().join("idefics3");
    let device = Default::default();
    let model = load::<B>(&dir, &device).unwrap();
    let processor = Idefics3Processor::load(&dir, image_side(&model).image_seq_len()).unwrap();
    for case in cases() {
        let name = case["name"].as_str().unwrap();
        let images = processed(&processor, &case);
        let features = image_side(&model).image_features(Idefics3Image::stack(&images, &device));
        let (_, want) = expected_tensor(&format!("{name}.image_features"));
        let got: Vec<f32> = features.clone().into_data().to_vec().unwrap();
        let worst = worst_difference(&got, &want);
        assert!(worst < 1e-4, "{name}: image features differ by up to {worst}");

        let tokens = ids(&case, "input_ids");
        let seq = tokens.len();
        let greedy = ids(&case, "greedy");
        let rope = model.rope(seq + greedy.len(), &device);
        let ctx = |start: usize, len: usize| Context::single(&rope, start, len, &device);
        let mut cache = KvCache::new(model.config(), 1, seq + greedy.len(), &device);
        let hidden = model.hidden_with_images(&[tokens], features, &ctx(0, seq), Some(&mut cache));
        let logits = model.logits(hidden);
        let (_, want) = expected_tensor(&format!("{name}.logits"));
        let got: Vec<f32> = logits.clone().into_data().to_vec().unwrap();
        let worst = worst_difference(&got, &want);
        assert!(worst < 1e-4, "{name}: logits differ by up to {worst}");

        // Greedy decoding from the cache: the images are encoded once, in the prefill.
        let mut next = logits.slice([0..1, seq - 1..seq]).argmax(2).into_scalar() as u32;
        let mut continuation = vec![next];
        for step in 0..greedy.len() - 1 {
            let token = Tensor::<B, 2, Int>::from_data(TensorData::new(vec![i64::from(next)], [1, 1]), &device);
            let logits = model.forward(token, &ctx(seq + step, 1), Some(&mut cache));
            next = logits.argmax(2).into_scalar() as u32;
            continuation.push(next);
        }
        assert_eq!(continuation, greedy, "{name}: greedy continuation");
    }
}

#[test]
fn a_prompt_whose_image_markers_do_not_match_its_images_is_refused() {
    let dir = vlm_fixtures().join("idefics3");
    let processor = Idefics3Processor::load(&dir, 4).unwrap();
    let case = &cases()[1];
    let images = processed(&processor, case);
    let error = processor.expand_prompt("<image> only one", &images).unwrap_err();
    assert!(error.contains("1 `<image>` markers for 2 images"), "{error}");
}

#[test]
fn an_idefics3_model_saved_loads_back_with_the_same_image_features_and_logits() {
    let dir = vlm_fixtures().join("idefics3");
    let device = Default::default();
    let model = load::<B>(&dir, &device).unwrap();
    let saved = Path::new(env!("CARGO_TARGET_TMPDIR")).join("idefics3-saved");
    let _ = std::fs::remove_dir_all(&saved);
    save(&model, &saved).unwrap();
    let again = load::<B>(&saved, &device).unwrap();
    let processor = Idefics3Processor::load(&dir, image_side(&model).image_seq_len()).unwrap();
    let case = &cases()[0];
    let pixels = || Idefics3Image::stack(&processed(&processor, case), &device);
    let (a, b) = (
        image_side(&model).image_features(pixels()),
        image_side(&again).image_features(pixels()),
    );
    assert_eq!(a.clone().into_data(), b.clone().into_data());
    let tokens = ids(case, "input_ids");
    let seq = tokens.len();
    let rope = model.rope(seq, &device);
    let ctx = Context::single(&rope, 0, seq, &device);
    let logits = |m: &CausalLm<B>, f| m.logits(m.hidden_with_images(std::slice::from_ref(&tokens), f, &ctx, None));
    assert_eq!(logits(&model, a).into_data(), logits(&again, b).into_data());
}

/// Every case's prompt in one batch (left-padded to the longest), their images' features in
/// prompt order, decoded greedily by the sampler: each row continues as transformers does alone,
/// with the prompt prefilled in one pass or 16 columns at a time, and with the last row's
/// features missing the sampler refuses.
#[test]
fn the_sampler_decodes_prompts_with_images_as_transformers_does() {
    let dir = vlm_fixtures().join("idefics3");
    let device = Default::default();
    let model = load::<B>(&dir, &device).unwrap();
    let processor = Idefics3Processor::load(&dir, image_side(&model).image_seq_len()).unwrap();
    let cases = cases();
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| ids(c, "input_ids")).collect();
    let features: Vec<Tensor<B, 2>> = (cases.iter())
        .map(|c| image_side(&model).image_features(Idefics3Image::stack(&processed(&processor, c), &device)))
        .collect();
    let images = |features: Vec<Tensor<B, 2>>| rein_sampler::PromptImages {
        features: Tensor::cat(features, 0),
        token: image_side(&model).image_token_id(),
        positions: None,
    };
    let config = rein_sampler::GenerationConfig {
        max_new_tokens: 8,
        temperature: 0.0,
        ..Default::default()
    };
    let greedy: Vec<Vec<u32>> = cases.iter().map(|c| ids(c, "greedy")).collect();
    let whole = rein_sampler::generate_with_images(
        &model,
        &prompts,
        images(features.clone()),
        &config,
        0,
        &mut |_, _| false,
        &device,
    )
    .unwrap();
    assert_eq!(whole.iter().map(|g| g.tokens.clone()).collect::<Vec<_>>(), greedy);

    let seeds: Vec<u64> = (0..prompts.len()).map(|p| rein_sampler::prompt_seed(0, p)).collect();
    let mut chunked = rein_sampler::Decoding::in_chunks(&model, &prompts, &seeds, &config, 0, 16, &device)
        .with_images(images(features.clone()))
        .unwrap();
    chunked.advance(usize::MAX, &mut |_, _| false);
    let chunked: Vec<Vec<u32>> = chunked.into_generations().into_iter().map(|g| g.tokens).collect();
    assert_eq!(chunked, greedy, "prefilled 16 columns at a time");

    let short = features[..features.len() - 1].to_vec();
    let error =
        rein_sampler::generate_with_images(&model, &prompts, images(short), &config, 0, &mut |_, _| false, &device)
            .unwrap_err();
    assert!(error.contains("image tokens for"), "{error}");
}

/// JPEG decoding against Pillow's (`tests/fixtures/vlm/gen_jpeg_decode.py`): rein decodes with
/// the `image` crate, whose inverse DCT and chroma upsampling are not libjpeg's, so samples may
/// differ by a little; the bound below is what was measured, so a regression shows.
#[test]
fn jpeg_decoding_stays_within_three_levels_of_pillows() {
    let bytes = std::fs::read(vlm_fixtures().join("images/photo.jpg")).unwrap();
    let ours = decode_rgb(&bytes, ImageLimits::default()).unwrap();
    let expected = std::fs::read(vlm_fixtures().join("jpeg_decode.expected.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&expected).unwrap();
    let pillow = file.tensor("rgb").unwrap();
    assert_eq!(pillow.shape(), [ours.height, ours.width, 3]);
    let differences: Vec<u8> = (ours.data.iter().zip(pillow.data()))
        .map(|(a, b)| a.abs_diff(*b))
        .collect();
    let worst = differences.iter().copied().max().unwrap_or(0);
    let differing = differences.iter().filter(|&&d| d > 0).count() as f64 / differences.len() as f64;
    // Measured 2026-12-07 (image 0.25, Pillow 13): 3 levels at worst, 27 % of samples off.
    assert!(
        worst <= 3 && differing < 0.3,
        "{worst} levels at worst, {:.1} % of samples differ",
        differing * 100.0
    );
}
