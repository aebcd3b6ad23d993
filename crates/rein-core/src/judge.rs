//! Judges: a model a reward plugin may ask, through a capability the host grants.
//!
//! A reward plugin built for the `reward-with-judge` world imports one host function, `judge`.
//! The recipe names the judge model and its budget; the host runs each request on the model and
//! returns the text with its tokens' log-probabilities. Parsing the answer stays inside the
//! sandbox. This module holds the plain data of that exchange and the [`Judge`] trait a model
//! (in process, or behind a server) implements.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::text_env::Message;

/// One question for the judge: a conversation and how to sample its answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JudgeRequest {
    /// The conversation, rendered through the judge model's chat template.
    pub messages: Vec<Message>,
    /// Most tokens of the answer.
    pub max_new_tokens: usize,
    /// Softmax temperature; 0 is greedy.
    pub temperature: f32,
    /// The answer also ends once its text contains one of these.
    pub stop: Vec<String>,
    /// How many of the most likely tokens to return at each position of the answer (0 to 20).
    pub top_logprobs: usize,
    /// The seed of the answer's sampling stream ([`request_seed`]).
    pub seed: u64,
}

/// One token of an answer and what else the judge considered there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JudgedToken {
    /// The token's text.
    pub text: String,
    /// Its log-probability under the judge model (temperature 1).
    pub logprob: f32,
    /// The `top_logprobs` most likely tokens at this position, most likely first.
    pub top: Vec<(String, f32)>,
}

/// The judge's answer to one request.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Judgement {
    /// The answer's text.
    pub text: String,
    /// Its tokens, in order.
    pub tokens: Vec<JudgedToken>,
    /// The answer ended by itself (a stop token or stop string), not at `max_new_tokens`.
    pub finished: bool,
}

/// Why one request got no answer. Each names the limit involved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum JudgeError {
    /// This `score` call has used every request its groups allow.
    #[error("the judge's budget of {limit} requests for this call is used up")]
    RequestsExhausted {
        /// Requests allowed in the call (`max_requests_per_group` × groups).
        limit: u32,
    },
    /// The request asked for more new tokens than the grant allows.
    #[error("{asked} new tokens asked, the judge allows {limit} per request")]
    TooManyTokens {
        /// What was asked.
        asked: u32,
        /// `max_new_tokens` of the grant.
        limit: u32,
    },
    /// The rendered prompt is longer than the grant allows.
    #[error("the prompt is {tokens} tokens, the judge allows {limit}")]
    PromptTooLong {
        /// Its length.
        tokens: u32,
        /// `max_prompt_tokens` of the grant.
        limit: u32,
    },
    /// The judge's share of the call's deadline is spent.
    #[error("the judge's share of the call's deadline ({limit_ms} ms) is spent")]
    Deadline {
        /// The share, in milliseconds.
        limit_ms: u32,
    },
    /// The request is malformed (an empty conversation, a temperature out of range).
    #[error("invalid judge request: {reason}")]
    InvalidRequest {
        /// What is wrong.
        reason: String,
    },
    /// The judge model or its server failed.
    #[error("the judge failed: {reason}")]
    Failed {
        /// Why.
        reason: String,
    },
}

/// A model that answers judge requests.
pub trait Judge: Send {
    /// Answers `requests`, one result per request, in order. Generation past `deadline` stops,
    /// and the requests it cut short get [`JudgeError::Deadline`] with `limit_ms`.
    fn judge(
        &mut self,
        requests: &[JudgeRequest],
        deadline: Instant,
        limit_ms: u32,
    ) -> Vec<Result<Judgement, JudgeError>>;

    /// How many tokens `request`'s conversation is once rendered for the model.
    fn prompt_tokens(&self, request: &JudgeRequest) -> Result<usize, JudgeError>;

    /// What it is, for logs (`native: <model>`, `http: <url>`).
    fn describe(&self) -> String;
}

