//! The `rein` binary: output formats, exit codes, and errors that name the plugin and the
//! limit or field.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::io::Write;
use std::process::{Command, Output};

fn rein(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(args)
        .env(
            "REIN_CACHE_DIR",
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"),
        )
        .output()
        .expect("the rein binary runs")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "rein failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr_of_failure(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "rein should have failed; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(out.stdout.is_empty() || !String::from_utf8_lossy(&out.stdout).contains("error"));
    String::from_utf8(out.stderr.clone()).unwrap()
}

fn temp_file(name: &str, contents: &str) -> std::path::PathBuf {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::File::create(&path)
        .unwrap()
        .write_all(contents.as_bytes())
        .unwrap();
    path
}

#[test]
fn inspect_shows_name_kind_interface_config_and_imports() {
    let path = common::plugin_path("math-answer");
    let text = stdout(&rein(&["plugin", "inspect", path.to_str().unwrap()]));
    for expected in [
        "name:        math-answer",
        "kind:        reward",
        "interface:   rein:plugin@0.5.0",
        "extract (default \"auto\")",
        "wasi:cli/stdout",
    ] {
        assert!(text.contains(expected), "missing `{expected}` in:\n{text}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&stdout(&rein(&["plugin", "inspect", "--json", path.to_str().unwrap()]))).unwrap();
    assert_eq!(json["kind"], "reward");
    assert_eq!(json["name"], "math-answer");
    assert!(
        json["config_keys"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k["name"] == "tolerance")
    );
}

#[test]
fn inspect_says_what_a_reward_reads_besides_the_text() {
    let path = common::plugin_path("count-shapes");
    let text = stdout(&rein(&["plugin", "inspect", path.to_str().unwrap()]));
    assert!(text.contains("reads:       the prompt's images"), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&stdout(&rein(&["plugin", "inspect", "--json", path.to_str().unwrap()]))).unwrap();
    assert_eq!(
        (json["reads_images"].as_bool(), json["reads_tokens"].as_bool()),
        (Some(true), Some(false))
    );
}

#[test]
fn score_prints_one_json_line_per_group() {
    let groups = [
        serde_json::json!({"prompt": "1+1?", "completions": ["\\boxed{2}", "#### 3"], "reference": "2"}).to_string(),
        String::new(),
        serde_json::json!({"prompt": "?", "completions": ["x"]}).to_string(),
    ];
    let input = temp_file("groups.jsonl", &groups.join("\n"));
    let path = common::plugin_path("math-answer");
    let text = stdout(&rein(&[
        "plugin",
        "score",
        path.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]));
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["scores"], serde_json::json!([1.0, 0.0]));
    assert_eq!(lines[0]["components"][0]["correct"], 1.0);
    assert_eq!(lines[1]["scores"], serde_json::json!([null]));
}

#[test]
fn limits_from_the_command_line_apply_and_are_named() {
    let input = temp_file(
        "loop.jsonl",
        r#"{"prompt": "p", "completions": ["a"], "metadata": "{\"attack\": \"infinite-loop\"}"}"#,
    );
    let path = common::test_plugin_path("hostile-reward");
    let out = rein(&[
        "plugin",
        "score",
        path.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--timeout-ms",
        "1000",
    ]);
    let err = stderr_of_failure(&out);
    assert!(
        err.contains("plugin `hostile-reward` (score): exceeded its time limit of 1000 ms per call (`timeout_ms`)"),
        "{err}"
    );
    assert!(err.contains("loop.jsonl"), "names the input: {err}");
    let out = rein(&[
        "plugin",
        "score",
        path.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--fuel",
        "1000000",
    ]);
    assert!(stderr_of_failure(&out).contains("ran out of fuel: 1000000 units per call (`fuel`)"));
}

#[test]
fn malformed_input_names_the_file_and_line() {
    let input = temp_file(
        "bad.jsonl",
        "{\"prompt\": \"p\", \"completions\": [\"a\"]}\n{\"prompt\": 3}\n",
    );
    let path = common::plugin_path("math-answer");
    let err = stderr_of_failure(&rein(&[
        "plugin",
        "score",
        path.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]));
    assert!(err.contains("bad.jsonl:2: not a group"), "{err}");
    let err = stderr_of_failure(&rein(&[
        "plugin",
        "score",
        path.to_str().unwrap(),
        "--input",
        "/no/such.jsonl",
    ]));
    assert!(err.contains("cannot open /no/such.jsonl"), "{err}");
    let err = stderr_of_failure(&rein(&["plugin", "inspect", "/no/such.wasm"]));
    assert!(err.contains("cannot read /no/such.wasm"), "{err}");
}

#[test]
fn rollout_prints_each_step_until_the_episode_ends() {
    let path = common::plugin_path("cartpole");
    let actions = vec!["1"; 40].join(",");
    let text = stdout(&rein(&[
        "env",
        "rollout",
        path.to_str().unwrap(),
        "--seed",
        "3",
        "--actions",
        &actions,
    ]));
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[0]["step"], 0);
    assert_eq!(lines[0]["observation"]["vector"].as_array().unwrap().len(), 4);
    let last = lines.last().unwrap();
    assert_eq!(last["terminated"], true, "always pushing right topples the pole");
    assert!(lines.len() < 41);
    assert!(lines[1..].iter().all(|l| l["reward"] == 1.0));
}

