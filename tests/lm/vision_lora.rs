//! LoRA adapters on the vision encoder against PEFT (`tests/fixtures/vlm/gen_vision_lora.py`,
//! PEFT 0.21.2): adapters PEFT put on the vision towers of the tiny Idefics3 (by module names,
//! which select SigLIP's modules too), Qwen2-VL (a pattern over the decoder's `q_proj` and every
//! linear layer of the vision blocks) and Qwen2.5-VL (the vision blocks only) load onto rein's
//! models and give PEFT's logits; the adapters rein saves load back to the same logits; merged
//! into the weights, they give the same logits from a plain model; and fresh adapters
//! (`[lora] vision = true`) change nothing until they train.

use rein_core::SeededRng;
use rein_model::lm::lora::LoraSpec;
use rein_model::lm::peft::{load_adapter, save_adapter};
use rein_model::vision::{ImageLimits, ImageProcessor, ProcessedImage, decode_rgb};
use serde_json::Value;

use super::*;

fn vlm_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/vlm")
}

/// The family's model directory and its first fixture case (tokens, images).
fn first_case(family: &str) -> (PathBuf, Vec<u32>, Vec<ProcessedImage>) {
    let dir = vlm_fixtures().join(match family {
        "idefics3" => "idefics3".to_string(),
        family => format!("{family}_model"),
    });
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(vlm_fixtures().join(format!("{family}.expected.json"))).unwrap())
            .unwrap();
    let case = &expected["cases"][0];
    let model = load::<B>(&dir, &Default::default()).unwrap();
    let processor = ImageProcessor::load(&dir, model.vision.as_ref().unwrap()).unwrap();
    let images = (case["images"].as_array().unwrap().iter())
        .map(|name| {
            let bytes = std::fs::read(vlm_fixtures().join("images").join(name.as_str().unwrap())).unwrap();
            processor
                .process(&decode_rgb(&bytes, ImageLimits::default()).unwrap())
                .unwrap()
        })
        .collect();
    let tokens = (case["input_ids"].as_array().unwrap().iter())
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    (dir, tokens, images)
}

fn logits(model: &CausalLm<B>, tokens: &[u32], images: &[ProcessedImage]) -> Vec<f32> {
    let hidden = (model.prefill_with_images(tokens, images, None, &Default::default()))
        .unwrap()
        .hidden;
    model.logits(hidden).into_data().to_vec().unwrap()
}

fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn tensor_names(dir: &Path) -> Vec<String> {
    let bytes = std::fs::read(dir.join("adapter_model.safetensors")).unwrap();
    let mut names: Vec<String> = (SafeTensors::deserialize(&bytes).unwrap().names().into_iter())
        .map(String::from)
        .collect();
    names.sort();
    names
}

#[test]
fn peft_adapters_on_vision_encoders_give_peft_logits_and_save_under_its_names() {
    let bytes = std::fs::read(vlm_fixtures().join("vision_lora.expected.safetensors")).unwrap();
    let expected = SafeTensors::deserialize(&bytes).unwrap();
    let device = Default::default();
    for family in ["idefics3", "qwen2_vl", "qwen2_5_vl"] {
        let (dir, tokens, images) = first_case(family);
        let adapter = vlm_fixtures().join("vision_lora").join(family);
        let base = || load::<B>(&dir, &device).unwrap();
        let model = load_adapter(base(), &adapter, &device).unwrap();
        assert!(
            model.lora.as_ref().unwrap().spec().vision,
            "{family}: the targets select vision modules"
        );
        let want: Vec<f32> = (expected
            .tensor(&format!("{family}.logits"))
            .unwrap()
            .data()
            .chunks_exact(4))
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
        let adapted = logits(&model, &tokens, &images);
        let difference = worst(&adapted, &want);
        assert!(
            difference < 1e-4,
            "{family}: logits differ from PEFT's by up to {difference}"
        );
        // Without the vision adapters the logits are another model's: the test sees them.
        let plain = logits(&base(), &tokens, &images);
        assert!(worst(&plain, &want) > 1e-2, "{family}: the adapters change nothing");

        let saved = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("vision-lora-{family}"));
        save_adapter(&model, &saved, "base").unwrap();
        assert_eq!(tensor_names(&saved), tensor_names(&adapter), "{family}: tensor names");
        let again = load_adapter(base(), &saved, &device).unwrap();
        assert_eq!(
            logits(&again, &tokens, &images),
            adapted,
            "{family}: saved and loaded back"
        );

        let merged = model.merged();
        assert!(merged.lora.is_none());
        let difference = worst(&logits(&merged, &tokens, &images), &adapted);
        assert!(difference < 1e-4, "{family}: merged weights differ by {difference}");
    }
}

#[test]
fn fresh_vision_adapters_change_nothing_and_cover_every_linear_layer_of_the_blocks() {
    let device = Default::default();
    for family in ["idefics3", "qwen2_vl", "qwen2_5_vl"] {
        let (dir, tokens, images) = first_case(family);
        let base = load::<B>(&dir, &device).unwrap();
        let spec = LoraSpec {
            rank: 2,
            alpha: 4.0,
            dropout: 0.0,
            targets: vec!["q_proj".into()],
            rslora: false,
            vision: true,
        };
        let before = logits(&base, &tokens, &images);
        let adapted = base.with_lora(&spec, &mut SeededRng::new(1), &device);
        assert_eq!(logits(&adapted, &tokens, &images), before, "{family}");
        let vision = adapted.vision.as_ref().unwrap();
        let adapters = vision.adapters();
        let linears: usize = vision.adaptable_linears().iter().map(Vec::len).sum();
        assert_eq!(adapters.len(), linears, "{family}");
        assert!(adapters.iter().all(|(_, a)| a.is_some()), "{family}");
        // Without `vision`, the encoder gets none.
        let decoder_only = LoraSpec { vision: false, ..spec };
        let model = load::<B>(&dir, &device)
            .unwrap()
            .with_lora(&decoder_only, &mut SeededRng::new(1), &device);
        assert!(model.vision.as_ref().unwrap().adapters().is_empty(), "{family}");
    }
}
