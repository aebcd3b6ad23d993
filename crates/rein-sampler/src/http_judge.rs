//! [`HttpJudge`]: a judge model behind an inference server, through OpenAI's
//! `POST /v1/chat/completions` (vLLM, SGLang and `rein serve` all speak it).
//!
//! Each request is one chat completion (`n` = 1, its own seed, `logprobs` on, `top_logprobs`
//! as the plugin asked), all of a batch sent at once so the server batches them. The server
//! renders the chat template and counts the prompt's tokens itself, so the prompt length is
//! checked from its answer (`usage.prompt_tokens`) rather than before. A request still running
//! at the deadline is abandoned ([`JudgeError::Deadline`]); a server that refuses or cannot be
//! reached gives [`JudgeError::Failed`] naming it, which the plugin sees and the run counts.

use std::time::Instant;

use rein_core::{Judge, JudgeError, JudgeRequest, JudgedToken, Judgement};

use crate::http::{Failure, post_json};
use crate::protocol::{ChatRequest, ChatRequestMessage, ChatResponse, MessageContent, Stop, parse};

/// A judge model on an inference server (see the module docs).
pub struct HttpJudge {
    url: String,
    model: String,
    max_prompt_tokens: usize,
    agent: ureq::Agent,
}

impl HttpJudge {
    /// The judge served at `url` (`http://host:port`) under the name `model`; answers whose
    /// prompt the server counts longer than `max_prompt_tokens` are refused.
    pub fn new(url: &str, model: &str, max_prompt_tokens: usize) -> Self {
        Self {
            url: url.trim_end_matches('/').to_string(),
            model: model.into(),
            max_prompt_tokens,
            agent: ureq::AgentBuilder::new().build(),
        }
    }

    fn body(&self, request: &JudgeRequest) -> ChatRequest {
        let messages = (request.messages.iter())
            .map(|m| ChatRequestMessage {
                role: m.role.clone(),
                content: Some(MessageContent::Text(m.content.clone())),
            })
            .collect();
        ChatRequest {
            model: Some(self.model.clone()),
            messages,
            tools: None,
            max_tokens: Some(request.max_new_tokens as u64),
            max_completion_tokens: None,
            temperature: Some(request.temperature),
            top_k: None,
            top_p: None,
            min_p: None,
            n: Some(1),
            stop: (!request.stop.is_empty()).then(|| Stop::Many(request.stop.clone())),
            stop_token_ids: None,
            seed: Some(request.seed),
            logprobs: Some(true),
            top_logprobs: (request.top_logprobs > 0).then_some(request.top_logprobs as u32),
            stream: None,
        }
    }

    fn ask(&self, request: &JudgeRequest, deadline: Instant, limit_ms: u32) -> Result<Judgement, JudgeError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(JudgeError::Deadline { limit_ms });
        }
        let path = "/v1/chat/completions";
        let url = format!("{}{path}", self.url);
        let failed = |reason: String| JudgeError::Failed {
            reason: format!("{url}: {reason}"),
        };
        let post = self.agent.post(&url).timeout(left);
        let answer = match post_json(post, path, &self.body(request)) {
            Ok(answer) => answer,
            // Cut off by the deadline (the request's timeout is what was left of it).
            Err(Failure::Unreachable(_)) if Instant::now() >= deadline => {
                return Err(JudgeError::Deadline { limit_ms });
            }
            // The failure names the path; the reason names the server before it.
            Err(Failure::Unreachable(reason) | Failure::Bad(reason)) => {
                return Err(JudgeError::Failed {
                    reason: format!("{}{reason}", self.url),
                });
            }
        };
        let response: ChatResponse = parse(&answer).map_err(|e| failed(format!("not a chat completion: {e}")))?;
        if let Some(usage) = &response.usage
            && usage.prompt_tokens > self.max_prompt_tokens
        {
            return Err(JudgeError::PromptTooLong {
                tokens: usage.prompt_tokens.min(u32::MAX as usize) as u32,
                limit: self.max_prompt_tokens.min(u32::MAX as usize) as u32,
            });
        }
        let choice = (response.choices.into_iter().next()).ok_or_else(|| failed("no choice in the answer".into()))?;
        let tokens = (choice.logprobs.map(|l| l.content).unwrap_or_default().into_iter())
            .map(|t| JudgedToken {
                text: t.token,
                logprob: t.logprob,
                top: t.top_logprobs.into_iter().map(|a| (a.token, a.logprob)).collect(),
            })
            .collect();
        Ok(Judgement {
            text: choice.message.content.unwrap_or_default(),
            tokens,
            finished: choice.finish_reason.as_deref() == Some("stop"),
        })
    }
}