#[test]
fn random_rollouts_are_seeded() {
    let path = common::plugin_path("pendulum");
    let run = |seed: &str| {
        stdout(&rein(&[
            "env",
            "rollout",
            path.to_str().unwrap(),
            "--random",
            "--steps",
            "5",
            "--seed",
            seed,
        ]))
    };
    assert_eq!(run("4"), run("4"));
    assert_ne!(run("4"), run("5"));
    assert_eq!(run("4").lines().count(), 6);
}

#[test]
fn rollout_errors_name_the_plugin_and_field() {
    let path = common::plugin_path("cartpole");
    let err = stderr_of_failure(&rein(&["env", "rollout", path.to_str().unwrap(), "--actions", "0,2"]));
    assert!(
        err.contains("plugin `cartpole` (step)") && err.contains("2 is not below 2"),
        "{err}"
    );
    let err = stderr_of_failure(&rein(&[
        "env",
        "rollout",
        path.to_str().unwrap(),
        "--config",
        r#"{"initial_state": [1, 2]}"#,
        "--actions",
        "0",
    ]));
    assert!(
        err.contains("plugin `cartpole` (open)") && err.contains("`initial_state` needs 4 numbers"),
        "{err}"
    );
    let err = stderr_of_failure(&rein(&["env", "rollout", path.to_str().unwrap(), "--actions", "left"]));
    assert!(err.contains("`left` in --actions is not an action index"), "{err}");
}

#[test]
fn plugin_test_prints_fail_and_exits_non_zero_on_a_wrong_case() {
    let group = serde_json::json!({"prompt": "1+1?", "completions": ["\\boxed{2}", "\\boxed{3}"], "reference": "2"});
    let right = serde_json::json!({"name": "right", "group": group, "expected": [1.0, 0.0]}).to_string();
    let wrong = serde_json::json!({"name": "wrong", "group": group, "expected": [0.0, 0.0]}).to_string();
    let path = common::plugin_path("math-answer");
    let run = |cases: &str, file: &str| {
        let cases = temp_file(file, cases);
        rein(&[
            "plugin",
            "test",
            path.to_str().unwrap(),
            "--cases",
            cases.to_str().unwrap(),
        ])
    };
    let passing = stdout(&run(&right, "cases-pass.jsonl"));
    assert!(
        passing.contains("pass  right") && passing.contains("1 passed, 0 failed"),
        "{passing}"
    );

    let out = run(&format!("{right}\n{wrong}\n"), "cases-fail.jsonl");
    let stderr = stderr_of_failure(&out);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("pass  right"), "{stdout}");
    assert!(
        stdout.contains("FAIL  wrong: expected [Some(0.0), Some(0.0)], got [Some(1.0), Some(0.0)]"),
        "{stdout}"
    );
    assert!(stdout.contains("1 passed, 1 failed"), "{stdout}");
    assert!(stderr.contains("1 of 2 cases failed"), "{stderr}");
}

