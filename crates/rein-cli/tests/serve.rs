//! Rollouts on inference servers, over loopback: `rein serve` processes as the servers and
//! `rein run` with `sampler.backend = "http"` as the trainer.
//!
//! - two servers train as the native backend does: the same tokens, metrics and final weights
//!   (log-probabilities equal to the last bits: the servers batch requests as they arrive);
//! - a server killed mid-run is dropped and named, and the run finishes on the other;
//! - with no server left the run saves its last step and stops naming the servers;
//! - asynchronous GRPO (`max_staleness = 1`) never trains on completions more than one
//!   version old;
//! - the `openai` Python client talks to `rein serve` (completions and chat, log-probabilities
//!   with the most likely alternatives, `echo`);
//! - lm-evaluation-harness's `local-completions` model scores a loglikelihood task on it as the
//!   model in process does;
//!
//! A judge, a reward model and a process reward model on `rein serve` are `served_models.rs`.

#[path = "../../../tests/common/mod.rs"]
mod common;
#[path = "support/server.rs"]
mod server;

use server::Server;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn scratch(tag: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("serve-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The main recipe cut down to seconds, with enough SFT for rewards and gradients to appear.
const QUICK: &[&str] = &[
    "sft.steps=120",
    "sft.batch_size=32",
    "algorithm.prompts_per_step=4",
    "sampler.n=4",
    "sampler.max_new_tokens=24",
    "data.task.train=2000",
    "data.task.test=16",
    "eval.k=2",
];

/// `rein run recipes/grpo-arithmetic.toml` with QUICK, `overrides`, runs under `runs`.
fn rein_run(runs: &Path, overrides: &[String]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rein"));
    command
        .arg("run")
        .arg(root().join("recipes/grpo-arithmetic.toml"))
        .arg("--plugin-dir")
        .arg(common::plugin_path("math-answer").parent().unwrap())
        .arg("--set")
        .arg(format!("train.runs_dir={:?}", runs.display().to_string()))
        .env(
            "REIN_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"),
        );
    for o in QUICK.iter().map(|s| s.to_string()).chain(overrides.iter().cloned()) {
        command.arg("--set").arg(o);
    }
    command
}

fn succeeded(out: Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{what} failed:\n{stderr}");
    stderr
}

fn only_run(runs: &Path) -> PathBuf {
    std::fs::read_dir(runs).unwrap().next().unwrap().unwrap().path()
}

fn urls(servers: &[&Server]) -> String {
    let quoted: Vec<String> = servers.iter().map(|s| format!("{:?}", s.url)).collect();
    format!("sampler.urls=[{}]", quoted.join(", "))
}

fn http(servers: &[&Server]) -> Vec<String> {
    vec!["sampler.backend=\"http\"".into(), urls(servers)]
}

/// One native run of 4 GRPO steps, made by the first test that asks and shared by all: its
/// metrics are what the servers' run must reproduce, and its `sft/` and `final/` the models the
/// servers load.
fn native() -> &'static Path {
    static RUN: OnceLock<PathBuf> = OnceLock::new();
    RUN.get_or_init(|| {
        let runs = scratch("native");
        succeeded(
            rein_run(&runs, &["algorithm.steps=4".to_string()]).output().unwrap(),
            "the native run",
        );
        only_run(&runs)
    })
}

