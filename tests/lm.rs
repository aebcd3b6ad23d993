//! Language models against Hugging Face transformers, and the generator's invariants.
//!
//! Fixtures: `tests/fixtures/lm/`, written by `gen_checkpoints.py` (transformers 5.23): tiny
//! random Qwen2 (GQA with q/k/v biases; tied embeddings with one KV head) and Llama (llama3 RoPE
//! scaling; bf16, sharded, linear RoPE scaling, tied) checkpoints, with transformers' logits and
//! greedy continuations; by `gen_families.py` (transformers 5.24): Qwen3 (its own head_dim;
//! tied, with a sliding window from its second layer), Qwen3-MoE (8 experts, top 2, a dense
//! layer between two sparse ones, with each layer's router choices and the load-balancing loss),
//! Gemma 3 (local and global layers, two RoPE bases, a window of 3), Gemma 2 (soft-capping) and
//! a Mistral with a window of 3 — every window shorter than the test sequences;
//! `chat_templates.json`, written by `gen_chat_templates.py`, holds transformers' renderings of
//! four chat templates.

#[path = "common/logits.rs"]
mod logits;
#[path = "common/tiny_lm.rs"]
mod tiny_lm;

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use logits::logits;
use proptest::prelude::*;
use rein_model::lm::{CausalLm, Context, KvCache, LmTokenizer, LoadError, Routing, load, save};
use rein_sampler::{GenerationConfig, generate};
use safetensors::SafeTensors;
use tiny_lm::{FAMILIES, tiny_family, tiny_model};

type B = Flex;

const CHECKPOINTS: [&str; 10] = [
    "qwen2-gqa",
    "qwen2-tied",
    "llama",
    "llama-bf16-sharded",
    "qwen3",
    "qwen3-window",
    "qwen3-moe",
    "gemma3",
    "gemma2",
    "mistral-window",
];

/// The checkpoints with bf16 reference logits (`gen_bf16_logits.py`).
const BF16_CHECKPOINTS: [&str; 4] = ["qwen2-gqa", "qwen2-tied", "llama", "llama-bf16-sharded"];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lm")
}

fn model(name: &str) -> CausalLm<B> {
    model_at(&fixtures().join(name))
}

fn model_at(dir: &Path) -> CausalLm<B> {
    load::<B>(dir, &Default::default()).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// A tensor from the `.expected.safetensors` file of `name`, as (shape, values).
fn expected(name: &str, tensor: &str) -> (Vec<usize>, Vec<f64>) {
    fixture_tensor(&format!("{name}.expected"), tensor)
}

/// A tensor from the safetensors file `{file}.safetensors` of the fixtures, as (shape, values).
fn fixture_tensor(file: &str, tensor: &str) -> (Vec<usize>, Vec<f64>) {
    let bytes = std::fs::read(fixtures().join(format!("{file}.safetensors"))).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let view = file.tensor(tensor).unwrap();
    let values = match view.dtype() {
        safetensors::Dtype::F32 => view
            .data()
            .chunks_exact(4)
            .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
            .collect(),
        safetensors::Dtype::I64 => view
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f64)
            .collect(),
        other => panic!("unexpected dtype {other:?}"),
    };
    (view.shape().to_vec(), values)
}

fn int_tensor(values: &[f64], shape: [usize; 2]) -> Tensor<B, 2, Int> {
    Tensor::from_data(
        TensorData::new(values.iter().map(|&v| v as i64).collect::<Vec<_>>(), shape),
        &Default::default(),
    )
}

#[test]
fn logits_match_transformers() {
    for name in CHECKPOINTS {
        let m = model(name);
        let (shape, ids) = expected(name, "input_ids");
        let (_, want) = expected(name, "logits");
        for fused in [false, true] {
            let got = logits(&m, int_tensor(&ids, [shape[0], shape[1]]), fused);
            assert_eq!(got.len(), want.len());
            let worst = got
                .iter()
                .zip(&want)
                .map(|(g, w)| (f64::from(*g) - w).abs())
                .fold(0.0, f64::max);
            assert!(worst < 1e-4, "{name} (fused: {fused}): max logit difference {worst}");
        }
    }
}