/// `rein generate` on the tiny Qwen2 fixture, its JSON lines parsed.
fn generate(extra: &[&str]) -> Vec<serde_json::Value> {
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lm/qwen2-gqa");
    let mut args = vec!["generate", "--model", model.to_str().unwrap()];
    args.extend(extra);
    let text = stdout(&rein(&args));
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn generate_samples_stops_and_reports_why() {
    let greedy_args = [
        "--prompt",
        "What is 1 + 1?",
        "--temperature",
        "0",
        "--max-new-tokens",
        "8",
    ];
    let greedy = generate(&[&greedy_args[..], &["--n", "2"]].concat());
    assert_eq!(greedy.len(), 2, "one line per sample");
    assert_eq!(greedy[0]["tokens"], greedy[1]["tokens"], "greedy samples agree");
    let tokens: Vec<u64> = serde_json::from_value(greedy[0]["tokens"].clone()).unwrap();
    assert_eq!(tokens.len(), 8);
    assert_eq!(greedy[0]["finish"], "length");
    assert_eq!(
        (greedy[0]["sample"].as_u64(), greedy[1]["sample"].as_u64()),
        (Some(0), Some(1))
    );

    // A stop string taken from the greedy completion ends it there, cut before the string.
    let completion = greedy[0]["completion"].as_str().unwrap().to_string();
    let stop: String = completion
        .chars()
        .skip(completion.chars().count() / 2)
        .take(2)
        .collect();
    assert!(!stop.is_empty(), "{completion:?}");
    let stopped = generate(&[&greedy_args[..], &["--stop", &stop]].concat());
    assert_eq!(stopped[0]["finish"], "stop_string");
    let cut = stopped[0]["completion"].as_str().unwrap();
    assert_eq!(cut, &completion[..completion.find(&stop).unwrap()], "{stop:?}");

    // Seeded sampling with log-probabilities.
    let sample = |seed: &str| {
        generate(&[
            "--prompt",
            "2+2=",
            "--seed",
            seed,
            "--max-new-tokens",
            "6",
            "--logprobs",
        ])
    };
    let (a, b) = (sample("5"), sample("5"));
    assert_eq!(a, b, "same seed, same sample");
    let logprobs: Vec<f64> = serde_json::from_value(a[0]["logprobs"].clone()).unwrap();
    assert_eq!(logprobs.len(), a[0]["tokens"].as_array().unwrap().len());
    assert!(logprobs.iter().all(|&lp| lp <= 0.0));
}

#[test]
fn generate_errors_name_the_model_and_the_input() {
    let out = rein(&["generate", "--model", "/no/such/model", "--prompt", "hi"]);
    assert!(stderr_of_failure(&out).contains("/no/such/model"));
    let input = temp_file("prompts.jsonl", "{\"text\": \"no prompt field\"}\n");
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lm/qwen2-gqa");
    let out = rein(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]);
    let stderr = stderr_of_failure(&out);
    assert!(stderr.contains("prompts.jsonl:1: no string `prompt` field"), "{stderr}");
}

/// The vision-language fixture (`tests/fixtures/vlm`) and its expected cases.
fn vlm() -> (std::path::PathBuf, Vec<serde_json::Value>) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/vlm");
    let expected = std::fs::read_to_string(dir.join("idefics3.expected.json")).unwrap();
    let cases: serde_json::Value = serde_json::from_str(&expected).unwrap();
    (dir, cases["cases"].as_array().unwrap().clone())
}

