//! The HTTP generator against mock servers and the protocol fixtures.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use super::*;

type B = rein_model::Cpu;

/// A server that answers every request `200 OK` with `body` as plain text, recording the
/// request lines it saw.
fn plain_text_server(body: &'static str) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let (mut first, mut length) = (String::new(), 0usize);
            reader.read_line(&mut first).unwrap();
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap();
                }
                if line.trim().is_empty() {
                    break;
                }
            }
            let mut request_body = vec![0; length];
            reader.read_exact(&mut request_body).unwrap();
            log.lock().unwrap().push(first.trim().to_string());
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            reader.get_mut().write_all(answer.as_bytes()).unwrap();
        }
    });
    (url, seen)
}

fn settings(url: String, api: ServerApi) -> HttpSettings {
    HttpSettings {
        urls: vec![url],
        api,
        model: "policy".into(),
        timeout: Duration::from_secs(5),
        retries: 0,
        backoff: Duration::from_millis(1),
        weights_dir: std::env::temp_dir(),
        adapter_only: true,
        keep_versions: 2,
    }
}

#[test]
fn vllm_adapter_endpoints_answering_plain_text_succeed() {
    let (url, seen) = plain_text_server("Success: LoRA adapter 'policy' added successfully.");
    let mut generator = HttpGenerator::<B>::new(settings(url, ServerApi::Vllm));
    generator.load_everywhere(Path::new("/weights/v000001"), 1).unwrap();
    assert_eq!(generator.live_urls().len(), 1);
    assert_eq!(
        *seen.lock().unwrap(),
        [
            "POST /v1/unload_lora_adapter HTTP/1.1",
            "POST /v1/load_lora_adapter HTTP/1.1"
        ]
    );
}

#[test]
fn a_plain_text_answer_to_a_generation_request_is_a_bad_response() {
    let (url, _) = plain_text_server("hello");
    let generator = HttpGenerator::<B>::new(settings(url.clone(), ServerApi::Sglang));
    let Ok(answer) = generator.post(&url, "/generate", &GenerateRequest::default()) else {
        panic!("post failed")
    };
    assert_eq!(answer, "hello");
    let config = GenerationConfig::default();
    let failure = generator.parse(&answer, &config).err().unwrap();
    assert!(failure.contains("answer"), "{failure}");
}

fn fixture(name: &str) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/protocol");
    std::fs::read_to_string(dir.join(name)).unwrap()
}

fn config(n: usize, stop_token_ids: Vec<u32>) -> GenerationConfig {
    GenerationConfig {
        n,
        stop_token_ids,
        ..GenerationConfig::default()
    }
}