/// `model.dtype = "bf16"`: every decoder linear layer multiplies in bf16, as transformers does
/// with those layers' weights, biases, inputs and products rounded to bf16
/// (`gen_bf16_logits.py`), generation's concatenated projections included. Rounding to bf16
/// amplifies the last bits of f32 (the reference itself moves by up to 3.0–4.5e-3, 3.7–5.6e-4 on
/// average, when its layers' inputs are perturbed by 1e-5 relative), so the bound is that, not
/// f32's 1e-4;
/// and the logits must be visibly off the f32 ones (2e-3, where bf16 moves them by 5–9e-3).
#[test]
fn bf16_logits_match_transformers_with_bf16_linear_layers() {
    for name in BF16_CHECKPOINTS {
        let m = model(name).with_dtype(rein_core::ModelDtype::Bf16);
        let (shape, ids) = fixture_tensor(&format!("{name}.bf16"), "input_ids");
        let (_, want) = fixture_tensor(&format!("{name}.bf16"), "logits");
        let (_, f32_logits) = expected(name, "logits");
        let differences = |got: &[f32], want: &[f64]| -> (f64, f64) {
            let d: Vec<f64> = got.iter().zip(want).map(|(g, w)| (f64::from(*g) - w).abs()).collect();
            (
                d.iter().copied().fold(0.0, f64::max),
                d.iter().sum::<f64>() / d.len() as f64,
            )
        };
        for fused in [false, true] {
            let got = logits(&m, int_tensor(&ids, [shape[0], shape[1]]), fused);
            let ((worst, mean), (from_f32, _)) = (differences(&got, &want), differences(&got, &f32_logits));
            assert!(
                worst < 1e-2 && mean < 1e-3,
                "{name} (fused: {fused}): logits differ by up to {worst}, {mean} on average"
            );
            assert!(
                from_f32 > 2e-3,
                "{name} (fused: {fused}): only {from_f32} from the f32 logits"
            );
        }
    }
}

#[test]
fn left_padded_logits_match_transformers_on_real_tokens() {
    for name in CHECKPOINTS {
        let m = model(name);
        let (shape, ids) = expected(name, "padded_input_ids");
        let (_, mask) = expected(name, "padded_attention_mask");
        let (batch, seq) = (shape[0], shape[1]);
        let positions: Vec<f64> = (0..batch)
            .flat_map(|b| {
                let pad = mask[b * seq..(b + 1) * seq].iter().filter(|&&m| m == 0.0).count();
                (0..seq).map(move |j| j.saturating_sub(pad) as f64)
            })
            .collect();
        let padding: Vec<bool> = mask.iter().map(|&m| m == 0.0).collect();
        let rope = m.rope(seq, &Default::default());
        let ctx = Context {
            rope: &rope,
            positions: int_tensor(&positions, [batch, seq]),
            fused: None,
            routing: None,
            sequence_lengths: None,
            padding: Some(
                Tensor::<B, 2, Int>::from_data(
                    TensorData::new(padding.iter().map(|&p| i64::from(p)).collect::<Vec<_>>(), [batch, seq]),
                    &Default::default(),
                )
                .bool(),
            ),
        };
        let got: Vec<f32> = m
            .forward(int_tensor(&ids, [batch, seq]), &ctx, None)
            .into_data()
            .to_vec()
            .unwrap();
        let (_, want) = expected(name, "padded_logits");
        let vocab = m.config().vocab_size;
        for (k, pad) in padding.iter().enumerate() {
            if *pad {
                continue;
            }
            for v in 0..vocab {
                let (g, w) = (f64::from(got[k * vocab + v]), want[k * vocab + v]);
                assert!((g - w).abs() < 1e-4, "{name}: position {k}, token {v}: {g} vs {w}");
            }
        }
    }
}