#[test]
fn two_servers_train_as_the_native_sampler_does() {
    let native = native();
    let (a, b) = (Server::start(&native.join("sft")), Server::start(&native.join("sft")));
    let runs = scratch("http");
    let mut overrides = http(&[&a, &b]);
    overrides.push("algorithm.steps=4".into());
    let stderr = succeeded(rein_run(&runs, &overrides).output().unwrap(), "the http run");
    assert!(stderr.contains(&a.url) && stderr.contains(&b.url), "{stderr}");
    let run = only_run(&runs);
    // The servers batch requests as they arrive, so a prompt's padding (and with it the float
    // summation order over attention keys) can differ from the trainer's batch: the sampled
    // tokens are the same, their log-probabilities equal to the last bits. The trainer scores
    // its rows packed without padding, so neither run's sampler agrees with it to the bit: the
    // policy loss, whose exact value here is 0 (ratios of 1, advantages summing to 0 in each
    // group), is float noise of ~1e-8 in both, hence the absolute floor of 1e-7.
    let (http, native_metrics) = (
        common::metrics_without_timings(&run),
        common::metrics_without_timings(native),
    );
    assert_eq!(http.len(), native_metrics.len());
    for (a, b) in http.iter().zip(&native_metrics) {
        let keys: std::collections::BTreeSet<&String> = a
            .as_object()
            .unwrap()
            .keys()
            .chain(b.as_object().unwrap().keys())
            .collect();
        for key in keys {
            match (a.get(key).and_then(|v| v.as_f64()), b.get(key).and_then(|v| v.as_f64())) {
                (Some(x), Some(y)) => assert!(
                    (x - y).abs() <= 1e-5 * x.abs().max(y.abs()).max(1e-2),
                    "{key}: {x} (http) vs {y} (native) at {a}"
                ),
                _ => assert_eq!(a.get(key), b.get(key), "{key} differs between http and native at {a}"),
            }
        }
    }
    let grpo: Vec<_> = http.iter().filter(|r| r["stage"] == "grpo").collect();
    assert!(
        grpo.iter().any(|r| r["train/grad_norm"].as_f64().unwrap() > 0.0),
        "no step had a gradient, so the comparison proves little: {grpo:?}"
    );
    assert_eq!(
        std::fs::read(run.join("final/config.json")).unwrap(),
        std::fs::read(native.join("final/config.json")).unwrap()
    );
    let (a, b) = (
        safetensors_f32(&run.join("final/model.safetensors")),
        safetensors_f32(&native.join("final/model.safetensors")),
    );
    assert_eq!(a.len(), b.len());
    let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(worst <= 1e-6, "final weights differ by up to {worst}");
    // Each update was written for the servers; the last two versions are kept.
    let mut versions: Vec<String> = (std::fs::read_dir(run.join("weights")).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    versions.sort();
    assert_eq!(versions, ["v000002", "v000003"]);
    // Servers batch as requests arrive: the report does not promise a bit-identical rerun.
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(
        report.contains("**Not reproducible**") && report.contains("sampler.backend = \"http\""),
        "{report}"
    );
    let native_report = std::fs::read_to_string(native.join("report.md")).unwrap();
    assert!(native_report.contains("\nReproducible: "), "{native_report}");
}

/// Waits until `run`'s metrics hold a GRPO step, or the run ends.
fn wait_for_grpo_step(runs: &Path, run: &mut Child) {
    let started = Instant::now();
    loop {
        let logged = (std::fs::read_dir(runs).ok().and_then(|mut d| d.next()))
            .and_then(|e| std::fs::read_to_string(e.ok()?.path().join("metrics.jsonl")).ok())
            .is_some_and(|m| m.contains("\"stage\":\"grpo\""));
        if logged || run.try_wait().unwrap().is_some() {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "no GRPO step in 10 minutes"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `steps` GRPO steps with `overrides` (the servers), killing `victim` once a GRPO step
/// is logged; returns the run directory and the run's output.
fn kill_mid_run(tag: &str, mut overrides: Vec<String>, victim: &mut Server, steps: usize) -> (PathBuf, Output) {
    let runs = scratch(tag);
    overrides.extend([
        format!("algorithm.steps={steps}"),
        "sampler.retries=1".into(),
        "sampler.backoff_s=0.05".into(),
    ]);
    let mut run = rein_run(&runs, &overrides).stderr(Stdio::piped()).spawn().unwrap();
    wait_for_grpo_step(&runs, &mut run);
    assert!(
        run.try_wait().unwrap().is_none(),
        "the run ended before its server could be killed"
    );
    victim.kill();
    (only_run(&runs), run.wait_with_output().unwrap())
}

#[test]
fn a_killed_server_is_dropped_and_named_and_the_run_finishes() {
    let native = native();
    let (a, mut b) = (Server::start(&native.join("sft")), Server::start(&native.join("sft")));
    let (run, out) = kill_mid_run("kill", http(&[&a, &b]), &mut b, 8);
    let stderr = succeeded(out, "the run with a killed server");
    assert!(
        stderr.contains(&format!("inference server {} stopped answering", b.url)),
        "the log does not name the dead server {}:\n{stderr}",
        b.url
    );
    let grpo_steps = (common::metrics_without_timings(&run).iter())
        .filter(|r| r["stage"] == "grpo" && r.get("step").is_some())
        .count();
    assert_eq!(grpo_steps, 8, "the run did not finish its 8 steps");
}

#[test]
fn with_no_server_left_the_run_saves_its_last_step_and_names_the_servers() {
    let native = native();
    let mut only = Server::start(&native.join("sft"));
    let (run, out) = kill_mid_run("none", http(&[&only]), &mut only, 50);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the run went on without servers:\n{stderr}");
    assert!(
        stderr.contains("no inference server is left") && stderr.contains(&only.url),
        "the error does not name the servers:\n{stderr}"
    );
    assert!(stderr.contains("saved the last completed step in"), "{stderr}");
    let checkpoints = run.join("checkpoints");
    assert!(
        std::fs::read_dir(&checkpoints).unwrap().count() > 0,
        "no checkpoint in {}",
        checkpoints.display()
    );
}

#[test]
fn asynchronous_grpo_trains_on_completions_at_most_one_version_old() {
    let runs = scratch("async");
    let overrides = [
        "algorithm.steps=5".to_string(),
        "algorithm.max_staleness=1".into(),
        "algorithm.correction=\"tis\"".into(),
    ];
    succeeded(rein_run(&runs, &overrides).output().unwrap(), "the asynchronous run");
    let grpo: Vec<_> = (common::metrics_without_timings(&only_run(&runs)).into_iter())
        .filter(|r| r["stage"] == "grpo" && r.get("step").is_some())
        .collect();
    assert_eq!(grpo.len(), 5);
    assert_eq!(
        grpo[0]["train/policy_lag_max"], 0.0,
        "step 1 samples the starting policy"
    );
    for r in &grpo {
        let lag = r["train/policy_lag_max"].as_f64().unwrap();
        assert!(
            lag <= 1.0,
            "step {} trained on completions {lag} versions old",
            r["step"]
        );
        assert!(r["train/mismatch_kl"].as_f64().unwrap() >= 0.0);
        assert!(r["train/correction_capped_frac"].is_number());
    }
    // The producer samples step k + 1 while step k trains: a run that never trained on an
    // older policy would be synchronous whatever `max_staleness` says.
    let lags: Vec<f64> = grpo
        .iter()
        .map(|r| r["train/policy_lag_max"].as_f64().unwrap())
        .collect();
    assert!(
        lags.contains(&1.0),
        "no step trained on completions one version old (lags {lags:?}): the run was synchronous"
    );
    let report = std::fs::read_to_string(only_run(&runs).join("report.md")).unwrap();
    assert!(
        report.contains("**Not reproducible**") && report.contains("max_staleness = 1"),
        "{report}"
    );
}

/// Python with the `openai` package `cargo xtask test` installs (`REIN_OPENAI_PYTHONPATH`, by
/// default `<target>/tools/openai-client`).
fn openai_client() -> Command {
    python_with("REIN_OPENAI_PYTHONPATH", "openai-client", "the openai client")
}

/// Python with the packages `cargo xtask test` installs under `<target>/tools/<dir>` (or where
/// the variable `env` says).
fn python_with(env: &str, dir: &str, what: &str) -> Command {
    let installed = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../tools").join(dir);
    let path = std::env::var_os(env)
        .map(PathBuf::from)
        .or_else(|| installed.is_dir().then_some(installed))
        .unwrap_or_else(|| panic!("{what} is not installed: run the suite with `cargo xtask test`, which installs it"));
    let mut python = Command::new("python3");
    python.env("PYTHONPATH", path);
    python
}

const OPENAI_SCRIPT: &str = r#"
import json, sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
model = client.models.list().data[0].id
done = client.completions.create(model=model, prompt="What is 12 + 30?", max_tokens=12, n=2, seed=3, logprobs=0)
chat = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "What is 12 + 30?"}], max_tokens=12, temperature=0, logprobs=True,
    top_logprobs=3,
)
top = client.completions.create(model=model, prompt="What is 12 + 30?", max_tokens=6, seed=3, logprobs=5)
echo = client.completions.create(model=model, prompt="What is 12 + 30?", max_tokens=0, echo=True, logprobs=1, temperature=0)
plain_echo = client.completions.create(model=model, prompt="What is 12 + 30?", max_tokens=2, echo=True, temperature=0)
try:
    client.completions.create(model=model, prompt="What is 12 + 30?", max_tokens=1, logprobs=21)
    too_many = None
except Exception as e:
    too_many = str(e)
print(json.dumps({
    "top": top.choices[0].logprobs.model_dump(),
    "echo_text": echo.choices[0].text,
    "echo": echo.choices[0].logprobs.model_dump(),
    "echo_prompt_tokens": echo.usage.prompt_tokens,
    "plain_echo": [plain_echo.choices[0].text, plain_echo.choices[0].logprobs is None],
    "too_many": too_many,
    "chat_top": [[(a.token, a.logprob) for a in t.top_logprobs] for t in chat.choices[0].logprobs.content],
    "texts": [c.text for c in done.choices],
    "finish": [c.finish_reason for c in done.choices],
    "tokens": [c.logprobs.tokens for c in done.choices],
    "logprobs": [c.logprobs.token_logprobs for c in done.choices],
    "usage": done.usage.completion_tokens,
    "chat": chat.choices[0].message.content,
    "chat_logprobs": [t.logprob for t in chat.choices[0].logprobs.content],
    "chat_finish": chat.choices[0].finish_reason,
}))
"#;

#[test]
fn the_openai_python_client_talks_to_rein_serve() {
    let native = native();
    let model = native.join("final");
    let server = Server::start(&model);
    let out = openai_client()
        .arg("-c")
        .arg(OPENAI_SCRIPT)
        .arg(&server.url)
        .output()
        .unwrap();
    let answer: serde_json::Value = serde_json::from_str(&succeeded_stdout(out)).unwrap();
    assert_eq!(answer["texts"].as_array().unwrap().len(), 2, "n = 2 gives two choices");
    let mut tokens = 0;
    for (pieces, logprobs) in answer["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .zip(answer["logprobs"].as_array().unwrap())
    {
        let (pieces, logprobs) = (pieces.as_array().unwrap(), logprobs.as_array().unwrap());
        assert_eq!(pieces.len(), logprobs.len());
        assert!(logprobs.iter().all(|l| l.as_f64().unwrap() <= 0.0), "{logprobs:?}");
        tokens += pieces.len();
    }
    assert_eq!(answer["usage"].as_u64().unwrap() as usize, tokens);
    assert!(
        answer["finish"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f == "stop" || f == "length")
    );
    // Greedy chat is what `rein generate --chat --temperature 0` answers.
    let generated = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args([
            "generate",
            "--chat",
            "--temperature",
            "0",
            "--max-new-tokens",
            "12",
            "--prompt",
            "What is 12 + 30?",
            "--model",
        ])
        .arg(&model)
        .output()
        .unwrap();
    let generated: serde_json::Value =
        serde_json::from_str(succeeded_stdout(generated).lines().next().unwrap()).unwrap();
    assert_eq!(answer["chat"], generated["completion"]);
    assert!(!answer["chat_logprobs"].as_array().unwrap().is_empty());
    // Greedy chat with top_logprobs = 3: each token is the first of its three alternatives.
    for (logprob, top) in
        (answer["chat_logprobs"].as_array().unwrap().iter()).zip(answer["chat_top"].as_array().unwrap())
    {
        let top = top.as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(&top[0][1], logprob);
    }
    // logprobs = 5: five alternatives and the sampled token at each position, its own entry
    // equal to its log-probability, none more likely than the first five.
    let top = &answer["top"];
    for ((token, logprob), alternatives) in (top["tokens"].as_array().unwrap().iter())
        .zip(top["token_logprobs"].as_array().unwrap())
        .zip(top["top_logprobs"].as_array().unwrap())
    {
        let alternatives = alternatives.as_object().unwrap();
        assert!((5..=6).contains(&alternatives.len()), "{alternatives:?}");
        assert_eq!(&alternatives[token.as_str().unwrap()], logprob);
        let total: f64 = alternatives.values().map(|v| v.as_f64().unwrap().exp()).sum();
        assert!(total <= 1.0 + 1e-5);
    }
    // echo with max_tokens = 0: the prompt's own tokens, scored after the first.
    assert_eq!(answer["echo_text"], "What is 12 + 30?");
    let echo = &answer["echo"];
    let scored = echo["token_logprobs"].as_array().unwrap();
    assert_eq!(scored.len() as u64, answer["echo_prompt_tokens"].as_u64().unwrap());
    assert!(scored[0].is_null() && echo["top_logprobs"][0].is_null());
    assert!(scored[1..].iter().all(|l| l.as_f64().unwrap() <= 0.0));
    let pieces: Vec<&str> = echo["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(pieces.concat(), "What is 12 + 30?");
    // echo without logprobs: the prompt in front of the completion's text.
    let plain_echo = answer["plain_echo"].as_array().unwrap();
    assert!(plain_echo[0].as_str().unwrap().starts_with("What is 12 + 30?"));
    assert_eq!(plain_echo[1], true);
    let too_many = answer["too_many"].as_str().expect("logprobs = 21 is refused");
    assert!(
        too_many.contains("`logprobs` = 21") && too_many.contains("at most 20"),
        "{too_many}"
    );
}

/// lm-evaluation-harness's OpenAI-compatible model on a multiple-choice task written as a
/// local JSON file; prints each document's (loglikelihood, is_greedy) per choice.
const LM_EVAL_SCRIPT: &str = r#"
import json, os, sys
url, model_dir, task_dir = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
import lm_eval
from lm_eval.tasks import TaskManager
results = lm_eval.simple_evaluate(
    model="local-completions",
    model_args=dict(
        model="final", base_url=url + "/v1/completions", tokenizer=model_dir, tokenizer_backend="huggingface",
        tokenized_requests=True, num_concurrent=1, max_retries=1,
    ),
    tasks=["rein_check"],
    task_manager=TaskManager(include_path=task_dir),
    log_samples=True,
)
samples = sorted(results["samples"]["rein_check"], key=lambda s: s["doc_id"])
print(json.dumps({
    "acc": results["results"]["rein_check"]["acc,none"],
    "resps": [[r[0] for r in s["resps"]] for s in samples],
}))
"#;

/// lm-evaluation-harness (`local-completions`, which asks `echo = true, max_tokens = 1,
/// logprobs = 1` and reads the prompt's log-probabilities) scores each choice of a local
/// multiple-choice task as the model in process does: the loglikelihood of the model's greedy
/// continuation equals the sum of the log-probabilities its sampler gave (KV-cache decoding, not
/// the server's teacher-forced pass) and is marked greedy; other choices are not.
#[test]
fn lm_evaluation_harness_scores_a_loglikelihood_task_on_rein_serve() {
    use rein_model::Cpu;
    use rein_model::lm::{LmTokenizer, load};
    use rein_sampler::{GenerationConfig, generate, prompt_logprobs};

    let model_dir = native().join("final");
    let server = Server::start(&model_dir);
    let device = Default::default();
    let model = load::<Cpu>(&model_dir, &device).unwrap();
    let tokenizer = LmTokenizer::load(&model_dir, &[]).unwrap();
    let encode = |text: &str| tokenizer.encode(text).unwrap();
    // Contexts end in "<think>" (a chat prompt ending in a newline would have lm-eval move the
    // newline into every continuation).
    let contexts: Vec<String> = ["What is 1 + 3?", "What is 71 - 9?", "What is 58 + 29?"]
        .iter()
        .map(|q| format!("<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n<think>"))
        .collect();
    let config = GenerationConfig {
        max_new_tokens: 6,
        temperature: 0.0,
        ..GenerationConfig::default()
    };
    let prompts: Vec<Vec<u32>> = contexts.iter().map(|c| encode(c)).collect();
    let greedy = generate(&model, &prompts, &config, 0, &mut |_, _| false, &device);
    let scratch = scratch("lm-eval-task");
    let mut docs = String::new();
    // Per document, per choice: the expected loglikelihood and whether it is the greedy one.
    let mut expected: Vec<Vec<(f64, bool)>> = Vec::new();
    for ((context, prompt), g) in contexts.iter().zip(&prompts).zip(&greedy) {
        let choices = [
            tokenizer.decode(&g.tokens, false).unwrap(),
            "<answer>0</answer>".into(),
            "hello".into(),
        ];
        let mut row = Vec::new();
        for (i, choice) in choices.iter().enumerate() {
            // As lm-eval tokenises a pair: the context alone, then what encoding both adds.
            let whole = encode(&format!("{context}{choice}"));
            let continuation = &whole[prompt.len()..];
            let sent: Vec<u32> = prompt.iter().chain(continuation).copied().collect();
            let scored = prompt_logprobs(&model, &sent, 0.0, 0, &device);
            let sum: f64 = scored[prompt.len() - 1..].iter().map(|s| f64::from(s.logprob)).sum();
            if i == 0 {
                assert_eq!(
                    continuation,
                    g.tokens.as_slice(),
                    "the greedy text re-tokenises to its tokens"
                );
                let sampled: f64 = g.logprobs.iter().map(|&l| f64::from(l)).sum();
                assert!((sum - sampled).abs() < 1e-3, "{sum} vs {sampled}");
            } else {
                assert!(!g.tokens.starts_with(continuation), "{choice:?} is not a greedy prefix");
            }
            row.push((sum, i == 0));
        }
        expected.push(row);
        docs += &serde_json::json!({"context": context, "choices": choices, "answer": 0}).to_string();
        docs.push('\n');
    }
    std::fs::write(scratch.join("docs.jsonl"), docs).unwrap();
    let task = format!(
        "task: rein_check\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {:?}\ntest_split: test\n\
         output_type: multiple_choice\ndoc_to_text: \"{{{{context}}}}\"\ndoc_to_choice: choices\ndoc_to_target: answer\n\
         target_delimiter: \"\"\nmetric_list:\n  - metric: acc\n",
        scratch.join("docs.jsonl").display().to_string()
    );
    std::fs::write(scratch.join("rein_check.yaml"), task).unwrap();
    let out = python_with("REIN_LM_EVAL_PYTHONPATH", "lm-eval", "lm-evaluation-harness")
        .arg("-c")
        .arg(LM_EVAL_SCRIPT)
        .arg(&server.url)
        .arg(&model_dir)
        .arg(&scratch)
        .current_dir(&scratch)
        .output()
        .unwrap();
    let answer: serde_json::Value = serde_json::from_str(&succeeded_stdout(out)).unwrap();
    let resps = answer["resps"].as_array().unwrap();
    assert_eq!(resps.len(), expected.len());
    let mut right = 0;
    for (doc, expected) in resps.iter().zip(&expected) {
        let doc = doc.as_array().unwrap();
        for (got, &(loglikelihood, greedy)) in doc.iter().zip(expected) {
            let got_ll = got[0].as_f64().unwrap();
            assert!((got_ll - loglikelihood).abs() < 1e-3, "{got_ll} vs {loglikelihood}");
            assert_eq!(got[1].as_bool().unwrap(), greedy, "{got:?}");
        }
        let best = (0..doc.len()).max_by(|&a, &b| doc[a][0].as_f64().unwrap().total_cmp(&doc[b][0].as_f64().unwrap()));
        right += usize::from(best == Some(0));
    }
    assert_eq!(answer["acc"].as_f64().unwrap(), right as f64 / expected.len() as f64);
}

/// The tensors of an f32 safetensors file, concatenated (the header must be equal to compare).
fn safetensors_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    bytes[8 + header..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn succeeded_stdout(out: Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}
