//! Qwen2-VL's image processor against transformers (`tests/fixtures/vlm/gen_qwen2_vl_processor.py`):
//! `smart_resize` into `min_pixels`/`max_pixels` (enlarging, shrinking, rounding to multiples),
//! Pillow's BICUBIC, BILINEAR and LANCZOS, RGBA over white, a grey image, the patches in the merge
//! blocks' order with their repeated frame, the grids, and the prompt's `<|image_pad|>` expansion.

use rein_model::vision::{ImageLimits, Qwen2VlImage, Qwen2VlProcessor, decode_rgb};
use serde_json::Value;

use super::*;

fn vlm_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/vlm")
}

#[test]
fn qwen2_vl_patches_grids_and_prompts_match_transformers() {
    let read_json = |path: PathBuf| -> Value { serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap() };
    let saved = read_json(vlm_fixtures().join("qwen2_vl/preprocessor_config.json"));
    let expected = read_json(vlm_fixtures().join("qwen2_vl_processor.expected.json"));
    let bytes = std::fs::read(vlm_fixtures().join("qwen2_vl_processor.expected.safetensors")).unwrap();
    let tensors = SafeTensors::deserialize(&bytes).unwrap();
    for case in expected["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let mut settings = saved.clone();
        for (key, value) in case["overrides"].as_object().unwrap() {
            // The fixture's overrides name min_pixels/max_pixels; the saved file holds `size`.
            match key.as_str() {
                "min_pixels" => settings["size"]["shortest_edge"] = value.clone(),
                "max_pixels" => settings["size"]["longest_edge"] = value.clone(),
                _ => settings[key] = value.clone(),
            }
        }
        let processor = Qwen2VlProcessor::from_json(&settings).unwrap();
        let images: Vec<Qwen2VlImage> = (case["images"].as_array().unwrap().iter())
            .map(|file| {
                let bytes = std::fs::read(vlm_fixtures().join("images").join(file.as_str().unwrap())).unwrap();
                processor
                    .process(&decode_rgb(&bytes, ImageLimits::default()).unwrap())
                    .unwrap()
            })
            .collect();
        let grids: Vec<Vec<usize>> = images.iter().map(|i| vec![i.grid.0, i.grid.1, i.grid.2]).collect();
        let want_grids: Vec<Vec<usize>> = serde_json::from_value(case["grids"].clone()).unwrap();
        assert_eq!(grids, want_grids, "{name}: grids");
        let view = tensors.tensor(&format!("{name}.pixel_values")).unwrap();
        let want: Vec<f32> = (view.data().chunks_exact(4))
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let got: Vec<f32> = images.iter().flat_map(|i| i.patches.iter().copied()).collect();
        assert_eq!(got.len(), want.len(), "{name}: patch values");
        // Pillow's 8-bit resampling reproduced: the same samples, rescaled and normalised alike.
        let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0.0f32, f32::max);
        assert_eq!(worst, 0.0, "{name}: pixel values");
        let text = processor
            .expand_prompt(case["text"].as_str().unwrap(), &images)
            .unwrap();
        assert_eq!(text, case["expanded"].as_str().unwrap(), "{name}: prompt");
    }
}