#[test]
fn greedy_continuations_match_transformers_exactly() {
    for name in CHECKPOINTS {
        let m = model(name);
        let (shape, padded) = expected(name, "padded_input_ids");
        let (_, mask) = expected(name, "padded_attention_mask");
        let (_, greedy) = expected(name, "greedy");
        let (batch, seq) = (shape[0], shape[1]);
        let new = greedy.len() / batch - seq;
        let prompts: Vec<Vec<u32>> = (0..batch)
            .map(|b| {
                (0..seq)
                    .filter(|&j| mask[b * seq + j] != 0.0)
                    .map(|j| padded[b * seq + j] as u32)
                    .collect()
            })
            .collect();
        let config = GenerationConfig {
            max_new_tokens: new,
            temperature: 0.0,
            ..GenerationConfig::default()
        };
        let out = generate(&m, &prompts, &config, 0, &mut |_, _| false, &Default::default());
        for (b, g) in out.iter().enumerate() {
            let want: Vec<u32> = greedy[b * (seq + new) + seq..(b + 1) * (seq + new)]
                .iter()
                .map(|&t| t as u32)
                .collect();
            assert_eq!(g.tokens, want, "{name}, prompt {b}");
        }
    }
}

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

/// Qwen3-MoE: each sparse layer routes every token to the experts transformers' router chose,
/// the load-balancing loss is transformers' `load_balancing_loss_func` over the same tokens, and
/// replaying the recorded choices reproduces the logits with no token routed differently.
#[test]
fn moe_routing_and_its_loss_match_transformers() {
    let m = model("qwen3-moe");
    let (shape, ids) = expected("qwen3-moe", "input_ids");
    let (batch, seq) = (shape[0], shape[1]);
    let (_, want_logits) = expected("qwen3-moe", "logits");
    let (top_shape, want_top) = expected("qwen3-moe", "router_top_k");
    let (_, sparse) = expected("qwen3-moe", "sparse_layers");
    let (_, want_aux) = expected("qwen3-moe", "aux_loss");
    let forward = |routing: &Routing<B>| -> Vec<f32> {
        let dev = Default::default();
        let rope = m.rope(seq, &dev);
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &dev)
            .unsqueeze::<2>()
            .expand([batch, seq]);
        let ctx = Context {
            rope: &rope,
            positions,
            padding: None,
            sequence_lengths: None,
            fused: None,
            routing: Some(routing),
        };
        m.forward(int_tensor(&ids, [batch, seq]), &ctx, None)
            .into_data()
            .to_vec()
            .unwrap()
    };
    let recorded = Routing::record();
    let logits = forward(&recorded);
    let chosen = recorded.chosen(m.config().num_hidden_layers);
    let per_layer = top_shape[1] * top_shape[2];
    for (i, &layer) in sparse.iter().enumerate() {
        let want: Vec<u32> = want_top[i * per_layer..(i + 1) * per_layer]
            .iter()
            .map(|&e| e as u32)
            .collect();
        assert_eq!(chosen[layer as usize], want, "layer {layer}: experts chosen");
    }
    assert!(chosen[1].is_empty(), "layer 1 is dense (mlp_only_layers)");
    let aux = f64::from(recorded.load_balancing_loss().unwrap().into_scalar());
    assert!(
        (aux - want_aux[0]).abs() < 1e-6,
        "load-balancing loss: rein {aux} vs transformers {}",
        want_aux[0]
    );
    let worst = logits
        .iter()
        .zip(&want_logits)
        .map(|(g, w)| (f64::from(*g) - w).abs())
        .fold(0.0, f64::max);
    assert!(worst < 1e-4, "logits differ by {worst}");

    let replayed = Routing::replay(chosen.clone());
    assert_eq!(
        forward(&replayed),
        logits,
        "replaying the recorded routing changes the logits"
    );
    assert_eq!(
        replayed.disagreement(),
        (0, 2 * batch * seq),
        "two sparse layers, every token as recorded"
    );
    assert_eq!(replayed.chosen(m.config().num_hidden_layers), chosen);

    // Replaying other experts routes there, and counts every token whose choice differs.
    let shifted: Vec<Vec<u32>> = chosen
        .iter()
        .map(|c| c.iter().map(|&e| (e + 1) % 8).collect())
        .collect();
    let moved = Routing::replay(shifted.clone());
    let other = forward(&moved);
    assert_ne!(other, logits, "the replayed experts were used");
    let (differing, compared) = moved.disagreement();
    assert_eq!(compared, 2 * batch * seq);
    assert!(
        differing > compared / 2,
        "{differing} of {compared} tokens would have been routed differently"
    );
    assert_eq!(moved.chosen(m.config().num_hidden_layers), shifted);
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
        sequence_lengths: None,
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn kv_cache_decoding_equals_full_recomputation(
        seqs in prop::collection::vec(prop::collection::vec(0u32..40, 1..6), 1..4),
        extra in prop::collection::vec(0u32..40, 1..6),
        seed in 0u64..50,
        family in prop::sample::select(FAMILIES.to_vec()),
    ) {
        // Every row gets the same length so no padding is needed; decode `extra` one at a time
        // (past Gemma's window of 2: its sliding layers drop keys from their cache).
        let m = tiny_family(family, seed);
        let dev = Default::default();
        let len = seqs.iter().map(Vec::len).min().unwrap();
        let batch = seqs.len();
        let prefix: Vec<i64> = seqs.iter().flat_map(|s| s[..len].iter().map(|&t| i64::from(t))).collect();
        let total = len + extra.len();
        let rope = m.rope(total, &dev);
        let mut cache = KvCache::new(m.config(), batch, total, &dev);
        let positions = |start: usize, n: usize| Tensor::<B, 1, Int>::arange(start as i64..(start + n) as i64, &dev).unsqueeze::<2>().expand([batch, n]);
        let ctx = Context { rope: &rope, positions: positions(0, len), padding: None, sequence_lengths: None, fused: None, routing: None };
        let mut cached = m.forward(Tensor::from_data(TensorData::new(prefix.clone(), [batch, len]), &dev), &ctx, Some(&mut cache));
        let mut all = prefix.clone();
        let mut width = len;
        for &t in &extra {
            let next: Vec<i64> = vec![i64::from(t); batch];
            let ctx = Context { rope: &rope, positions: positions(width, 1), padding: None, sequence_lengths: None, fused: None, routing: None };
            cached = m.forward(Tensor::from_data(TensorData::new(next, [batch, 1]), &dev), &ctx, Some(&mut cache));
            let mut grown = Vec::with_capacity(batch * (width + 1));
            for b in 0..batch {
                grown.extend_from_slice(&all[b * width..(b + 1) * width]);
                grown.push(i64::from(t));
            }
            all = grown;
            width += 1;
        }
        let full = logits(&m, Tensor::from_data(TensorData::new(all, [batch, width]), &dev), false);
        let last: Vec<f32> = cached.into_data().to_vec().unwrap();
        let vocab = 40;
        for b in 0..batch {
            for v in 0..vocab {
                let f = full[(b * width + width - 1) * vocab + v];
                prop_assert!((f - last[b * vocab + v]).abs() < 1e-4, "row {b}: {f} vs {}", last[b * vocab + v]);
            }
        }
    }

    #[test]
    fn batching_with_left_padding_changes_nothing(
        prompts in prop::collection::vec(prop::collection::vec(0u32..40, 1..7), 1..4),
        seed in 0u64..50,
        temperature in prop::sample::select(vec![0.0f32, 0.9]),
        family in prop::sample::select(FAMILIES.to_vec()),
    ) {
        let m = tiny_family(family, seed);
        let config = GenerationConfig { max_new_tokens: 6, temperature, n: 2, seed: 7, ..GenerationConfig::default() };
        // Each sequence draws from the stream of its (prompt index, sample index), so it is
        // compared with a batch holding the same prompts up to it: the padding and the other rows
        // (shorter, longer, or none) must not change it.
        let together = generate(&m, &prompts, &config, 0, &mut |_, _| false, &Default::default());
        for p in 0..prompts.len() {
            let fewer = generate(&m, &prompts[..=p], &config, 0, &mut |_, _| false, &Default::default());
            if temperature == 0.0 {
                let alone = generate(&m, std::slice::from_ref(&prompts[p]), &config, 0, &mut |_, _| false, &Default::default());
                prop_assert_eq!(&together[p * 2].tokens, &alone[0].tokens, "greedy, prompt {}", p);
            }
            for s in 0..2 {
                let (a, b) = (&together[p * 2 + s], &fewer[p * 2 + s]);
                prop_assert_eq!(&a.tokens, &b.tokens, "prompt {}, sample {}", p, s);
                for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                    prop_assert!((x - y).abs() < 1e-4);
                }
            }
        }
    }
}