/// `rein generate --image` continues as transformers does: a prompt with its marker, and two
/// images as parts of a chat message rendered by SmolVLM's template.
#[test]
fn generate_with_images_continues_as_transformers_does() {
    let (dir, cases) = vlm();
    let case = |name: &str| cases.iter().find(|c| c["name"] == name).unwrap().clone();
    let (model, image) = (dir.join("idefics3"), |name: &str| dir.join("images").join(name));
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--temperature",
            "0",
            "--max-new-tokens",
            "8",
        ];
        args.extend(extra);
        serde_json::from_str(stdout(&rein(&args)).trim()).unwrap()
    };
    let wide = image("wide.png");
    let plain = run(&[
        "--image",
        wide.to_str().unwrap(),
        "--prompt",
        case("wide")["text"].as_str().unwrap(),
    ]);
    assert_eq!(plain["tokens"], case("wide")["greedy"]);
    let grey = image("grey.png");
    let chat = run(&[
        "--chat",
        "--image",
        grey.to_str().unwrap(),
        "--image",
        wide.to_str().unwrap(),
        "--prompt",
        "Compare <image> with <image>",
    ]);
    assert_eq!(chat["tokens"], case("chat")["greedy"]);
}

/// `rein generate --image` on Qwen2-VL and Qwen2.5-VL checkpoints continues as transformers
/// does: a prompt with its image put first, and two input rows batched together (their
/// multimodal positions and rope deltas differ), each `<image>` marker expanded between
/// `<|vision_start|>` and `<|vision_end|>`.
#[test]
fn generate_with_images_on_qwen2_vl_continues_as_transformers_does() {
    let (dir, _) = vlm();
    let rows_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("generate-qwen2-vl-rows");
    std::fs::create_dir_all(&rows_dir).unwrap();
    for family in ["qwen2_vl", "qwen2_5_vl"] {
        let expected = std::fs::read_to_string(dir.join(format!("{family}.expected.json"))).unwrap();
        let expected: serde_json::Value = serde_json::from_str(&expected).unwrap();
        let case = |name: &str| {
            (expected["cases"].as_array().unwrap().iter())
                .find(|c| c["name"] == name)
                .unwrap()
        };
        let model = dir.join(format!("{family}_model"));
        let image = |name: &str| dir.join("images").join(name).display().to_string();
        let settings = ["--temperature", "0", "--max-new-tokens", "8"];
        let one = stdout(&rein(
            &[
                &["generate", "--model", model.to_str().unwrap()][..],
                &["--image", &image("small_rgba.png"), "--prompt", "Describe it."],
                &settings,
            ]
            .concat(),
        ));
        let one: serde_json::Value = serde_json::from_str(one.trim()).unwrap();
        assert_eq!(one["tokens"], case("small")["greedy"], "{family}: {one}");

        let rows = [
            serde_json::json!({"prompt": "Compare <image> with <image> please", "images": [image("wide.png"), image("grey.png")]}),
            serde_json::json!({"prompt": "No picture in this one."}),
            serde_json::json!({"prompt": "Describe it.", "images": [image("small_rgba.png")]}),
        ];
        let input = rows_dir.join(format!("{family}.jsonl"));
        std::fs::write(&input, rows.iter().map(|r| format!("{r}\n")).collect::<String>()).unwrap();
        let out = stdout(&rein(
            &[
                &[
                    "generate",
                    "--model",
                    model.to_str().unwrap(),
                    "--input",
                    input.to_str().unwrap(),
                ][..],
                &settings,
            ]
            .concat(),
        ));
        let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines[0]["tokens"], case("two")["greedy"], "{family}");
        assert_eq!(lines[1]["tokens"], case("text_only")["greedy"], "{family}");
        assert_eq!(lines[2]["tokens"], case("small")["greedy"], "{family}");
    }
}

