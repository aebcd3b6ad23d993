//! `rein serve` against hostile clients, over loopback with raw sockets: every request that
//! asks for more than the server's limits is answered 4xx naming the limit, before any work;
//! slow, silent, lying and vanishing clients cost only themselves; and after each case an
//! ordinary greedy request gets the same text it got before any of them.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

fn model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lm/llama")
}

/// A `rein serve` process with small limits, so each case is quick; killed when dropped.
struct Server {
    child: Child,
    address: SocketAddr,
}

/// The limits every case here runs under (the model's own context is 512 positions).
const LIMITS: &[&str] = &[
    "--max-model-len",
    "256",
    "--max-body-bytes",
    "8388608",
    "--read-timeout",
    "2",
    "--max-num-seqs",
    "64",
    "--max-stop-strings",
    "16",
    "--max-stop-bytes",
    "1024",
];

impl Server {
    fn start(extra: &[&str]) -> Self {
        Self::start_model(&model(), extra)
    }

    fn start_model(model: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rein"))
            .args(["serve", "--port", "0", "--model"])
            .arg(model)
            .args(LIMITS)
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut log = std::io::BufReader::new(child.stderr.take().unwrap());
        let address = loop {
            let mut line = String::new();
            use std::io::BufRead;
            assert!(
                log.read_line(&mut line).unwrap() > 0,
                "rein serve exited before listening"
            );
            if let Some(at) = line.find("http://") {
                break line[at + 7..].trim().parse().unwrap();
            }
        };
        std::thread::spawn(move || std::io::copy(&mut log, &mut std::io::sink()));
        Self { child, address }
    }

