//! Asking a judge model: what a reward plugin built for the `reward-with-judge` world may do.
//!
//! The recipe grants the judge (`[[reward]] judge = { model = "…" }`) and its budget; a plugin
//! that calls [`ask`] without the grant is refused when the run starts. Every request is
//! answered or gets a [`JudgeError`] naming the limit it hit, so a plugin decides itself what a
//! missing verdict scores. The reward is exported with [`crate::export_reward!`] as usual.
//!
//! ```ignore
//! let verdicts = rein_pdk::judge::ask(&[JudgeRequest::new(vec![Message::user(question)]).top_logprobs(5)]);
//! match &verdicts[0] {
//!     Ok(judgement) => judgement.probability(0, "Yes"),
//!     Err(error) => return Err(error.to_string()),
//! }
//! ```
//!
//! Native builds (the plugin's unit tests) have no host: [`ask`] answers from the replies given
//! to [`script`], in order.

use crate::message::{Message, to_wit};

/// One question for the judge.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JudgeRequest {
    /// The conversation; the host renders it through the judge model's chat template.
    pub messages: Vec<Message>,
    /// Most tokens of the answer (default and limit: the grant's `max_new_tokens`).
    pub max_new_tokens: Option<u32>,
    /// Softmax temperature, 0 for greedy (default: the grant's).
    pub temperature: Option<f32>,
    /// The answer also ends once its text contains one of these.
    pub stop: Vec<String>,
    /// How many of the most likely tokens to return at each position (at most 20).
    pub top_logprobs: u32,
}

impl JudgeRequest {
    /// A request with the grant's defaults.
    pub fn new(messages: Vec<Message>) -> Self {
        Self {
            messages,
            ..Self::default()
        }
    }

    /// Caps the answer at `n` tokens.
    pub fn max_new_tokens(mut self, n: u32) -> Self {
        self.max_new_tokens = Some(n);
        self
    }

    /// Samples at `temperature` (0: greedy).
    pub fn temperature(mut self, temperature: f32) -> Self {
        self.temperature = Some(temperature);
        self
    }

    /// Ends the answer at `stop`.
    pub fn stop(mut self, stop: impl Into<String>) -> Self {
        self.stop.push(stop.into());
        self
    }

    /// Returns the `n` most likely tokens at each position.
    pub fn top_logprobs(mut self, n: u32) -> Self {
        self.top_logprobs = n;
        self
    }
}

/// A token and its log-probability under the judge model.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token's text.
    pub text: String,
    /// Its log-probability (temperature 1).
    pub logprob: f32,
}

/// One token of an answer, with the most likely tokens at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct JudgedToken {
    /// The token.
    pub token: TokenLogprob,
    /// The `top_logprobs` most likely tokens here, most likely first.
    pub top: Vec<TokenLogprob>,
}

/// The judge's answer.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Judgement {
    /// Its text.
    pub text: String,
    /// Its tokens.
    pub tokens: Vec<JudgedToken>,
    /// It ended by itself, not at `max_new_tokens`.
    pub finished: bool,
}

impl Judgement {
    /// The probability the judge gave `word` at token `position`: the sum over the position's
    /// top tokens whose text, trimmed, equals `word` ignoring case (" Yes" and "yes" both count
    /// for "Yes"). 0 when none of them does (ask for more `top_logprobs`).
    pub fn probability(&self, position: usize, word: &str) -> f64 {
        let Some(token) = self.tokens.get(position) else {
            return 0.0;
        };
        (token.top.iter())
            .filter(|t| t.text.trim().eq_ignore_ascii_case(word))
            .map(|t| (t.logprob as f64).exp())
            .sum()
    }
}

/// Why a request got no answer.
#[derive(Debug, Clone, PartialEq)]
pub enum JudgeError {
    /// This `score` call used every request the grant allows it (the limit).
    RequestsExhausted(u32),
    /// More new tokens asked than the grant allows per request (the limit).
    TooManyTokens(u32),
    /// The rendered prompt is longer than the grant allows (the limit, in tokens).
    PromptTooLong(u32),
    /// The judge's share of the call's deadline is spent (the share, in ms).
    Deadline(u32),
    /// The request is malformed.
    InvalidRequest(String),
    /// The judge model or its server failed.
    Failed(String),
}

impl std::fmt::Display for JudgeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JudgeError::RequestsExhausted(n) => {
                write!(f, "the judge's budget of {n} requests for this call is used up")
            }
            JudgeError::TooManyTokens(n) => write!(f, "the judge allows {n} new tokens per request (`max_new_tokens`)"),
            JudgeError::PromptTooLong(n) => write!(f, "the judge allows prompts of {n} tokens (`max_prompt_tokens`)"),
            JudgeError::Deadline(ms) => write!(f, "the judge's share of the call's deadline ({ms} ms) is spent"),
            JudgeError::InvalidRequest(reason) => write!(f, "invalid judge request: {reason}"),
            JudgeError::Failed(reason) => write!(f, "the judge failed: {reason}"),
        }
    }
}