/// `rein generate --input` rows with `images` — a path relative to the file, and Hugging Face
/// `Image` objects with base64 bytes or a path — batched together, each continuing as
/// transformers does alone.
#[test]
fn generate_reads_each_input_rows_images() {
    use base64::Engine as _;
    let (dir, cases) = vlm();
    let case = |name: &str| cases.iter().find(|c| c["name"] == name).unwrap().clone();
    let rows_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("generate-image-rows");
    std::fs::create_dir_all(&rows_dir).unwrap();
    for name in ["wide.png", "grey.png"] {
        std::fs::copy(dir.join("images").join(name), rows_dir.join(name)).unwrap();
    }
    let tall = std::fs::read(dir.join("images/tall.png")).unwrap();
    let rows = [
        serde_json::json!({"prompt": case("wide")["text"], "images": ["wide.png"]}),
        serde_json::json!({"prompt": case("two")["text"], "images": [
            {"bytes": base64::engine::general_purpose::STANDARD.encode(tall), "path": null},
            {"path": "grey.png"},
        ]}),
    ];
    let input = rows_dir.join("rows.jsonl");
    std::fs::write(&input, rows.iter().map(|r| format!("{r}\n")).collect::<String>()).unwrap();
    let model = dir.join("idefics3");
    let args = [
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ];
    let out = stdout(&rein(
        &[&args[..], &["--temperature", "0", "--max-new-tokens", "8"]].concat(),
    ));
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[0]["tokens"], case("wide")["greedy"]);
    assert_eq!(lines[1]["tokens"], case("two")["greedy"]);

    // The same rows for a text-only model: refused, naming the row.
    let text_model = dir.join("../lm/qwen2-gqa");
    let refused = stderr_of_failure(&rein(&[
        "generate",
        "--model",
        text_model.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]));
    assert!(
        refused.contains("rows.jsonl:1 has images") && refused.contains("is not a vision-language model"),
        "{refused}"
    );
}

#[test]
fn generate_image_errors_name_the_file_or_the_model() {
    let (dir, _) = vlm();
    let vlm = dir.join("idefics3");
    let text_model = dir.join("../lm/qwen2-gqa");
    let wide = dir.join("images/wide.png");
    let not_an_image = temp_file("not-an-image.png", "plain text");
    let failure = |model: &std::path::Path, image: &std::path::Path, prompt: &str| {
        let args = [
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--image",
            image.to_str().unwrap(),
            "--prompt",
            prompt,
        ];
        stderr_of_failure(&rein(&args))
    };
    let missing = failure(&vlm, std::path::Path::new("/no/such/image.png"), "hi");
    assert!(missing.contains("--prompt: image 0: /no/such/image.png"), "{missing}");
    let undecodable = failure(&vlm, &not_an_image, "hi");
    assert!(
        undecodable.contains("not-an-image.png): cannot decode the image"),
        "{undecodable}"
    );
    let text_only = failure(&text_model, &wide, "hi");
    assert!(text_only.contains("is not a vision-language model"), "{text_only}");
    let markers = failure(&vlm, &wide, "<image> and <image>");
    assert!(markers.contains("2 `<image>` markers for 1 images"), "{markers}");
}

/// `rein generate --precision q8` on a GGUF model samples through the q8 products: its
/// log-probabilities are not the exact ones.
#[test]
fn generate_with_q8_precision_reads_the_codes_with_8_bit_activations() {
    let gguf = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gguf/tiny-llama.gguf");
    let run = |precision: &str| {
        let args = [
            "--prompt",
            "hello",
            "--temperature",
            "0",
            "--max-new-tokens",
            "4",
            "--logprobs",
        ];
        let model = ["generate", "--model", gguf.to_str().unwrap(), "--precision", precision];
        let out: Vec<&str> = model.iter().chain(&args).copied().collect();
        let line = stdout(&rein(&out));
        let value: serde_json::Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
        value["logprobs"].clone()
    };
    let (exact, q8) = (run("exact"), run("q8"));
    assert!(exact.is_array() && q8.is_array(), "{exact} {q8}");
    assert_ne!(exact, q8);
}