    /// Sends `raw` and reads the answer until the server closes (requests say
    /// `Connection: close`); the status and the body.
    fn exchange(&self, raw: &[u8]) -> (u16, String) {
        let mut stream = TcpStream::connect(self.address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        // Written beside the reading: the server may answer (413) and close before it has read
        // everything.
        let mut writer = stream.try_clone().unwrap();
        let raw = raw.to_vec();
        let writing = std::thread::spawn(move || {
            let _ = writer.write_all(&raw);
        });
        let answer = read_answer(&mut stream);
        let _ = writing.join();
        answer
    }

    fn post(&self, path: &str, body: &Value) -> (u16, String) {
        self.exchange(&request(path, &body.to_string(), &[]))
    }

    /// The ordinary request each case is followed by: its text, after checking it succeeded.
    fn ordinary(&self) -> String {
        let (status, body) = self.post("/v1/completions", &ordinary_body());
        assert_eq!(status, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        answer["choices"][0]["text"].as_str().unwrap().to_string()
    }

    /// Asserts the server refuses `body` on `path` with `status`, naming `limit`, and then answers
    /// an ordinary request with `expected`.
    fn refuses(&self, path: &str, body: &Value, status: u16, limit: &str, expected: &str) {
        let (got, answer) = self.post(path, body);
        assert_eq!(got, status, "{path}: {answer}");
        assert!(
            answer.contains(limit),
            "{path}: the refusal should name {limit}: {answer}"
        );
        assert_eq!(self.ordinary(), expected, "after {path} refused {limit}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ordinary_body() -> Value {
    json!({"prompt": "The answer is", "max_tokens": 8, "temperature": 0})
}

/// The ordinary request with `extra`'s keys added or replaced.
fn completion(extra: Value) -> Value {
    let mut body = ordinary_body();
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

fn request(path: &str, body: &str, headers: &[&str]) -> Vec<u8> {
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n",
        body.len()
    );
    for header in headers {
        head += &format!("{header}\r\n");
    }
    let mut raw = (head + "\r\n").into_bytes();
    raw.extend_from_slice(body.as_bytes());
    raw
}

/// Reads one answer: status, and the body after the blank line.
fn read_answer(stream: &mut TcpStream) -> (u16, String) {
    let mut bytes = Vec::new();
    let _ = stream.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {text:?}"));
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    (status, body)
}

#[test]
fn requests_past_the_limits_are_refused_naming_them_and_the_server_goes_on() {
    let server = Server::start(&[]);
    let expected = server.ordinary();
    let huge = 1_099_511_627_776u64;
    // Sizes past the context: one that would have sized the RoPE tables at 2^40 positions, and
    // one merely longer than the model was trained for.
    for tokens in [huge, 100_000] {
        server.refuses(
            "/v1/completions",
            &completion(json!({"max_tokens": tokens})),
            400,
            "maximum context length is 256",
            &expected,
        );
    }
    server.refuses(
        "/generate",
        &json!({"text": "The answer is", "sampling_params": {"max_new_tokens": huge}}),
        400,
        "--max-model-len",
        &expected,
    );
    server.refuses(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": huge}),
        400,
        "--max-model-len",
        &expected,
    );
    // A 200,000-token prompt for a 256-position context.
    server.refuses(
        "/v1/completions",
        &json!({"prompt": vec![5u32; 200_000], "max_tokens": 1}),
        400,
        "200000 in the messages",
        &expected,
    );
    // Many and long stop strings, many stop token ids.
    let many: Vec<String> = (0..100_000).map(|i| i.to_string()).collect();
    server.refuses(
        "/v1/completions",
        &completion(json!({"stop": many})),
        400,
        "--max-stop-strings",
        &expected,
    );
    server.refuses(
        "/v1/completions",
        &completion(json!({"stop": ["x".repeat(2000)]})),
        400,
        "--max-stop-bytes",
        &expected,
    );
    server.refuses(
        "/generate",
        &json!({"input_ids": [1, 2, 3], "sampling_params": {"stop_token_ids": vec![7u32; 1000]}}),
        400,
        "--max-stop-strings",
        &expected,
    );
    // More sequences than one request may have: n alone, and prompts × n.
    server.refuses(
        "/v1/completions",
        &completion(json!({"n": 1_000_000})),
        400,
        "--max-num-seqs",
        &expected,
    );
    server.refuses(
        "/v1/completions",
        &json!({"prompt": vec!["a"; 16], "n": 8, "max_tokens": 4}),
        400,
        "16 prompts × n = 8",
        &expected,
    );
}

#[test]
fn values_outside_their_ranges_are_refused_as_openai_and_vllm_refuse_them() {
    let server = Server::start(&[]);
    let expected = server.ordinary();
    for (key, value) in [
        ("top_p", json!(7)),
        ("top_p", json!(0)),
        ("top_k", json!(-5)),
        ("min_p", json!(2)),
    ] {
        server.refuses("/v1/completions", &completion(json!({key: value})), 400, key, &expected);
    }
    server.refuses(
        "/generate",
        &json!({"text": "hi", "sampling_params": {"top_p": 7}}),
        400,
        "top_p",
        &expected,
    );
    server.refuses(
        "/v1/chat/completions",
        &json!({"messages": []}),
        400,
        "messages",
        &expected,
    );
}

#[test]
fn bodies_past_the_size_limit_are_refused_413_whether_declared_or_streamed() {
    let server = Server::start(&[]);
    let expected = server.ordinary();
    // A 9 MiB prompt, declared with Content-Length: refused before it is read.
    let prompt = "a".repeat(9 << 20);
    let body = json!({"prompt": prompt, "max_tokens": 1}).to_string();
    let (status, answer) = server.exchange(&request("/v1/completions", &body, &[]));
    assert_eq!(status, 413, "{answer}");
    assert!(answer.contains("--max-body-bytes"), "{answer}");
    assert_eq!(server.ordinary(), expected);
    // The same body in chunks, with no length declared: refused once the limit is passed.
    let mut raw = b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
                    Transfer-Encoding: chunked\r\n\r\n"
        .to_vec();
    for chunk in body.as_bytes().chunks(1 << 20) {
        raw.extend(format!("{:x}\r\n", chunk.len()).as_bytes());
        raw.extend(chunk);
        raw.extend(b"\r\n");
    }
    raw.extend(b"0\r\n\r\n");
    let (status, answer) = server.exchange(&raw);
    assert_eq!(status, 413, "{answer}");
    assert_eq!(server.ordinary(), expected);
}

#[test]
fn silent_slow_and_lying_clients_cost_only_themselves() {
    let server = Server::start(&[]);
    let expected = server.ordinary();
    // 200 connections that promise a body and send none, and 50 that stop mid-request-line.
    let mut stalled = Vec::new();
    for _ in 0..200 {
        let mut stream = TcpStream::connect(server.address).unwrap();
        let head = "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n";
        stream.write_all(head.as_bytes()).unwrap();
        stalled.push(stream);
    }
    for _ in 0..50 {
        let mut stream = TcpStream::connect(server.address).unwrap();
        stream.write_all(b"POST /v1/comp").unwrap();
        stalled.push(stream);
    }
    let started = Instant::now();
    assert_eq!(server.ordinary(), expected);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "an ordinary request waited {:?} behind stalled connections",
        started.elapsed()
    );
    // Within the read timeout (2 s), each stalled body is answered 408 and each stalled head
    // closed.
    let (status, answer) = read_answer(&mut stalled[0]);
    assert_eq!(status, 408, "{answer}");
    assert!(answer.contains("--read-timeout"), "{answer}");
    stalled[230].set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let closed = stalled[230].read_to_end(&mut Vec::new());
    assert!(
        closed.is_ok(),
        "a stalled request line still open after 30 s: {closed:?}"
    );
    drop(stalled);
    // A body shorter than its Content-Length says: a timeout; longer: the rest is read as the
    // next request, which is not HTTP, and the connection is closed.
    let body = ordinary_body().to_string();
    let short = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
        body.len() + 100
    );
    assert_eq!(server.exchange(short.as_bytes()).0, 408);
    let long = format!("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10\r\n\r\n{body}");
    let (status, _) = server.exchange(long.as_bytes());
    assert_eq!(status, 400);
    assert_eq!(server.ordinary(), expected);
    // Headers past their limit.
    let big = format!("X-Padding: {}", "p".repeat(100_000));
    let (status, _) = server.exchange(&request("/v1/completions", &body, &[&big]));
    assert_eq!(status, 431);
    assert_eq!(server.ordinary(), expected);
}

#[test]
fn pipelined_requests_and_clients_that_leave_mid_generation() {
    let server = Server::start(&[]);
    let expected = server.ordinary();
    // Three requests in one write, on one kept-alive connection: three answers, in order.
    let body = ordinary_body().to_string();
    let one = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let last = String::from_utf8(request("/v1/completions", &body, &[])).unwrap();
    let (status, answers) = server.exchange(format!("{one}{one}{last}").as_bytes());
    assert_eq!(status, 200);
    let texts: Vec<&str> = answers.matches(&format!("\"text\":{}", json!(expected))).collect();
    assert_eq!(texts.len(), 3, "{answers}");
    // Clients that send a long generation and hang up at once.
    for _ in 0..4 {
        let mut stream = TcpStream::connect(server.address).unwrap();
        let body = json!({"prompt": "The answer is", "max_tokens": 200, "temperature": 1.0});
        stream
            .write_all(&request("/v1/completions", &body.to_string(), &[]))
            .unwrap();
    }
    assert_eq!(server.ordinary(), expected);
}

#[test]
fn a_classifier_refuses_inputs_past_its_context_its_vocabulary_or_its_count() {
    let rm = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lm/qwen2-rm");
    let server = Server::start_model(&rm, &[]);
    let scores = || {
        let (status, answer) = server.post("/classify", &json!({"input": ["1 + 1 = 2", "2 + 2 = 5"]}));
        assert_eq!(status, 200, "{answer}");
        serde_json::from_str::<Value>(&answer).unwrap()["data"].clone()
    };
    let expected = scores();
    let cases = [
        (
            json!(vec![5u32; 300]),
            "input 0 has 300 tokens; this model's maximum context length is 256",
        ),
        (
            json!([[1, 2], [1, 2, 100_000]]),
            "token id 100000 is outside the vocabulary",
        ),
        (
            json!(vec![[1, 2]; 300]),
            "300 inputs in one request; this server takes at most 64 (--max-num-seqs)",
        ),
    ];
    for (input, message) in cases {
        let (status, answer) = server.post("/classify", &json!({"input": input}));
        assert_eq!(status, 400, "{answer}");
        assert!(answer.contains(message), "{answer}");
        assert_eq!(scores(), expected);
    }
}

#[test]
fn the_kv_cache_budget_bounds_a_request() {
    // 2 layers × 2 (keys, values) × 4 heads × 16 dims × 4 bytes = 1 KiB per position: 64 KiB
    // hold 64 positions.
    let server = Server::start(&["--max-kv-cache-bytes", "65536"]);
    let expected = server.ordinary();
    server.refuses(
        "/v1/completions",
        &json!({"prompt": "The answer is", "max_tokens": 200, "n": 4}),
        400,
        "--max-kv-cache-bytes",
        &expected,
    );
}

#[test]
fn an_api_key_guards_every_endpoint_but_health_and_weights_load_only_from_their_directory() {
    let weights = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hostile-weights-{}", std::process::id()));
    std::fs::create_dir_all(&weights).unwrap();
    let weights_dir = weights.display().to_string();
    let server = Server::start(&["--api-key", "s3cret", "--weights-dir", &weights_dir]);
    let body = ordinary_body().to_string();
    let (status, answer) = server.exchange(&request("/v1/completions", &body, &[]));
    assert_eq!(status, 401, "{answer}");
    assert!(answer.contains("--api-key"), "{answer}");
    let wrong = server.exchange(&request("/v1/completions", &body, &["Authorization: Bearer s3cre"]));
    assert_eq!(wrong.0, 401);
    let health = b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    assert_eq!(server.exchange(health).0, 200);
    let key = "Authorization: Bearer s3cret";
    let text = |answer: &str| serde_json::from_str::<Value>(answer).unwrap()["choices"][0]["text"].clone();
    let (status, before) = server.exchange(&request("/v1/completions", &body, &[key]));
    assert_eq!(status, 200, "{before}");
    // Weights from outside --weights-dir are refused, and the served weights stay; a checkpoint
    // inside it loads.
    let outside = json!({"model_path": model().display().to_string()}).to_string();
    let (status, answer) = server.exchange(&request("/update_weights_from_disk", &outside, &[key]));
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("--weights-dir"), "{answer}");
    let (status, after) = server.exchange(&request("/v1/completions", &body, &[key]));
    assert_eq!(status, 200);
    assert_eq!(text(&after), text(&before));
    let inside = weights.join("checkpoint");
    std::fs::create_dir_all(&inside).unwrap();
    for file in std::fs::read_dir(model()).unwrap() {
        let file = file.unwrap().path();
        std::fs::copy(&file, inside.join(file.file_name().unwrap())).unwrap();
    }
    let load = json!({"model_path": inside.display().to_string()}).to_string();
    let (status, answer) = server.exchange(&request("/update_weights_from_disk", &load, &[key]));
    assert_eq!(status, 200, "{answer}");
}

/// A vision-language model's server refuses, naming the limit or the reason, a request with
/// more images than `--limit-images-per-prompt`, an image over `--max-image-pixels`, an image
/// that is not one, bad base64, a URL it would have to fetch, a local file without
/// `--allowed-local-media-path`; a language model's server refuses images at all. Each goes on.
#[test]
fn image_inputs_past_the_limits_or_unreadable_are_refused_naming_why() {
    use base64::Engine as _;
    let vlm = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/vlm");
    let server = Server::start_model(
        &vlm.join("idefics3"),
        &["--limit-images-per-prompt", "2", "--max-image-pixels", "1200"],
    );
    let expected = server.ordinary();
    let data = |bytes: &[u8]| {
        format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        )
    };
    let image = |name: &str| data(&std::fs::read(vlm.join("images").join(name)).unwrap());
    let chat = |urls: Vec<String>| {
        let mut content = vec![json!({"type": "text", "text": "What is this?"})];
        content.extend(
            urls.into_iter()
                .map(|url| json!({"type": "image_url", "image_url": {"url": url}})),
        );
        json!({"messages": [{"role": "user", "content": content}], "max_tokens": 4})
    };
    let cases = [
        (
            vec![image("grey.png"); 3],
            "3 images; this server reads at most 2 (--limit-images-per-prompt)",
        ),
        (
            vec![image("tall.png")],
            "image 0: the image is 31x50 pixels, over the limit of 1200 pixels",
        ),
        (vec![data(b"plain text")], "image 0: cannot decode the image"),
        (
            vec!["data:image/png;base64,@@@".into()],
            "image 0: data:image/png;base64: Invalid",
        ),
        (
            vec!["https://example.com/cat.png".into()],
            "this server makes no network requests",
        ),
        (vec!["file:///etc/passwd".into()], "--allowed-local-media-path"),
    ];
    for (urls, message) in cases {
        server.refuses("/v1/chat/completions", &chat(urls), 400, message, &expected);
    }
    let (status, answer) = server.post("/v1/chat/completions", &chat(vec![image("grey.png")]));
    assert_eq!(status, 200, "{answer}");

    let language_model = Server::start(&[]);
    let expected = language_model.ordinary();
    language_model.refuses(
        "/v1/chat/completions",
        &chat(vec![image("grey.png")]),
        400,
        "reads no images",
        &expected,
    );
}