/// A sliding-window layer's cache holds about two windows of keys however long the generation,
/// while a global layer's holds every position; decoding past the window still equals the
/// full recomputation (the proptest above), and the dropped keys were never needed.
#[test]
fn a_window_layers_cache_stays_within_two_windows() {
    let m = tiny_family("gemma3", 3);
    let dev = Default::default();
    let total = 48;
    let rope = m.rope(total, &dev);
    let mut cache = KvCache::new(m.config(), 2, total, &dev);
    let positions = |start: usize, n: usize| {
        Tensor::<B, 1, Int>::arange(start as i64..(start + n) as i64, &dev)
            .unsqueeze::<2>()
            .expand([2, n])
    };
    let feed = |cache: &mut KvCache<B>, start: usize, tokens: Vec<i64>| {
        let n = tokens.len() / 2;
        let ctx = Context {
            rope: &rope,
            positions: positions(start, n),
            padding: None,
            sequence_lengths: None,
            fused: None,
            routing: None,
        };
        m.forward(
            Tensor::from_data(TensorData::new(tokens, [2, n]), &dev),
            &ctx,
            Some(cache),
        );
    };
    feed(&mut cache, 0, vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    for t in 5..total {
        feed(&mut cache, t, vec![(t % 40) as i64, ((t * 7) % 40) as i64]);
        for (i, layer) in cache.layers().iter().enumerate() {
            let window = m.config().layer_attention()[i].window();
            match window {
                Some(w) => assert!(
                    layer.buffer_positions() <= (2 * w).max(5),
                    "layer {i} holds {} positions",
                    layer.buffer_positions()
                ),
                None => assert!(layer.buffer_positions() > t, "the global layer keeps every position"),
            }
        }
    }
    assert!(cache.layers()[0].dropped() > 0, "the sliding layer dropped keys");
}

/// Large batches are split into shards decoded in parallel (one per core, from 16 rows each),
/// and sequences finish at different steps: neither may change any sequence.
#[test]
fn sharded_decoding_with_early_stops_matches_small_batches() {
    let m = tiny_model(5);
    let prompts: Vec<Vec<u32>> = (0..12u32)
        .map(|i| (0..1 + i % 5).map(|j| (i * 7 + j) % 40).collect())
        .collect();
    let config = GenerationConfig {
        max_new_tokens: 10,
        temperature: 0.9,
        n: 4,
        stop_token_ids: vec![3],
        seed: 5,
        ..GenerationConfig::default()
    };
    let device = Default::default();
    let together = generate(&m, &prompts, &config, 0, &mut |_, _| false, &device);
    assert!(
        together.iter().any(|g| g.tokens.len() < 10),
        "some sequences stop early"
    );
    for (p, prompt) in prompts.iter().enumerate() {
        // Alone, prompt `p` would draw from prompt 0's streams: compare with the batch up to it.
        let fewer = generate(&m, &prompts[..=p], &config, 0, &mut |_, _| false, &device);
        for s in 0..4 {
            let (a, b) = (&together[p * 4 + s], &fewer[p * 4 + s]);
            assert_eq!(a.tokens, b.tokens, "prompt {p} {prompt:?}, sample {s}");
            for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                assert!((x - y).abs() < 1e-4, "prompt {p}, sample {s}: {x} vs {y}");
            }
        }
    }
}