impl Judge for HttpJudge {
    fn judge(
        &mut self,
        requests: &[JudgeRequest],
        deadline: Instant,
        limit_ms: u32,
    ) -> Vec<Result<Judgement, JudgeError>> {
        let this = &*self;
        std::thread::scope(|scope| {
            let asks: Vec<_> = (requests.iter())
                .map(|request| scope.spawn(move || this.ask(request, deadline, limit_ms)))
                .collect();
            (asks.into_iter())
                .map(|ask| {
                    ask.join().unwrap_or_else(|_| {
                        Err(JudgeError::Failed {
                            reason: "the request's thread panicked".into(),
                        })
                    })
                })
                .collect()
        })
    }

    /// Unknown before asking: the server counts the prompt, and its answer is checked.
    fn prompt_tokens(&self, _request: &JudgeRequest) -> Result<usize, JudgeError> {
        Ok(0)
    }

    fn describe(&self) -> String {
        format!("http: {} ({})", self.url, self.model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use rein_core::Message;

    use crate::protocol::TopLogprob;

    fn request() -> JudgeRequest {
        JudgeRequest {
            messages: vec![Message::new("user", "Is 2 + 3 = 5?")],
            max_new_tokens: 4,
            temperature: 0.0,
            stop: vec!["\n".into()],
            top_logprobs: 2,
            seed: 9,
        }
    }

    #[test]
    fn a_request_becomes_one_seeded_chat_completion_with_logprobs() {
        let body = serde_json::to_value(HttpJudge::new("http://h:1/", "judge", 64).body(&request())).unwrap();
        let expected = serde_json::json!({
            "model": "judge",
            "messages": [{"role": "user", "content": "Is 2 + 3 = 5?"}],
            "max_tokens": 4, "temperature": 0.0, "n": 1, "stop": ["\n"], "seed": 9,
            "logprobs": true, "top_logprobs": 2,
        });
        assert_eq!(body, expected);
    }

    #[test]
    fn a_server_that_is_not_there_is_a_failure_naming_it_and_a_spent_deadline_asks_nothing() {
        // Port 9 (discard) on localhost: nothing listens there.
        let mut judge = HttpJudge::new("http://127.0.0.1:9", "judge", 64);
        let later = Instant::now() + Duration::from_secs(10);
        let answers = judge.judge(&[request()], later, 1000);
        match &answers[0] {
            Err(JudgeError::Failed { reason }) => assert!(reason.starts_with("http://127.0.0.1:9/v1/chat/completions")),
            other => panic!("expected a failure, got {other:?}"),
        }
        let answers = judge.judge(&[request()], Instant::now(), 1000);
        assert_eq!(answers[0], Err(JudgeError::Deadline { limit_ms: 1000 }));
    }

    #[test]
    fn openai_top_logprobs_entries_are_read() {
        let entry = serde_json::json!({"token": "Yes", "logprob": -0.25, "bytes": [89, 101, 115]});
        let read: TopLogprob = serde_json::from_value(entry).unwrap();
        assert_eq!((read.token.as_str(), read.logprob), ("Yes", -0.25));
        let no_bytes: TopLogprob =
            serde_json::from_value(serde_json::json!({"token": "Y", "logprob": -1.0, "bytes": null})).unwrap();
        assert_eq!(no_bytes.bytes, None);
        assert!(serde_json::from_value::<TopLogprob>(serde_json::json!({"token": "Yes"})).is_err());
    }
}
