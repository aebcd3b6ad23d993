//! Loading and saving: round trips, the errors that name what is wrong, tokenizers and chat
//! templates read from a checkpoint, a router gone non-finite named.

use super::*;

#[test]
fn save_then_load_is_exact() {
    for name in [
        "qwen2-gqa",
        "llama-bf16-sharded",
        "qwen3-window",
        "qwen3-moe",
        "gemma3",
        "gemma2",
    ] {
        let m = model(name);
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("saved-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        save(&m, &dir).unwrap();
        let again = load::<B>(&dir, &Default::default()).unwrap();
        assert_eq!(again.config().tie_word_embeddings, m.config().tie_word_embeddings);
        let (shape, ids) = expected(name, "input_ids");
        let tokens = int_tensor(&ids, [shape[0], shape[1]]);
        assert_eq!(
            logits(&again, tokens.clone(), false),
            logits(&m, tokens, false),
            "{name}: logits differ after a round trip"
        );
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
        let original: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixtures().join(name).join("config.json")).unwrap()).unwrap();
        assert_eq!(config["architectures"], original["architectures"], "{name}");
        assert_eq!(again.config().layer_attention(), m.config().layer_attention(), "{name}");
    }
}

/// A router that yields NaN does not panic the forward pass: the routing names the layer.
#[test]
fn a_router_that_yields_nan_is_named() {
    let mut m = model("qwen3-moe");
    if let rein_model::lm::MlpBlock::Experts(moe) = &mut m.layers[2].mlp {
        let weight = moe.gate.weight.val();
        let nan = weight.clone().mul_scalar(f32::NAN);
        moe.gate.weight = burn::module::Param::from_tensor(nan);
    }
    let routing = Routing::record();
    let dev = Default::default();
    let rope = m.rope(4, &dev);
    let positions = Tensor::<B, 1, Int>::arange(0..4, &dev).unsqueeze::<2>();
    let ctx = Context {
        rope: &rope,
        positions,
        padding: None,
        sequences: None,
        fused: None,
        routing: Some(&routing),
    };
    let _ = m.forward(int_tensor(&[5.0, 6.0, 7.0, 8.0], [1, 4]), &ctx, None);
    assert_eq!(routing.non_finite_layer(), Some(2));
}

#[test]
fn loading_errors_name_the_problem() {
    let copy = |name: &str, tag: &str| -> PathBuf {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("broken-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for entry in std::fs::read_dir(fixtures().join(name)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
        }
        dir
    };
    let edit_config = |dir: &Path, f: &dyn Fn(&mut serde_json::Value)| {
        let path = dir.join("config.json");
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        f(&mut v);
        std::fs::write(path, v.to_string()).unwrap();
    };
    let dev = Default::default();

    let dir = copy("qwen2-gqa", "arch");
    edit_config(&dir, &|v| v["model_type"] = "gpt2".into());
    let err = load::<B>(&dir, &dev).unwrap_err();
    assert!(
        matches!(&err, LoadError::Unsupported { field, .. } if field == "model_type"),
        "{err}"
    );
    assert!(err.to_string().contains("`gpt2` is not supported"), "{err}");

    let dir = copy("qwen2-gqa", "shape");
    edit_config(&dir, &|v| v["intermediate_size"] = 96.into());
    let err = load::<B>(&dir, &dev).unwrap_err();
    assert!(
        matches!(&err, LoadError::Shape { name, expected, found } if name.ends_with("gate_proj.weight") && expected == &vec![96, 64] && found == &vec![128, 64]),
        "{err}"
    );

    // A layer count `layer_types` does not have is refused by name; without `layer_types`, the
    // weights decide.
    let dir = copy("qwen2-gqa", "layer-types");
    edit_config(&dir, &|v| v["num_hidden_layers"] = 3.into());
    let err = load::<B>(&dir, &dev).unwrap_err();
    assert!(
        matches!(&err, LoadError::Unsupported { field, .. } if field == "layer_types"),
        "{err}"
    );
    let dir = copy("qwen2-gqa", "missing");
    edit_config(&dir, &|v| {
        v["num_hidden_layers"] = 3.into();
        v.as_object_mut().unwrap().remove("layer_types");
    });
    let err = load::<B>(&dir, &dev).unwrap_err();
    assert!(
        matches!(&err, LoadError::MissingTensor { name, .. } if name.starts_with("model.layers.2.")),
        "{err}"
    );

    let dir = copy("qwen2-gqa", "extra");
    edit_config(&dir, &|v| {
        v["num_hidden_layers"] = 1.into();
        v.as_object_mut().unwrap().remove("layer_types");
    });
    assert!(matches!(
        load::<B>(&dir, &dev).unwrap_err(),
        LoadError::UnexpectedTensors { .. }
    ));

    let dir = copy("llama", "scaling");
    edit_config(&dir, &|v| v["rope_parameters"]["rope_type"] = "yarn".into());
    let err = load::<B>(&dir, &dev).unwrap_err();
    assert!(err.to_string().contains("`yarn` is not supported"), "{err}");

    let dir = copy("qwen2-gqa", "nofile");
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    assert!(
        load::<B>(&dir, &dev)
            .unwrap_err()
            .to_string()
            .contains("no model.safetensors")
    );

    let dir = copy("qwen2-gqa", "garbage");
    std::fs::write(dir.join("model.safetensors"), b"not safetensors").unwrap();
    assert!(matches!(
        load::<B>(&dir, &dev).unwrap_err(),
        LoadError::Safetensors { .. }
    ));

    assert!(matches!(
        load::<B>(Path::new("/no/such/model"), &dev).unwrap_err(),
        LoadError::Io { .. }
    ));
}