/// `rein generate --dtype bf16` samples with the linear layers' products in bf16: its
/// log-probabilities are not the f32 ones. q8 (the codes of a GGUF file) is refused with it, by
/// `generate` and `serve`, and so is a sequence classifier served in bf16.
#[test]
fn generate_with_bf16_products_moves_the_log_probabilities() {
    let run = |dtype: &str| {
        let args = [
            "--prompt",
            "What is 1 + 1?",
            "--temperature",
            "0",
            "--max-new-tokens",
            "4",
            "--logprobs",
        ];
        let lines = generate(&[&args[..], &["--dtype", dtype]].concat());
        lines[0]["logprobs"].clone()
    };
    let (f32_logprobs, bf16_logprobs) = (run("f32"), run("bf16"));
    assert!(bf16_logprobs.is_array(), "{bf16_logprobs}");
    assert_ne!(f32_logprobs, bf16_logprobs);
    let gguf = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gguf/tiny-llama.gguf");
    let gguf = gguf.to_str().unwrap();
    let both = ["--dtype", "bf16", "--precision", "q8"];
    for command in [&["generate", "--prompt", "hi"][..], &["serve", "--port", "0"]] {
        let args: Vec<&str> = command.iter().chain(&["--model", gguf]).chain(&both).copied().collect();
        let stderr = stderr_of_failure(&rein(&args));
        assert!(stderr.contains("--dtype bf16"), "{command:?}: {stderr}");
    }
    let classifier = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lm/qwen2-rm");
    let out = rein(&[
        "serve",
        "--port",
        "0",
        "--dtype",
        "bf16",
        "--model",
        classifier.to_str().unwrap(),
    ]);
    let stderr = stderr_of_failure(&out);
    assert!(
        stderr.contains("--dtype bf16") && stderr.contains("sequence classifier"),
        "{stderr}"
    );
    let out = rein(&["generate", "--model", gguf, "--prompt", "hi", "--dtype", "f16"]);
    assert!(stderr_of_failure(&out).contains("expected f32 or bf16"));
}

/// `q8` precision quantises the activations of products with a quantised model's codes: asked
/// for with a model that has none, generation, serving and training all say so instead of
/// quietly computing exactly.
#[test]
fn q8_precision_without_quantised_weights_is_an_error() {
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lm/qwen2-gqa");
    let model = model.to_str().unwrap();
    let generate = ["generate", "--model", model, "--prompt", "hi", "--precision"];
    let serve = ["serve", "--model", model, "--port", "0", "--precision"];
    let names_the_model = ["--precision q8", "qwen2-gqa"];
    for (args, value, says) in [
        (&generate[..], "q8", &names_the_model[..]),
        (&serve[..], "q8", &names_the_model[..]),
        (&generate[..], "q4", &["\"q4\" is not a precision"][..]),
    ] {
        let args: Vec<&str> = args.iter().copied().chain([value]).collect();
        let stderr = stderr_of_failure(&rein(&args));
        assert!(says.iter().all(|s| stderr.contains(s)), "{args:?}: {stderr}");
    }

    let runs = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("q8-runs");
    let rein = env!("CARGO_BIN_EXE_rein");
    let out = common::tiny_grpo_run(rein, &runs, &["sampler.precision=\"q8\""])
        .output()
        .unwrap();
    let stderr = stderr_of_failure(&out);
    assert!(
        stderr.contains("sampler.precision") && stderr.contains("load a .gguf"),
        "{stderr}"
    );
}

/// `rein` with `REIN_MODEL_DIR` set, as `cargo xtask` sets it for fetched models.
fn rein_with_models(args: &[&str], models: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(args)
        .env("REIN_MODEL_DIR", models)
        .env(
            "REIN_CACHE_DIR",
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"),
        )
        .output()
        .expect("the rein binary runs")
}

