//! Reward plugins in Python and JavaScript: `math-answer-py` and `math-answer-js` score every
//! case of `plugins/math-answer/cases.jsonl` exactly as the Rust `math-answer` does (scores and
//! components), and train in a short GRPO run like any other reward plugin.

#[path = "common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};

use rein_core::{Group, RewardFn};
use rein_recipe::LoadedRecipe;
use rein_train::RunOutcome;
use serde::Deserialize;

const PORTS: [&str; 2] = ["math-answer-py", "math-answer-js"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

#[derive(Deserialize)]
struct Case {
    name: String,
    #[serde(default)]
    config: Option<serde_json::Value>,
    group: Group,
    expected: Vec<Option<f64>>,
}

#[test]
fn python_and_js_ports_score_every_case_as_the_rust_plugin_does() {
    let text = std::fs::read_to_string(root().join("plugins/math-answer/cases.jsonl")).unwrap();
    let cases: Vec<Case> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(cases.len() >= 50, "the shared cases are missing");
    let rust = common::load("math-answer");
    let ports: Vec<_> = PORTS.iter().map(|name| common::load(name)).collect();
    for case in &cases {
        let config = case.config.as_ref().map_or("{}".to_string(), |c| c.to_string());
        let groups = std::slice::from_ref(&case.group);
        let expected = rust.reward(&config).unwrap().score(groups).unwrap();
        let values: Vec<Option<f64>> = expected[0].iter().map(|s| s.score).collect();
        assert_eq!(values, case.expected, "math-answer: {}", case.name);
        for (name, port) in PORTS.iter().zip(&ports) {
            let got = port.reward(&config).unwrap().score(groups).unwrap();
            assert_eq!(got, expected, "{name}: {}", case.name);
        }
    }
}

#[test]
fn ports_reject_bad_config_with_the_rust_plugins_message() {
    let rust = common::load("math-answer");
    for config in [
        r#"{"extrct": "auto"}"#,
        r#"{"extract": "nowhere"}"#,
        r#"{"tolerance": "x"}"#,
        "[1]",
    ] {
        let expected = rust.reward(config).unwrap_err().to_string();
        for name in PORTS {
            let got = common::load(name).reward(config).unwrap_err().to_string();
            assert_eq!(
                got.replace(name, "math-answer"),
                expected,
                "{name} with config {config}"
            );
        }
    }
}

#[test]
fn a_short_grpo_run_trains_with_python_and_js_rewards() {
    let runs = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("guest-grpo-{}", std::process::id()));
    let overrides: Vec<String> = [
        // Few, small problems seen many times in SFT: the model knows most of its training
        // prompts' answers, so the rewards get right completions to compare on any CPU.
        "data.task.max_operand=9",
        "data.task.train=100",
        "data.task.test=8",
        "sft.steps=150",
        "sft.batch_size=32",
        "algorithm.steps=3",
        "algorithm.prompts_per_step=4",
        "sampler.n=4",
        "sampler.max_new_tokens=40",
        "eval.k=2",
        r#"reward=[{plugin="math-answer-py", config={extract="answer"}}, {plugin="math-answer-js", config={extract="answer"}, weight=0.5}]"#,
        "eval.accuracy_reward=\"math-answer-js\"",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("train.runs_dir={:?}", runs.display().to_string())])
    .collect();
    let loaded = LoadedRecipe::load(&root().join("recipes/grpo-arithmetic.toml"), &overrides).unwrap();
    let plugin_dir = common::plugin_path("math-answer-py").parent().unwrap().to_path_buf();
    let RunOutcome::Lm(outcome) = rein_train::run(&loaded, &plugin_dir, true).unwrap() else {
        panic!("a language-model outcome")
    };
    assert_eq!(outcome.grpo.as_ref().unwrap().steps, 3);
    let metrics = std::fs::read_to_string(outcome.run_dir.unwrap().join("metrics.jsonl")).unwrap();
    let steps: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["stage"] == "grpo")
        .collect();
    assert_eq!(steps.len(), 3);
    let correct: f64 = steps
        .iter()
        .map(|s| s["train/reward/math-answer-py/correct"].as_f64().unwrap())
        .sum();
    assert!(
        correct > 0.0,
        "no completion was right, so the rewards were not compared"
    );
    for step in &steps {
        // The same judgement from both languages, weighted 1 and 0.5.
        let py = step["train/reward/math-answer-py/correct"].as_f64().unwrap();
        let js = step["train/reward/math-answer-js/correct"].as_f64().unwrap();
        assert_eq!(py, js, "{step}");
        let total = step["train/reward"].as_f64().unwrap();
        let py_reward = step["train/reward/math-answer-py"].as_f64().unwrap();
        assert!((total - 1.5 * py_reward).abs() < 1e-9, "{step}");
    }
}

