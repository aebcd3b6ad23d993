//! The `judge` import: a judge model a recipe grants a reward plugin, within a budget.
//!
//! The grant ([`JudgeGrant`]) travels with a [`crate::RewardPlugin`] into every store it
//! creates. Each `score` call opens a budget: `max_requests_per_group` × its groups requests,
//! and `deadline_share` of its `timeout_ms` of judge time. The host checks each request against
//! the grant (requests left, new tokens, prompt tokens, time) before the model sees it, so a
//! request over a limit costs nothing and gets the `judge-error` naming that limit; the others
//! are answered in one batch. Each request's sampling seed is [`rein_core::request_seed`] of
//! the grant's seed and the request.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rein_core::{Judge, JudgeError, JudgeLimits, JudgeRequest, JudgeUsage, Judgement, Message, request_seed};

use crate::bindings::judge::rein::plugin::judge as wit;

/// The interface a plugin imports to ask the judge (without its version).
pub const JUDGE_IMPORT: &str = "rein:plugin/judge";

/// The most alternatives a request may ask for at each position.
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// A judge model granted to a reward plugin, with its budget.
#[derive(Clone)]
pub struct JudgeGrant {
    judge: Arc<Mutex<dyn Judge>>,
    limits: JudgeLimits,
    seed: u64,
}

impl std::fmt::Debug for JudgeGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JudgeGrant")
            .field("limits", &self.limits)
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

impl JudgeGrant {
    /// Grants `judge` under `limits`; `seed` (the run's) seeds every request's answer.
    pub fn new(judge: Arc<Mutex<dyn Judge>>, limits: JudgeLimits, seed: u64) -> Self {
        Self { judge, limits, seed }
    }

    /// The budget.
    pub fn limits(&self) -> &JudgeLimits {
        &self.limits
    }
}

/// One store's judge: the grant, the current call's budget, and what it has used.
#[derive(Default)]
pub(crate) struct JudgeSlot {
    grant: Option<JudgeGrant>,
    /// Requests the current call may still make, and its limit.
    requests_left: u32,
    request_limit: u32,
    /// Judge time the current call may still spend, and its share of the deadline.
    time_left: Duration,
    share: Duration,
    usage: JudgeUsage,
}

impl JudgeSlot {
    pub(crate) fn grant(&mut self, grant: Option<JudgeGrant>) {
        self.grant = grant;
    }

    /// Opens the budget of a `score` call over `groups` groups under `timeout`.
    pub(crate) fn begin_call(&mut self, groups: usize, timeout: Duration) {
        let Some(grant) = &self.grant else { return };
        let limit = (grant.limits.max_requests_per_group as u64 * groups as u64).min(u32::MAX as u64) as u32;
        self.requests_left = limit;
        self.request_limit = limit;
        self.share = timeout.mul_f64(grant.limits.deadline_share);
        self.time_left = self.share;
    }

    /// What the judge did since the last time this was asked.
    pub(crate) fn take_usage(&mut self) -> JudgeUsage {
        std::mem::take(&mut self.usage)
    }

    /// The `judge` import: each request checked against the grant, the admitted ones asked in
    /// one batch, every answer in the WIT's types.
    pub(crate) fn answer(&mut self, requests: Vec<wit::JudgeRequest>) -> Vec<Result<wit::Judgement, wit::JudgeError>> {
        let answers = self.ask(requests);
        answers
            .into_iter()
            .map(|a| a.map(to_wit).map_err(error_to_wit))
            .collect()
    }

    fn ask(&mut self, requests: Vec<wit::JudgeRequest>) -> Vec<Result<Judgement, JudgeError>> {
        let Some(grant) = self.grant.clone() else {
            // Unreachable in practice: a plugin importing `judge` without a grant is refused
            // before it runs.
            let failed = JudgeError::Failed {
                reason: "no judge is granted to this plugin".into(),
            };
            return requests.iter().map(|_| Err(failed.clone())).collect();
        };
        let mut judge = grant.judge.lock().unwrap_or_else(|e| e.into_inner());
        let share_ms = self.share.as_millis().min(u32::MAX as u128) as u32;
        let mut answers: Vec<Option<Result<Judgement, JudgeError>>> = Vec::with_capacity(requests.len());
        let mut admitted = Vec::new();
        let mut positions = Vec::new();
        for (i, request) in requests.into_iter().enumerate() {
            let checked = self.admit(&grant, &*judge, request, share_ms);
            match checked {
                Ok(request) => {
                    admitted.push(request);
                    positions.push(i);
                    answers.push(None);
                }
                Err(error) => answers.push(Some(Err(error))),
            }
        }
        if !admitted.is_empty() {
            let started = Instant::now();
            let deadline = started + self.time_left;
            let mut results = judge.judge(&admitted, deadline, share_ms);
            let spent = started.elapsed();
            self.time_left = self.time_left.saturating_sub(spent);
            self.usage.ms += spent.as_secs_f64() * 1e3;
            results.resize_with(admitted.len(), || {
                Err(JudgeError::Failed {
                    reason: "the judge returned fewer answers than requests".into(),
                })
            });
            for (position, result) in positions.into_iter().zip(results) {
                answers[position] = Some(result);
            }
        }
        let answers: Vec<_> = answers
            .into_iter()
            .map(|a| a.expect("every request answered"))
            .collect();
        for answer in &answers {
            match answer {
                Ok(judgement) => {
                    self.usage.calls += 1;
                    self.usage.tokens += judgement.tokens.len() as u64;
                }
                Err(_) => self.usage.failures += 1,
            }
        }
        answers
    }