#[test]
fn a_fetched_model_is_found_by_name_from_a_recipe_and_the_command_line() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("named-models-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let models = dir.join("models");
    let named = models.join("tiny-qwen2");
    std::fs::create_dir_all(&named).unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lm/qwen2-gqa");
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), named.join(entry.file_name())).unwrap();
    }

    let out = rein_with_models(
        &[
            "generate",
            "--model",
            "tiny-qwen2",
            "--prompt",
            "hi",
            "--max-new-tokens",
            "2",
        ],
        &models,
    );
    assert_eq!(stdout(&out).lines().count(), 1);

    // In a recipe, a name that is not a path beside the recipe is looked up the same way.
    std::fs::write(dir.join("train.jsonl"), "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n").unwrap();
    let recipe = |model: &str| {
        let text = format!(
            "seed = 1\n[model]\npath = {model:?}\n[data]\ntrain = \"train.jsonl\"\n[sampler]\nn = 2\n\
             max_new_tokens = 2\n[algorithm]\nname = \"grpo\"\nsteps = 1\nprompts_per_step = 1\n\
             [[reward]]\nplugin = {plugin:?}\n[eval]\nk = 0\n[train]\nruns_dir = {runs:?}\n",
            plugin = common::plugin_path("math-answer").display().to_string(),
            runs = dir.join("runs").display().to_string(),
        );
        let path = dir.join(format!("{model}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    };
    let plugins = common::plugin_path("math-answer").parent().unwrap().to_path_buf();
    let run = |model: &str| {
        rein_with_models(
            &[
                "run",
                recipe(model).to_str().unwrap(),
                "--plugin-dir",
                plugins.to_str().unwrap(),
            ],
            &models,
        )
    };
    let out = run("tiny-qwen2");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = stderr_of_failure(&run("never-fetched"));
    assert!(stderr.contains("cargo xtask model never-fetched"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn convert_gguf_writes_a_checkpoint_directory_and_names_bad_files() {
    let gguf = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gguf/tiny-llama.gguf");
    let out_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("converted-{}", std::process::id()));
    let text = stdout(&rein(&[
        "convert",
        "gguf",
        gguf.to_str().unwrap(),
        out_dir.to_str().unwrap(),
    ]));
    assert!(text.contains("2 layers, hidden 256"), "{text}");
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(out_dir.join(file).is_file(), "{file}");
    }
    let not_gguf = temp_file("not-a-model.gguf", "GGML and then nothing");
    let stderr = stderr_of_failure(&rein(&[
        "convert",
        "gguf",
        not_gguf.to_str().unwrap(),
        out_dir.to_str().unwrap(),
    ]));
    assert!(
        stderr.contains("not-a-model.gguf") && stderr.contains("not a valid GGUF file"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn merge_lora_writes_the_merged_checkpoint_and_names_a_missing_adapter() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lora");
    let out_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("merged-{}", std::process::id()));
    let (base, adapter) = (fixtures.join("base"), fixtures.join("adapter"));
    let merge = |adapter: &std::path::Path| {
        rein(&[
            "merge-lora",
            "--base",
            base.to_str().unwrap(),
            "--adapter",
            adapter.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
        ])
    };
    let text = stdout(&merge(&adapter));
    assert!(
        text.contains("merged rank-4 adapters on q_proj, v_proj, o_proj, gate_proj, down_proj"),
        "{text}"
    );
    assert!(out_dir.join("model.safetensors").is_file() && out_dir.join("config.json").is_file());
    let stderr = stderr_of_failure(&merge(&fixtures.join("no-such-adapter")));
    assert!(stderr.contains("no-such-adapter/adapter_config.json"), "{stderr}");
    let _ = std::fs::remove_dir_all(&out_dir);
}