impl std::error::Error for JudgeError {}

/// Asks the judge every request at once (the host batches them); one result per request.
pub fn ask(requests: &[JudgeRequest]) -> Vec<Result<Judgement, JudgeError>> {
    #[cfg(target_arch = "wasm32")]
    {
        use crate::__private::judge_import::rein::plugin::judge as wit;
        let wit_requests: Vec<wit::JudgeRequest> = (requests.iter())
            .map(|r| wit::JudgeRequest {
                messages: to_wit(r.messages.clone()),
                max_new_tokens: r.max_new_tokens,
                temperature: r.temperature,
                stop: r.stop.clone(),
                top_logprobs: r.top_logprobs,
            })
            .collect();
        (wit::judge(&wit_requests).into_iter())
            .map(|answer| answer.map(from_wit).map_err(error_from_wit))
            .collect()
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        let _ = to_wit;
        scripted::answer(requests)
    }
}

#[cfg(target_arch = "wasm32")]
fn from_wit(j: crate::__private::judge_import::rein::plugin::judge::Judgement) -> Judgement {
    let token = |t: crate::__private::judge_import::rein::plugin::judge::TokenLogprob| TokenLogprob {
        text: t.text,
        logprob: t.logprob,
    };
    Judgement {
        text: j.text,
        tokens: (j.tokens.into_iter())
            .map(|t| JudgedToken {
                token: token(t.token),
                top: t.top.into_iter().map(token).collect(),
            })
            .collect(),
        finished: j.finished,
    }
}

#[cfg(target_arch = "wasm32")]
fn error_from_wit(e: crate::__private::judge_import::rein::plugin::judge::JudgeError) -> JudgeError {
    use crate::__private::judge_import::rein::plugin::judge::JudgeError as Wit;
    match e {
        Wit::RequestsExhausted(n) => JudgeError::RequestsExhausted(n),
        Wit::TooManyTokens(n) => JudgeError::TooManyTokens(n),
        Wit::PromptTooLong(n) => JudgeError::PromptTooLong(n),
        Wit::Deadline(ms) => JudgeError::Deadline(ms),
        Wit::InvalidRequest(reason) => JudgeError::InvalidRequest(reason),
        Wit::Failed(reason) => JudgeError::Failed(reason),
    }
}

/// Replies [`ask`] gives in native builds, in order: a plugin's unit tests script its judge.
/// Each reply is one token carrying its whole text, with probability 1.
pub fn script<S: Into<String>>(replies: impl IntoIterator<Item = S>) {
    scripted::set(replies.into_iter().map(Into::into).collect());
}

mod scripted {
    use std::cell::RefCell;
    use std::collections::VecDeque;

    use super::{JudgeError, JudgeRequest, JudgedToken, Judgement, TokenLogprob};

    thread_local! {
        static REPLIES: RefCell<VecDeque<String>> = const { RefCell::new(VecDeque::new()) };
    }

    pub(super) fn set(replies: Vec<String>) {
        REPLIES.with(|r| *r.borrow_mut() = replies.into());
    }

    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub(super) fn answer(requests: &[JudgeRequest]) -> Vec<Result<Judgement, JudgeError>> {
        REPLIES.with(|r| {
            let mut replies = r.borrow_mut();
            (requests.iter())
                .map(|_| match replies.pop_front() {
                    Some(text) => {
                        let token = TokenLogprob {
                            text: text.clone(),
                            logprob: 0.0,
                        };
                        Ok(Judgement {
                            tokens: vec![JudgedToken {
                                top: vec![token.clone()],
                                token,
                            }],
                            text,
                            finished: true,
                        })
                    }
                    None => Err(JudgeError::Failed(
                        "no scripted reply left (rein_pdk::judge::script)".into(),
                    )),
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripted_replies_come_in_order_then_fail() {
        script(["Yes", "No"]);
        let request = JudgeRequest::new(vec![Message::user("2+2=4?")]);
        let answers = ask(&[request.clone(), request.clone(), request]);
        assert_eq!(answers[0].as_ref().unwrap().text, "Yes");
        assert_eq!(answers[1].as_ref().unwrap().text, "No");
        assert!(matches!(answers[2], Err(JudgeError::Failed(_))));
    }

    #[test]
    fn the_probability_of_a_word_sums_its_spellings_among_the_top_tokens() {
        let t = |text: &str, p: f64| TokenLogprob {
            text: text.into(),
            logprob: p.ln() as f32,
        };
        let judgement = Judgement {
            text: "Yes".into(),
            tokens: vec![JudgedToken {
                token: t("Yes", 0.5),
                top: vec![t("Yes", 0.5), t(" yes", 0.2), t("No", 0.3)],
            }],
            finished: true,
        };
        assert!((judgement.probability(0, "Yes") - 0.7).abs() < 1e-6);
        assert!((judgement.probability(0, "no") - 0.3).abs() < 1e-6);
        assert_eq!(judgement.probability(1, "Yes"), 0.0);
    }
}