    /// Checks `request` against the grant and the call's budget, and fills in its defaults.
    fn admit(
        &mut self,
        grant: &JudgeGrant,
        judge: &dyn Judge,
        request: wit::JudgeRequest,
        share_ms: u32,
    ) -> Result<JudgeRequest, JudgeError> {
        let limits = &grant.limits;
        let invalid = |reason: String| Err(JudgeError::InvalidRequest { reason });
        if request.messages.is_empty() {
            return invalid("no messages".into());
        }
        if request.top_logprobs > MAX_TOP_LOGPROBS {
            return invalid(format!(
                "top-logprobs is {}, at most {MAX_TOP_LOGPROBS}",
                request.top_logprobs
            ));
        }
        let temperature = request.temperature.unwrap_or(limits.temperature);
        if !(temperature.is_finite() && temperature >= 0.0) {
            return invalid(format!("temperature must be 0 or more, got {temperature}"));
        }
        let max_new_tokens = request.max_new_tokens.unwrap_or(limits.max_new_tokens);
        if max_new_tokens > limits.max_new_tokens {
            return Err(JudgeError::TooManyTokens {
                asked: max_new_tokens,
                limit: limits.max_new_tokens,
            });
        }
        if self.requests_left == 0 {
            return Err(JudgeError::RequestsExhausted {
                limit: self.request_limit,
            });
        }
        if self.time_left.is_zero() {
            return Err(JudgeError::Deadline { limit_ms: share_ms });
        }
        let messages: Vec<Message> = (request.messages.into_iter())
            .map(|m| Message {
                role: m.role,
                content: m.content,
            })
            .collect();
        let seed = request_seed(
            grant.seed,
            &messages,
            max_new_tokens as usize,
            temperature,
            &request.stop,
        );
        let request = JudgeRequest {
            messages,
            max_new_tokens: max_new_tokens as usize,
            temperature,
            stop: request.stop,
            top_logprobs: request.top_logprobs as usize,
            seed,
        };
        let tokens = judge.prompt_tokens(&request)?;
        if tokens > limits.max_prompt_tokens as usize {
            return Err(JudgeError::PromptTooLong {
                tokens: tokens.min(u32::MAX as usize) as u32,
                limit: limits.max_prompt_tokens,
            });
        }
        self.requests_left -= 1;
        Ok(request)
    }
}

fn to_wit(judgement: Judgement) -> wit::Judgement {
    let token = |text: String, logprob: f32| wit::TokenLogprob { text, logprob };
    wit::Judgement {
        text: judgement.text,
        tokens: (judgement.tokens.into_iter())
            .map(|t| wit::JudgedToken {
                token: token(t.text, t.logprob),
                top: t.top.into_iter().map(|(text, logprob)| token(text, logprob)).collect(),
            })
            .collect(),
        finished: judgement.finished,
    }
}

fn error_to_wit(error: JudgeError) -> wit::JudgeError {
    match error {
        JudgeError::RequestsExhausted { limit } => wit::JudgeError::RequestsExhausted(limit),
        JudgeError::TooManyTokens { limit, .. } => wit::JudgeError::TooManyTokens(limit),
        JudgeError::PromptTooLong { limit, .. } => wit::JudgeError::PromptTooLong(limit),
        JudgeError::Deadline { limit_ms } => wit::JudgeError::Deadline(limit_ms),
        JudgeError::InvalidRequest { reason } => wit::JudgeError::InvalidRequest(reason),
        JudgeError::Failed { reason } => wit::JudgeError::Failed(reason),
    }
}