/// The seed of a request's answer: a hash of the run's judge seed and the request (its
/// conversation and sampling settings), so a run asked the same question again gets the same
/// answer, whatever else it asked before.
pub fn request_seed(seed: u64, messages: &[Message], max_new_tokens: usize, temperature: f32, stop: &[String]) -> u64 {
    // FNV-1a over the fields, each prefixed by its length, then SplitMix64's finaliser.
    let mut hash = 0xcbf2_9ce4_8422_2325_u64 ^ seed;
    let mut eat = |bytes: &[u8]| {
        for &b in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            hash = (hash ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    };
    for m in messages {
        eat(m.role.as_bytes());
        eat(m.content.as_bytes());
    }
    eat(&(max_new_tokens as u64).to_le_bytes());
    eat(&temperature.to_bits().to_le_bytes());
    for s in stop {
        eat(s.as_bytes());
    }
    let mut z = hash;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A judge that answers from a script, for plugin test cases and tests: the replies in order,
/// each one token carrying its whole text with probability 1, then [`JudgeError::Failed`]. A
/// prompt counts one token per byte of its messages' text. With a delay it sleeps that long
/// per batch, and answers past the deadline with [`JudgeError::Deadline`].
#[derive(Debug, Clone, Default)]
pub struct ScriptedJudge {
    replies: std::collections::VecDeque<String>,
    delay: std::time::Duration,
    /// Every request answered or refused so far, in order.
    pub asked: Vec<JudgeRequest>,
}

impl ScriptedJudge {
    /// A judge giving `replies` in order.
    pub fn new<S: Into<String>>(replies: impl IntoIterator<Item = S>) -> Self {
        Self {
            replies: replies.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// Sleeps `delay` per batch.
    pub fn with_delay(mut self, delay: std::time::Duration) -> Self {
        self.delay = delay;
        self
    }
}

impl Judge for ScriptedJudge {
    fn judge(
        &mut self,
        requests: &[JudgeRequest],
        deadline: Instant,
        limit_ms: u32,
    ) -> Vec<Result<Judgement, JudgeError>> {
        std::thread::sleep(self.delay);
        self.asked.extend_from_slice(requests);
        let late = Instant::now() > deadline;
        (requests.iter())
            .map(|_| {
                if late {
                    return Err(JudgeError::Deadline { limit_ms });
                }
                let text = self.replies.pop_front().ok_or_else(|| JudgeError::Failed {
                    reason: "the scripted judge has no reply left".into(),
                })?;
                let token = JudgedToken {
                    text: text.clone(),
                    logprob: 0.0,
                    top: vec![(text.clone(), 0.0)],
                };
                Ok(Judgement {
                    text,
                    tokens: vec![token],
                    finished: true,
                })
            })
            .collect()
    }

    fn prompt_tokens(&self, request: &JudgeRequest) -> Result<usize, JudgeError> {
        Ok(request.messages.iter().map(|m| m.content.len()).sum())
    }

    fn describe(&self) -> String {
        "scripted".into()
    }
}

/// The budget a recipe grants a reward plugin's judge (`[[reward]] judge = {…}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JudgeLimits {
    /// Requests per group of a `score` call (a call with 4 groups may ask 4 × this).
    pub max_requests_per_group: u32,
    /// New tokens per request: the default and the most a request may ask.
    pub max_new_tokens: u32,
    /// Tokens of a rendered prompt.
    pub max_prompt_tokens: u32,
    /// The temperature of requests that do not choose one (0: greedy).
    pub temperature: f32,
    /// The share of the plugin's `timeout_ms` the judge may spend in one `score` call.
    pub deadline_share: f64,
}

impl Default for JudgeLimits {
    fn default() -> Self {
        Self {
            max_requests_per_group: 16,
            max_new_tokens: 256,
            max_prompt_tokens: 2048,
            temperature: 0.0,
            deadline_share: 0.8,
        }
    }
}

impl JudgeLimits {
    /// Checks each limit's range, naming the key that is out of it.
    pub fn validate(&self) -> Result<(), crate::InvalidLimit> {
        let invalid = |key: &'static str, reason: String| Err(crate::InvalidLimit { key, reason });
        if self.max_requests_per_group == 0 {
            return invalid("max_requests_per_group", "must be at least 1".into());
        }
        if self.max_new_tokens == 0 {
            return invalid("max_new_tokens", "must be at least 1".into());
        }
        if self.max_prompt_tokens == 0 {
            return invalid("max_prompt_tokens", "must be at least 1".into());
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return invalid("temperature", format!("must be 0 or more, got {}", self.temperature));
        }
        if !(self.deadline_share > 0.0 && self.deadline_share <= 1.0) {
            return invalid(
                "deadline_share",
                format!("must be in (0, 1], got {}", self.deadline_share),
            );
        }
        Ok(())
    }
}

/// What a reward's judge did: requests answered, tokens generated, time spent and failures.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct JudgeUsage {
    /// Requests answered.
    pub calls: u64,
    /// Tokens of their answers.
    pub tokens: u64,
    /// Milliseconds spent answering.
    pub ms: f64,
    /// Requests that got an error (a limit, or the judge failing).
    pub failures: u64,
}

impl JudgeUsage {
    /// The sum of two usages.
    pub fn plus(self, other: JudgeUsage) -> JudgeUsage {
        JudgeUsage {
            calls: self.calls + other.calls,
            tokens: self.tokens + other.tokens,
            ms: self.ms + other.ms,
            failures: self.failures + other.failures,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(text: &str) -> Vec<Message> {
        vec![Message::new("user", text)]
    }

    #[test]
    fn a_request_seed_depends_on_the_run_seed_and_every_part_of_the_request() {
        let base = request_seed(7, &messages("2+2?"), 8, 0.0, &[]);
        assert_eq!(base, request_seed(7, &messages("2+2?"), 8, 0.0, &[]));
        let others = [
            request_seed(8, &messages("2+2?"), 8, 0.0, &[]),
            request_seed(7, &messages("2+3?"), 8, 0.0, &[]),
            request_seed(7, &[Message::new("system", "2+2?")], 8, 0.0, &[]),
            request_seed(7, &messages("2+2?"), 9, 0.0, &[]),
            request_seed(7, &messages("2+2?"), 8, 0.5, &[]),
            request_seed(7, &messages("2+2?"), 8, 0.0, &["\n".into()]),
        ];
        for other in others {
            assert_ne!(base, other);
        }
        // Field boundaries count: "ab" + "c" is not "a" + "bc".
        let split = |a: &str, b: &str| request_seed(0, &[Message::new(a, b)], 1, 0.0, &[]);
        assert_ne!(split("ab", "c"), split("a", "bc"));
    }

    #[test]
    fn limits_out_of_range_name_their_key() {
        assert!(JudgeLimits::default().validate().is_ok());
        let cases = [
            (
                JudgeLimits {
                    max_requests_per_group: 0,
                    ..Default::default()
                },
                "max_requests_per_group",
            ),
            (
                JudgeLimits {
                    max_new_tokens: 0,
                    ..Default::default()
                },
                "max_new_tokens",
            ),
            (
                JudgeLimits {
                    max_prompt_tokens: 0,
                    ..Default::default()
                },
                "max_prompt_tokens",
            ),
            (
                JudgeLimits {
                    temperature: -1.0,
                    ..Default::default()
                },
                "temperature",
            ),
            (
                JudgeLimits {
                    deadline_share: 0.0,
                    ..Default::default()
                },
                "deadline_share",
            ),
            (
                JudgeLimits {
                    deadline_share: 1.5,
                    ..Default::default()
                },
                "deadline_share",
            ),
        ];
        for (limits, key) in cases {
            assert_eq!(limits.validate().unwrap_err().key, key);
        }
    }
}