#[test]
fn generation_respects_stops_lengths_and_seeds() {
    let m = tiny_model(3);
    let prompts = vec![vec![1, 2, 3], vec![4]];
    let config = GenerationConfig {
        max_new_tokens: 12,
        temperature: 1.0,
        n: 3,
        seed: 11,
        ..GenerationConfig::default()
    };
    let a = generate(&m, &prompts, &config, 0, &mut |_, _| false, &Default::default());
    let b = generate(&m, &prompts, &config, 0, &mut |_, _| false, &Default::default());
    assert_eq!(a, b, "same seed, same samples");
    assert_eq!(a.len(), 6);
    assert!(
        a.iter()
            .all(|g| g.tokens.len() == 12 && g.finish == rein_sampler::FinishReason::Length)
    );
    let other = generate(
        &m,
        &prompts,
        &GenerationConfig {
            seed: 12,
            ..config.clone()
        },
        0,
        &mut |_, _| false,
        &Default::default(),
    );
    assert_ne!(a, other);
    // A stop token ends the sequence on it; a stop condition ends it where it matches.
    let stop_token = a[0].tokens[4];
    let stopped = generate(
        &m,
        &prompts,
        &GenerationConfig {
            stop_token_ids: vec![stop_token],
            ..config.clone()
        },
        0,
        &mut |_, _| false,
        &Default::default(),
    );
    let first = a[0].tokens.iter().position(|&t| t == stop_token).unwrap();
    assert_eq!(stopped[0].tokens, a[0].tokens[..=first].to_vec());
    assert_eq!(stopped[0].finish, rein_sampler::FinishReason::StopToken);
    let cut = generate(
        &m,
        &prompts,
        &config,
        0,
        &mut |seq, tokens| seq == 1 && tokens.len() == 5,
        &Default::default(),
    );
    assert_eq!(cut[1].tokens.len(), 5);
    assert_eq!(cut[1].finish, rein_sampler::FinishReason::StopCondition);
    assert_eq!(cut[0], a[0], "other sequences are unaffected");
}