/// The step helpers of Python (`rein_steps`) and JavaScript (`js-shared/steps.js`), run inside
/// components, cut texts into the same character spans as `rein_pdk::steps` under every rule,
/// across multi-byte characters and surrogate pairs.
#[test]
fn python_and_js_step_helpers_cut_steps_as_the_rust_helper_does() {
    use rein_pdk::steps::{Split, split};
    let texts = [
        "12 + 30 = 42\n42 * 2 = 84\n\n<answer>84</answer>\n",
        "  α = 1 \n\n\tβ = α + 1\r\n🎉 done\u{85}",
        "Plan first.\nStep 1: 2+3=5\nsee Step 2 below\nStep  2. 5*4=20\nStep two: no\nStep 3",
        "a=1 ки b=2 ки  ки c=3 🎉x",
        "<think>7+8=15, 4+3+1=8</think><answer>85</answer>",
        "",
    ];
    let rules = [
        "lines",
        "marker:Step",
        "delimiter:ки",
        "delimiter:, ",
        "delimiter:\\n\\n",
    ];
    for name in ["steps-py", "steps-js"] {
        let plugin = common::load_with(&common::test_plugin_path(name), rein_plugin::SandboxLimits::default());
        assert!(plugin.info().reads_tokens, "{name} asks for tokens");
        for rule in rules {
            let config = serde_json::json!({ "steps": rule }).to_string();
            let group = Group {
                prompt: "p".into(),
                completions: texts.iter().map(|t| t.to_string()).collect(),
                ..Group::default()
            };
            let scores = plugin.reward(&config).unwrap().score(&[group]).unwrap().remove(0);
            for (text, score) in texts.iter().zip(scores) {
                let expected: Vec<(usize, usize, f64)> = (split(text, &Split::parse(rule).unwrap()).iter())
                    .enumerate()
                    .map(|(k, s)| (s.start, s.end, k as f64 + 1.0))
                    .collect();
                let got: Vec<(usize, usize, f64)> = score.steps.iter().map(|s| (s.start, s.end, s.score)).collect();
                assert_eq!(got, expected, "{name}, rule {rule:?}, text {text:?}");
                assert_eq!(score.score, None);
            }
        }
        let refused = plugin.reward(r#"{"steps": "sentences"}"#).unwrap_err();
        assert!(refused.to_string().contains("sentences"), "{name}: {refused}");
    }
}

/// The Python image helper (plugins/python-shared/rein_images.py), inside a component, reads
/// every board of `count-shapes`' cases as the Rust PDK does: sizes from the headers, pixels
/// from grey, RGB, RGBA and palette PNGs, and the PNGs it writes itself.
#[test]
fn the_python_image_helper_reads_pngs_as_the_rust_pdk_does() {
    let text = std::fs::read_to_string(root().join("plugins/count-shapes/cases.jsonl")).unwrap();
    let cases: Vec<Case> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let plugin = common::load_with(
        &common::test_plugin_path("images-py"),
        rein_plugin::SandboxLimits::default(),
    );
    assert!(plugin.info().reads_images, "images-py asks for images");
    let mut reward = plugin.reward("{}").unwrap();
    let mut read = 0;
    for case in cases.iter().filter(|c| !c.group.images.is_empty()) {
        let scores = reward.score(std::slice::from_ref(&case.group)).unwrap().remove(0);
        let got: std::collections::BTreeMap<&str, f64> = (scores[0].components.iter())
            .map(|(name, value)| (name.as_str(), *value))
            .collect();
        let first = &case.group.images[0];
        let image = rein_pdk::Image {
            media_type: first.media_type().into(),
            data: first.bytes().to_vec(),
        };
        let (width, height) = image.size().unwrap();
        let pixels = image.decode_rgb().unwrap();
        let red = (pixels.rgb.chunks(3)).filter(|p| *p == [220, 30, 30]).count();
        let checksum: u64 = pixels.rgb.iter().map(|&b| u64::from(b)).sum();
        let expected = std::collections::BTreeMap::from([
            ("count", case.group.images.len() as f64),
            ("width", f64::from(width)),
            ("height", f64::from(height)),
            ("red", red as f64),
            ("checksum", checksum as f64),
            ("round_trip", 1.0),
        ]);
        assert_eq!(got, expected, "{}", case.name);
        read += 1;
    }
    assert!(read >= 10, "the cases hold too few boards: {read}");
}