#[test]
fn tokenizer_round_trips_and_applies_the_chat_template() {
    let tok = LmTokenizer::load(&fixtures().join("qwen2-gqa"), &[]).unwrap();
    let text = "<|im_start|>user\nWhat is 12 + 7?<|im_end|>";
    let ids = tok.encode(text).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    assert_eq!(ids[0], 1, "special tokens are single ids");
    let digits = tok.encode("1234").unwrap();
    assert_eq!(digits.len(), 4, "digits are split individually");
    assert_eq!(tok.eos_ids(), &[2]);
    let chat = tok
        .apply_chat_template(
            &[rein_model::lm::ChatMessage {
                role: "user".into(),
                content: "hi".into(),
            }],
            true,
        )
        .unwrap();
    assert_eq!(
        chat.as_deref(),
        Some("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    );
}

/// transformers 4.50 and later save the chat template as `chat_template.jinja` beside
/// `tokenizer_config.json` (which then has none); that file is the template, and it wins over the
/// config's when both exist, as in transformers.
#[test]
fn a_chat_template_saved_on_its_own_is_read() {
    let dir = std::env::temp_dir().join(format!("rein-chat-template-jinja-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let from = fixtures().join("qwen2-gqa");
    std::fs::copy(from.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let config = std::fs::read_to_string(from.join("tokenizer_config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&config).unwrap();
    config["chat_template"] = "{{ 'from the config' }}".into();
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    std::fs::write(
        dir.join("chat_template.jinja"),
        "{% for m in messages %}[{{ m['content'] }}]{% endfor %}",
    )
    .unwrap();
    let tok = LmTokenizer::load(&dir, &[]).unwrap();
    let hi = rein_model::lm::ChatMessage {
        role: "user".into(),
        content: "hi".into(),
    };
    let chat = tok.apply_chat_template(std::slice::from_ref(&hi), false).unwrap();
    assert_eq!(chat.as_deref(), Some("[hi]"));
    // A saved copy keeps it.
    let copy = dir.join("saved");
    std::fs::create_dir_all(&copy).unwrap();
    tok.save(&copy).unwrap();
    let again = LmTokenizer::load(&copy, &[]).unwrap();
    assert_eq!(
        again.apply_chat_template(&[hi], false).unwrap().as_deref(),
        Some("[hi]")
    );
    let _ = std::fs::remove_dir_all(&dir);
}