#[test]
fn documented_sglang_answers_parse() {
    let client = HttpGenerator::<B>::new(settings("http://unused".into(), ServerApi::Sglang));
    let (samples, version) = (client.parse(
        &fixture("sglang-generate-response-batch-logprobs.json"),
        &config(2, vec![128009]),
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(version.as_deref(), Some("default"));
    assert_eq!(samples[0].tokens, [12366, 13, 128009]);
    assert_eq!(samples[0].logprobs, [-0.1053, -0.4471, -0.0021]);
    assert_eq!(samples[0].finish, FinishReason::StopToken);
    assert_eq!((samples[1].tokens.len(), samples[1].finish), (16, FinishReason::Length));
    // Asked without `return_logprob`: the answers parse, and the client says what is missing.
    for name in [
        "sglang-generate-response-length.json",
        "sglang-generate-response-stop.json",
    ] {
        let answer = fixture(name);
        let outputs = parse::<GenerateResponse>(&answer).unwrap().outputs();
        assert_eq!(
            outputs[0].meta_info.weight_version.as_deref(),
            Some("default"),
            "{name}"
        );
        let error = client.parse(&answer, &config(1, vec![128009])).err().unwrap();
        assert!(error.contains("was return_logprob ignored?"), "{name}: {error}");
    }
    let stop = parse::<GenerateResponse>(&fixture("sglang-generate-response-stop.json")).unwrap();
    let finish = stop.outputs().remove(0).meta_info.finish_reason;
    assert_eq!(
        finish,
        Some(SglangFinish::Stop {
            matched: Some(Matched::Token(128009))
        })
    );
    let updated = parse::<UpdateWeightsResponse>(&fixture("sglang-update-weights-response.json")).unwrap();
    assert!(updated.success);
    let failed = parse::<UpdateWeightsResponse>(&fixture("sglang-update-weights-response-failed.json")).unwrap();
    assert!(!failed.success && failed.message.contains("repository not found"));
    let classified = parse::<crate::protocol::ClassifyResponse>(&fixture("sglang-classify-response.json")).unwrap();
    assert_eq!(classified.data[0].probs, [0.565970778465271, 0.4340292513370514]);
    assert_eq!((classified.data[0].index, classified.data[0].num_classes), (0, Some(2)));
}

#[test]
fn documented_vllm_answers_parse() {
    let client = HttpGenerator::<B>::new(settings("http://unused".into(), ServerApi::Vllm));
    let answer = fixture("vllm-completions-response-batch-logprobs.json");
    let (samples, _) = client
        .parse(&answer, &config(2, vec![151645]))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(samples[0].tokens, [2585, 525, 498, 30, 151645], "sorted by index");
    assert_eq!(samples[0].finish, FinishReason::StopToken);
    assert_eq!(samples[1].logprobs.len(), 8);
    assert_eq!(samples[1].finish, FinishReason::Length);
    for name in [
        "vllm-completions-response-without-token-ids.json",
        "vllm-completions-response-usage.json",
    ] {
        let answer = fixture(name);
        assert!(parse::<CompletionResponse>(&answer).is_ok(), "{name}");
        let error = client.parse(&answer, &config(1, vec![])).err().unwrap();
        assert!(error.contains("needs vLLM ≥ 0.10.2"), "{name}: {error}");
    }
}

#[test]
fn the_client_sends_only_what_the_servers_document() {
    // GenerateReqInput and SamplingParams (SGLang), CompletionRequest (vLLM): the fields rein uses.
    const SGLANG: &[&str] = &[
        "input_ids",
        "text",
        "sampling_params",
        "return_logprob",
        "logprob_start_len",
        "stream",
    ];
    const SGLANG_SAMPLING: &[&str] = &[
        "max_new_tokens",
        "stop",
        "stop_token_ids",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "n",
        "skip_special_tokens",
        "no_stop_trim",
        "sampling_seed",
    ];
    const VLLM: &[&str] = &[
        "model",
        "prompt",
        "max_tokens",
        "n",
        "seed",
        "logprobs",
        "stop",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "stop_token_ids",
        "include_stop_str_in_output",
        "skip_special_tokens",
        "return_token_ids",
    ];
    let keys = |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    let full = GenerationConfig {
        top_k: Some(5),
        top_p: Some(0.9),
        min_p: Some(0.05),
        ..config(4, vec![2])
    };
    let sglang = HttpGenerator::<B>::new(settings("http://unused".into(), ServerApi::Sglang));
    let request = serde_json::to_value(sglang.request(&[1, 2], 7, &full, &["\n".into()])).unwrap();
    assert!(keys(&request).iter().all(|k| SGLANG.contains(&k.as_str())), "{request}");
    let params = &request["sampling_params"];
    assert!(
        keys(params).iter().all(|k| SGLANG_SAMPLING.contains(&k.as_str())),
        "{params}"
    );
    assert_eq!(params["sampling_seed"], 7);
    let vllm = HttpGenerator::<B>::new(settings("http://unused".into(), ServerApi::Vllm));
    let request = serde_json::to_value(vllm.request(&[1, 2], 7, &full, &[])).unwrap();
    assert!(keys(&request).iter().all(|k| VLLM.contains(&k.as_str())), "{request}");
    assert_eq!(
        (request["top_k"].clone(), request["return_token_ids"].clone()),
        (5.into(), true.into())
    );
}
