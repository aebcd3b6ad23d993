//! A language model as a judge ([`NativeJudge`]): answers that depend only on the request and
//! its seed (not on what else was asked with it), log-probabilities read back from the model,
//! and the deadline honoured.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use burn::backend::Flex;
use rein_core::{Judge, JudgeError, JudgeRequest, Message, request_seed};
use rein_model::lm::{LmTokenizer, load};
use rein_sampler::NativeJudge;

type B = Flex;

fn judge() -> NativeJudge<B> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lm/llama");
    let device = Default::default();
    let model = load::<B>(&dir, &device).unwrap();
    let tokenizer = LmTokenizer::load(&dir, &[]).unwrap();
    NativeJudge::new(model, tokenizer, &PathBuf::from("llama").display().to_string(), &device)
}

fn request(question: &str, temperature: f32, top_logprobs: usize) -> JudgeRequest {
    let messages = vec![
        Message::new("system", "Answer Yes or No."),
        Message::new("user", question),
    ];
    JudgeRequest {
        seed: request_seed(3, &messages, 6, temperature, &[]),
        messages,
        max_new_tokens: 6,
        temperature,
        stop: Vec::new(),
        top_logprobs,
    }
}

fn later() -> Instant {
    Instant::now() + Duration::from_secs(600)
}

#[test]
fn an_answer_depends_on_its_request_and_seed_not_on_its_batch() {
    let mut judge = judge();
    for temperature in [0.0, 1.0] {
        let a = request("Is 2 + 3 = 5?", temperature, 3);
        let b = request("Is the sky green?", temperature, 3);
        let alone = judge.judge(std::slice::from_ref(&a), later(), 1).remove(0).unwrap();
        let batched = judge.judge(&[b.clone(), a.clone()], later(), 1);
        assert_eq!(batched[1].as_ref().unwrap(), &alone, "temperature {temperature}");
        assert_eq!(alone.tokens.len(), 6, "a random model runs to max_new_tokens");
        assert!(!alone.finished);
    }
    // Another seed samples another answer (at temperature 1, over 6 tokens of a random model).
    let a = request("Is 2 + 3 = 5?", 1.0, 0);
    let reseeded = JudgeRequest {
        seed: a.seed ^ 1,
        ..a.clone()
    };
    let answers = judge.judge(&[a, reseeded], later(), 1);
    assert_ne!(answers[0].as_ref().unwrap().text, answers[1].as_ref().unwrap().text);
}

#[test]
fn greedy_tokens_are_the_most_likely_and_their_log_probabilities_are_the_models() {
    let mut judge = judge();
    let answer = judge
        .judge(&[request("Is 2 + 3 = 5?", 0.0, 5)], later(), 1)
        .remove(0)
        .unwrap();
    for token in &answer.tokens {
        assert_eq!(token.top.len(), 5);
        assert!(token.top.windows(2).all(|w| w[0].1 >= w[1].1), "most likely first");
        assert_eq!(
            token.top[0],
            (token.text.clone(), token.logprob),
            "greedy takes the argmax"
        );
        let mass: f32 = token.top.iter().map(|(_, lp)| lp.exp()).sum();
        assert!(mass > 0.0 && mass <= 1.0 + 1e-5 && token.logprob <= 0.0);
    }
    let text: String = answer.tokens.iter().map(|t| t.text.as_str()).collect();
    assert_eq!(text, answer.text);
    // Without alternatives the sampler's own log-probabilities are returned: the same numbers.
    let plain = judge
        .judge(&[request("Is 2 + 3 = 5?", 0.0, 0)], later(), 1)
        .remove(0)
        .unwrap();
    assert_eq!(plain.text, answer.text);
    for (a, b) in plain.tokens.iter().zip(&answer.tokens) {
        assert!(a.top.is_empty() && a.text == b.text);
        assert!((a.logprob - b.logprob).abs() < 1e-4, "{} vs {}", a.logprob, b.logprob);
    }
}

#[test]
fn a_judge_past_its_deadline_answers_with_the_deadline_error() {
    let mut judge = judge();
    let answers = judge.judge(&[request("Is 2 + 3 = 5?", 0.0, 0)], Instant::now(), 250);
    assert_eq!(answers[0], Err(JudgeError::Deadline { limit_ms: 250 }));
    let empty = JudgeRequest {
        messages: vec![Message::new("user", "")],
        ..request("", 0.0, 0)
    };
    assert!(
        judge.prompt_tokens(&empty).unwrap() > 0,
        "the chat template adds its markers"
    );
}