#[test]
fn chat_templates_render_as_transformers_renders_them() {
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("chat_templates.json")).unwrap()).unwrap();
    let tokenizer_json = fixtures().join("tokenizer/tokenizer.json");
    let cases = fixture["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 60);
    let tools: Vec<serde_json::Value> = fixture["tools"].as_array().unwrap().clone();
    for case in cases {
        let name = case["template"].as_str().unwrap();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chat-template-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(&tokenizer_json, dir.join("tokenizer.json")).unwrap();
        let config = serde_json::json!({
            "chat_template": fixture["templates"][name],
            "bos_token": fixture["bos_token"],
            "eos_token": fixture["eos_token"],
        });
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
        let kwargs = case["kwargs"].as_object().cloned().unwrap_or_default();
        let tokenizer = LmTokenizer::load(&dir, &[]).unwrap().with_template_kwargs(kwargs);
        let conversation = case["conversation"].as_str().unwrap();
        let messages: Vec<rein_model::lm::ChatMessage> =
            serde_json::from_value(fixture["conversations"][conversation].clone()).unwrap();
        let add_generation_prompt = case["add_generation_prompt"].as_bool().unwrap();
        let offered: &[serde_json::Value] = if case["tools"] == true { &tools } else { &[] };
        let got = tokenizer.apply_chat_template_with_tools(&messages, offered, add_generation_prompt);
        let what = format!("{name}, {conversation}, generation prompt {add_generation_prompt}");
        match (&case["rendered"], &case["error"]) {
            (serde_json::Value::String(want), _) => assert_eq!(got.unwrap().unwrap(), *want, "{what}"),
            (_, serde_json::Value::String(error)) => {
                let err = got.unwrap_err().to_string();
                assert!(err.contains(error.as_str()), "{what}: {err}");
            }
            _ => panic!("{what}: the fixture has neither a rendering nor an error"),
        }
    }
}

