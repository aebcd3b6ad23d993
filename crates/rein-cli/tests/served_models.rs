//! Models that score for a trainer on `rein serve`, against the same model in process: a judge
//! (`HttpJudge`, OpenAI's chat completions), a reward model (the classification API of vLLM and
//! SGLang) and a process reward model (vLLM's pooling API); a server that is gone is a failure
//! naming it.

#[path = "support/server.rs"]
mod server;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use server::Server;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn scratch(tag: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("served-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A judge behind `rein serve` gives, greedily, the answers the same model gives in process:
/// the chat template, the stop token, the tokens' texts and the two most likely tokens at each
/// position all agree. Once the server is gone,
/// each request is a failure naming it (the plugin sees it; the run counts it).
#[test]
fn a_judge_on_rein_serve_answers_as_the_model_in_process() {
    use rein_core::{Judge, JudgeError, JudgeRequest, Message, request_seed};
    use rein_model::Cpu;
    use rein_model::lm::{LmTokenizer, load};
    use rein_sampler::HttpJudge;
    use rein_sampler::NativeJudge;

    let model = root().join("tests/fixtures/lm/llama");
    let mut server = Server::start(&model);
    let requests: Vec<JudgeRequest> = ["Is 2 + 3 = 5?", "Is the sky green?", "Grade this: 7"]
        .iter()
        .map(|question| {
            let messages = vec![
                Message::new("system", "Answer Yes or No."),
                Message::new("user", *question),
            ];
            JudgeRequest {
                seed: request_seed(1, &messages, 8, 0.0, &[]),
                messages,
                max_new_tokens: 8,
                temperature: 0.0,
                stop: Vec::new(),
                top_logprobs: 2,
            }
        })
        .collect();
    let later = Instant::now() + Duration::from_secs(120);
    let mut http = HttpJudge::new(&server.url, "rein-policy", 2048);
    let served = http.judge(&requests, later, 1);
    let device = Default::default();
    let tokenizer = LmTokenizer::load(&model, &[]).unwrap();
    let mut native = NativeJudge::<Cpu>::new(load::<Cpu>(&model, &device).unwrap(), tokenizer, "llama", &device);
    let local = native.judge(&requests, later, 1);
    for (served, local) in served.iter().zip(&local) {
        let (served, local) = (served.as_ref().unwrap(), local.as_ref().unwrap());
        assert_eq!(served.text, local.text);
        assert_eq!(served.finished, local.finished);
        let texts = |j: &rein_core::Judgement| j.tokens.iter().map(|t| t.text.clone()).collect::<Vec<_>>();
        assert_eq!(texts(served), texts(local));
        // The two most likely tokens at each position, and their log-probabilities (1e-4).
        for (s, l) in served.tokens.iter().zip(&local.tokens) {
            assert_eq!(s.top.len(), 2);
            for ((s_text, s_lp), (l_text, l_lp)) in s.top.iter().zip(&l.top) {
                assert_eq!(s_text, l_text);
                assert!((s_lp - l_lp).abs() < 1e-4, "{s_lp} vs {l_lp}");
            }
        }
    }
    server.kill();
    let gone = http.judge(&requests[..1], later, 1);
    match &gone[0] {
        Err(JudgeError::Failed { reason }) => assert!(reason.contains(&server.url), "{reason}"),
        other => panic!("expected a failure naming the server, got {other:?}"),
    }
}

/// A reward model behind `rein serve` (the classification API that vLLM and SGLang speak) scores
/// as the same model in process; a server holding another classifier (other labels) and a
/// server that is gone are failures naming the server, counted by the reward.
#[test]
fn a_reward_model_on_rein_serve_scores_as_in_process() {
    use rein_core::{Group, RewardFn};
    use rein_model::Cpu;
    use rein_sampler::ModelReward;

    let dir = root().join("tests/fixtures/lm/qwen2-rm");
    let mut server = Server::start(&dir);
    let fixture = std::fs::read_to_string(root().join("tests/fixtures/lm/qwen2-rm.texts.json")).unwrap();
    let fixture: serde_json::Value = serde_json::from_str(&fixture).unwrap();
    let texts: Vec<String> = (fixture["texts"].as_array().unwrap().iter())
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    let device = Default::default();
    let local = ModelReward::<Cpu>::load("rm", &dir, Some("helpful"), 3, &device).unwrap();
    let timeout = Duration::from_secs(60);
    let mut served = ModelReward::<Cpu>::served("rm", &dir, Some("helpful"), 3, &server.url, None, timeout).unwrap();
    let (want, got) = (local.score_texts(&texts).unwrap(), served.score_texts(&texts).unwrap());
    assert_eq!(got.len(), texts.len());
    for (g, w) in got.iter().zip(&want) {
        assert!(
            (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "served {got:?} vs in process {want:?}"
        );
    }

    // The served model must be the one whose labels the recipe's directory names.
    let one_label = Server::start(&root().join("tests/fixtures/lm/llama-rm"));
    let other = ModelReward::<Cpu>::served("rm", &dir, None, 3, &one_label.url, None, timeout).unwrap();
    let err = other.score_texts(&texts).unwrap_err();
    assert!(
        err.contains(&one_label.url) && err.contains("1 outputs per text") && err.contains("3 labels"),
        "{err}"
    );

    server.kill();
    let group = Group {
        prompt: "What is 12 + 7?".into(),
        completions: vec!["<answer>19</answer>".into()],
        ..Group::default()
    };
    let err = served.score(&[group]).unwrap_err().to_string();
    assert!(err.contains(&server.url), "{err}");
    assert_eq!(served.failures().errors, 1, "the failure is counted");
}

/// A process reward model (a two-label token classifier) on `rein serve`'s pooling API scores
/// each step as the same model in process, whether the server answers every token's row or, with
/// `--step-tag`, the step tag's only; a step tag of several tokens is refused at start; a causal
/// LM cannot be served as one, and a server that is gone is a failure naming it, counted by the
/// reward.
#[test]
fn a_process_reward_model_on_rein_serve_scores_as_in_process() {
    use rein_core::{Group, PrmSettings, RewardFn, SeededRng};
    use rein_model::Cpu;
    use rein_model::lm::TokenClassifier;
    use rein_sampler::{PrmError, PrmReward};

    let source = root().join("tests/fixtures/lm/qwen2-gqa");
    let dir = scratch("token-classifier");
    let device = Default::default();
    let decoder = rein_model::lm::load::<Cpu>(&source, &device).unwrap();
    TokenClassifier::from_decoder(decoder, 2, Some(0), 0.5, &mut SeededRng::new(3), &device)
        .save(&dir)
        .unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(source.join(file), dir.join(file)).unwrap();
    }
    let settings = PrmSettings {
        separator: "\n".into(),
        tag: "\n".into(),
        ..PrmSettings::default()
    };
    let prompt = "What is 12 + 7?";
    let completions = [
        "12 + 7 = 19",
        "1 + 2 = 3\n1 + 7 = 8\nso 19",
        "\n",
        "a longer first step, with more words\nthen 19",
    ];
    let local = PrmReward::<Cpu>::load("prm", &dir, &settings, &device).unwrap();
    let want = local.group_step_scores(prompt, &completions).unwrap();
    let timeout = Duration::from_secs(60);
    let every_token = Server::start(&dir);
    let at_tags = Server::start_with(&dir, &["--step-tag", "\n"]);
    for server in [&every_token, &at_tags] {
        let served = PrmReward::<Cpu>::served("prm", &dir, &settings, &server.url, None, timeout).unwrap();
        let got = served.group_step_scores(prompt, &completions).unwrap();
        assert_eq!(got.iter().map(Vec::len).collect::<Vec<_>>(), [1, 3, 0, 2]);
        for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
            assert!((g - w).abs() <= 1e-5, "served {got:?} vs in process {want:?}");
        }
    }

    // A step tag of several tokens, or one for a model that is no token classifier, is refused
    // when the server starts, naming the option.
    for (model, tag, says) in [
        (&dir, "two words", "a step tag is one token"),
        (&source, "\n", "--step-tag is for token classifiers"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_rein"))
            .args(["serve", "--port", "0", "--model"])
            .arg(model)
            .args(["--step-tag", tag])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(says), "{stderr}");
    }

    let Err(error) = PrmReward::<Cpu>::served("prm", &source, &settings, &at_tags.url, None, timeout) else {
        panic!("a causal LM was taken for a served token classifier")
    };
    assert!(matches!(error, PrmError::NotServable { .. }), "{error}");

    let mut gone = every_token;
    let mut served = PrmReward::<Cpu>::served("prm", &dir, &settings, &gone.url, None, timeout).unwrap();
    gone.kill();
    let group = Group {
        prompt: prompt.into(),
        completions: vec![completions[1].into()],
        ..Group::default()
    };
    let err = served.score(&[group]).unwrap_err().to_string();
    assert!(err.contains(&gone.url), "{err}");
    assert_eq!(served.failures().errors, 1, "the failure is counted");
}

/// A vision-language model on `rein serve` reads images in a chat request's `image_url` parts
/// — a `data:` URL and a `file://` path under `--allowed-local-media-path` — renders the
/// messages' parts with its chat template and continues as transformers does (the fixture's
/// greedy tokens).
#[test]
fn a_vision_language_model_on_rein_serve_reads_images_in_chat_messages() {
    chat_with_two_images_continues_as_transformers_does("idefics3", "idefics3.expected.json");
}

/// The same for Qwen2-VL: its chat template writes `<|vision_start|><|image_pad|><|vision_end|>`
/// per image, and each image's tokens sit at their multimodal positions.
#[test]
fn a_qwen2_vl_model_on_rein_serve_reads_images_in_chat_messages() {
    chat_with_two_images_continues_as_transformers_does("qwen2_vl_model", "qwen2_vl.expected.json");
}

/// `rein serve` of the model `tests/fixtures/vlm/<model>` answers the chat with two images (a
/// `data:` URL and a `file://` path) with the `chat` case of `<expected>`: its greedy tokens,
/// and its prompt's length.
fn chat_with_two_images_continues_as_transformers_does(model: &str, expected: &str) {
    use base64::Engine as _;
    use rein_model::lm::LmTokenizer;
    let vlm = root().join("tests/fixtures/vlm");
    let media = vlm.join("images");
    let model = vlm.join(model);
    let server = Server::start_with(&model, &["--allowed-local-media-path", media.to_str().unwrap()]);
    let png = std::fs::read(media.join("grey.png")).unwrap();
    let data_url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(png)
    );
    let file_url = format!("file://{}", media.join("wide.png").canonicalize().unwrap().display());
    let body = serde_json::json!({
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Compare "},
            {"type": "image_url", "image_url": {"url": data_url}},
            {"type": "text", "text": " with "},
            {"type": "image_url", "image_url": {"url": file_url}},
        ]}],
        "max_tokens": 8,
        "temperature": 0,
    });
    let (status, answer) = server.post("/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{answer}");
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(vlm.join(expected)).unwrap()).unwrap();
    let chat = (expected["cases"].as_array().unwrap().iter())
        .find(|c| c["name"] == "chat")
        .unwrap();
    let greedy: Vec<u32> = serde_json::from_value(chat["greedy"].clone()).unwrap();
    let tokenizer = LmTokenizer::load(&model, &[]).unwrap();
    let text = rein_sampler::completion_text(&tokenizer, &greedy, &[]);
    assert_eq!(answer["choices"][0]["message"]["content"], text.as_str(), "{answer}");
    assert_eq!(
        answer["usage"]["prompt_tokens"],
        chat["input_ids"].as_array().unwrap().len()
    );
}