#[test]
fn f16_weights_are_upcast_exactly() {
    // The fixture's f32 weights rounded to f16 and saved as f16; loading must upcast every value
    // exactly: the model equals one saved in f32 with the same rounded values.
    let original = std::fs::read(fixtures().join("qwen2-gqa/model.safetensors")).unwrap();
    let original = SafeTensors::deserialize(&original).unwrap();
    let mut halves: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut rounded: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in original.tensors() {
        assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
        let values: Vec<half::f16> = view
            .data()
            .chunks_exact(4)
            .map(|b| half::f16::from_f32(f32::from_le_bytes(b.try_into().unwrap())))
            .collect();
        halves.push((
            name.clone(),
            view.shape().to_vec(),
            values.iter().flat_map(|h| h.to_le_bytes()).collect(),
        ));
        let upcast = values.iter().flat_map(|h| h.to_f32().to_le_bytes()).collect();
        rounded.push((name, view.shape().to_vec(), upcast));
    }
    let write = |tag: &str, dtype: safetensors::Dtype, tensors: &[(String, Vec<usize>, Vec<u8>)]| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("upcast-{tag}"));
        std::fs::create_dir_all(&dir).unwrap();
        for file in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(fixtures().join("qwen2-gqa").join(file), dir.join(file)).unwrap();
        }
        let views = tensors.iter().map(|(name, shape, bytes)| {
            (
                name.clone(),
                safetensors::tensor::TensorView::new(dtype, shape.clone(), bytes).unwrap(),
            )
        });
        std::fs::write(
            dir.join("model.safetensors"),
            safetensors::serialize(views, None).unwrap(),
        )
        .unwrap();
        model_at(&dir)
    };
    let half = write("f16", safetensors::Dtype::F16, &halves);
    let full = write("f32", safetensors::Dtype::F32, &rounded);
    let (shape, ids) = expected("qwen2-gqa", "input_ids");
    let tokens = int_tensor(&ids, [shape[0], shape[1]]);
    let from_half = logits(&half, tokens.clone(), false);
    assert!(
        from_half == logits(&full, tokens.clone(), false),
        "f16 weights load as their exact f32 values"
    );
    let exact = logits(&model("qwen2-gqa"), tokens, false);
    let worst = from_half
        .iter()
        .zip(&exact)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst > 0.0 && worst < 0.05,
        "f16 rounding moves logits a little: {worst}"
    );
}

/// Dropping every sequence from a cache leaves empty buffers of the same layout (no gather over
/// an empty index, which fails to launch on burn-cuda), and the cache can still grow after.
#[test]
fn a_cache_emptied_of_every_sequence_keeps_its_layout() {
    let m = tiny_model(1);
    let mut cache = KvCache::<B>::new(m.config(), 3, 8, &Default::default());
    cache.retain(&[2, 0]);
    assert_eq!(cache.batch(), 2);
    cache.retain(&[]);
    assert_eq!((cache.batch(), cache.capacity()), (0, 8));
    cache.reserve(16);
    assert!(cache.capacity() >= 16);
}
