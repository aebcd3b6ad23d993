//! The wire format between rein and inference servers, as typed serde structs that both sides
//! use: the client ([`crate::HttpGenerator`]) and `rein serve`. It covers SGLang's native
//! `/generate` and `/update_weights_from_disk`, OpenAI's `/v1/completions` and
//! `/v1/chat/completions` with vLLM's token-id extensions (`return_token_ids`, `stop_reason`),
//! vLLM's LoRA adapter endpoints, the classification API of vLLM and SGLang (`/classify`), and
//! vLLM's pooling API for token classifiers (`/pooling`).
//!
//! Field names are the servers' own. What a server may leave out is an `Option`. Keys rein does
//! not use are ignored on input, since servers add keys between versions. Fixtures under
//! `tests/fixtures/protocol/` hold payloads taken from SGLang's and vLLM's documentation and
//! tests; the client parses their responses and the server their requests.

use std::collections::BTreeMap;

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

mod chat;
mod classify;
mod pooling;

pub use chat::{
    ChatChoice, ChatLogprobs, ChatRequest, ChatRequestMessage, ChatResponse, ChatResponseMessage, ContentPart,
    ImageUrl, MessageContent, TokenLogprob, TopLogprob,
};
pub use classify::{ClassifyData, ClassifyRequest, ClassifyResponse};
pub use pooling::{PoolingData, PoolingRequest, PoolingResponse};

/// Parses a JSON body into `T`. The error names the field that did not fit
/// (`sampling_params.temperature: invalid type: string "hot", expected f32`).
pub fn parse<T: DeserializeOwned>(body: &str) -> Result<T, String> {
    let mut de = serde_json::Deserializer::from_str(body);
    serde_path_to_error::deserialize(&mut de).map_err(|e| match e.path().to_string().as_str() {
        "." => e.inner().to_string(),
        path => format!("{path}: {}", e.inner()),
    })
}

/// Prompts as a request gives them: text, token ids, or a list of either. A request with a
/// list of prompts is a batch.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Prompts {
    /// One prompt's token ids.
    Ids(Vec<u32>),
    /// One prompt's text.
    Text(String),
    /// Several prompts.
    Batch(Vec<Prompt>),
}

/// One prompt of a batch.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Its token ids.
    Ids(Vec<u32>),
    /// Its text.
    Text(String),
}

fn token_ids(items: &[Value]) -> Option<Vec<u32>> {
    (items.iter())
        .map(|v| v.as_u64().and_then(|x| u32::try_from(x).ok()))
        .collect()
}

impl<'de> Deserialize<'de> for Prompts {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let shape = || D::Error::custom("must be text, token ids, or a list of them");
        match Value::deserialize(deserializer)? {
            Value::String(text) => Ok(Self::Text(text)),
            Value::Array(items) if items.first().is_some_and(Value::is_number) => token_ids(&items)
                .map(Self::Ids)
                .ok_or_else(|| D::Error::custom("holds something other than token ids")),
            Value::Array(items) => (items.into_iter())
                .map(|item| match item {
                    Value::String(text) => Some(Prompt::Text(text)),
                    Value::Array(ids) => token_ids(&ids).map(Prompt::Ids),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
                .map(Self::Batch)
                .ok_or_else(shape),
            _ => Err(shape()),
        }
    }
}

impl Prompts {
    /// Whether the request gave a list of prompts (its answer is then a list too).
    pub fn is_batch(&self) -> bool {
        matches!(self, Self::Batch(_))
    }
}

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings.
    pub fn strings(&self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s.clone()],
            Self::Many(list) => list.clone(),
        }
    }
}

/// The sampling settings every generation request carries, under each API's own names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    /// Most new tokens (SGLang's `max_new_tokens`, OpenAI's `max_tokens`).
    pub max_new_tokens: Option<u64>,
    /// OpenAI's newer name for the same limit.
    pub max_completion_tokens: Option<u64>,
    /// Softmax temperature (0: greedy).
    pub temperature: Option<f32>,
    /// Top-k (≤ 0: none, as SGLang's and vLLM's −1).
    pub top_k: Option<i64>,
    /// Nucleus threshold.
    pub top_p: Option<f32>,
    /// Min-p threshold.
    pub min_p: Option<f32>,
    /// Samples per prompt.
    pub n: Option<u64>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// Token ids that end a sample (besides the model's end-of-sequence ids).
    pub stop_token_ids: Option<Vec<u32>>,
    /// The sampling seed (SGLang's `sampling_seed`, OpenAI's `seed`).
    pub seed: Option<u64>,
}

// ---------------------------------------------------------------------------------------------
// SGLang

/// SGLang's `POST /generate` request (`GenerateReqInput`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    /// Prompts as token ids (one list, or a list of lists for a batch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_ids: Option<Prompts>,
    /// Prompts as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<Prompts>,
    /// The sampling settings (SGLang also takes one per prompt; rein serve does not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_params: Option<SamplingParamsField>,
    /// Return `meta_info.output_token_logprobs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_logprob: Option<bool>,
    /// From which prompt position log-probabilities are returned (−1: output tokens only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_start_len: Option<i64>,
    /// Streaming (rein serve refuses it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
}

/// `sampling_params`: one set for every prompt, or one per prompt.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum SamplingParamsField {
    /// The same settings for every prompt.
    One(SamplingParams),
    /// One per prompt.
    PerPrompt(Vec<SamplingParams>),
}

impl<'de> Deserialize<'de> for SamplingParamsField {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Parsed from a `Value` with the inner field's path kept: `temperature: invalid type …`.
        fn inner<T: DeserializeOwned, E: serde::de::Error>(value: Value) -> Result<T, E> {
            serde_path_to_error::deserialize(value).map_err(|e| E::custom(format!("{}: {}", e.path(), e.inner())))
        }
        match Value::deserialize(deserializer)? {
            Value::Array(items) => inner(Value::Array(items)).map(Self::PerPrompt),
            value => inner(value).map(Self::One),
        }
    }
}

/// SGLang's `SamplingParams`, the fields rein reads or sends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Most new tokens (SGLang's default 128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<u64>,
    /// Softmax temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Top-k (−1: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    /// Nucleus threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Min-p threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    /// Samples per prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u64>,
    /// Stop strings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    /// Stop token ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_token_ids: Option<Vec<u32>>,
    /// The seed (SGLang honours it with `--enable-deterministic-inference`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_seed: Option<u64>,
    /// Drop special tokens from `text` (SGLang's default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_special_tokens: Option<bool>,
    /// Keep the matched stop string in `text` (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_stop_trim: Option<bool>,
}

impl SamplingParams {
    /// The settings under the common names.
    pub fn sampling(&self) -> Sampling {
        Sampling {
            max_new_tokens: self.max_new_tokens,
            max_completion_tokens: None,
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            n: self.n,
            stop: self.stop.clone(),
            stop_token_ids: self.stop_token_ids.clone(),
            seed: self.sampling_seed,
        }
    }
}

/// SGLang's `/generate` answer: one object per sample, a list for a batch or `n` > 1
/// (prompt-major: element `i·n + j` is sample `j` of prompt `i`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GenerateResponse {
    /// A single prompt's single sample.
    One(GenerateOutput),
    /// Several.
    Many(Vec<GenerateOutput>),
}

impl GenerateResponse {
    /// The samples, in order.
    pub fn outputs(self) -> Vec<GenerateOutput> {
        match self {
            Self::One(output) => vec![output],
            Self::Many(outputs) => outputs,
        }
    }
}

/// One sample of a `/generate` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateOutput {
    /// The decoded sample (absent with `--skip-tokenizer-init`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Its token ids, the matched stop token included.
    pub output_ids: Vec<u32>,
    /// Everything else about it.
    pub meta_info: MetaInfo,
}

/// `meta_info` of a sample: the keys rein reads (SGLang sends more).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetaInfo {
    /// The request id.
    pub id: String,
    /// Why the sample ended (`null` while streaming).
    pub finish_reason: Option<SglangFinish>,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Sample length in tokens.
    pub completion_tokens: usize,
    /// The weights' version tag (`"default"` until an update names one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_version: Option<String>,
    /// `[logprob, token id, text]` per output token, with `return_logprob`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_token_logprobs: Option<Vec<LogprobEntry>>,
}

/// One token's `[logprob, token id, text]` (the text is `null` unless asked for).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogprobEntry(pub Option<f32>, pub u32, pub Option<String>);

/// SGLang's `finish_reason`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum SglangFinish {
    /// A stop token (`matched` its id) or a stop string (`matched` the string).
    Stop {
        /// What matched.
        #[serde(default)]
        matched: Option<Matched>,
    },
    /// The token limit.
    Length {
        /// The limit.
        length: usize,
    },
    /// The server gave up on the request.
    Abort {
        /// Why.
        #[serde(default)]
        message: Option<String>,
    },
}

/// What stopped a sample: a token id or a stop string.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Matched {
    /// A stop token.
    Token(u32),
    /// A stop string.
    Text(String),
}

/// SGLang's `POST /update_weights_from_disk` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpdateWeightsRequest {
    /// The checkpoint (or, for rein serve, LoRA adapter) directory.
    pub model_path: String,
    /// The version tag the server reports from now on (a string; rein serve also takes a
    /// number).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "string_or_number"
    )]
    pub weight_version: Option<String>,
}

fn string_or_number<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    match Value::deserialize(deserializer)? {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s)),
        Value::Number(n) => Ok(Some(n.to_string())),
        _ => Err(D::Error::custom("must be a string")),
    }
}

/// SGLang's answer to `/update_weights_from_disk` (HTTP 200 on success, 400 otherwise).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpdateWeightsResponse {
    /// Whether the weights were loaded.
    pub success: bool,
    /// What happened.
    #[serde(default)]
    pub message: String,
    /// Requests paused during the update (newer SGLang builds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_paused_requests: Option<u64>,
    /// The version now served (rein serve).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_version: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// OpenAI (and vLLM's extensions)

/// OpenAI's `POST /v1/completions` request, with vLLM's extensions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionRequest {
    /// The model (or LoRA adapter) name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The prompts.
    pub prompt: Prompts,
    /// Most new tokens (OpenAI's default 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// The newer name for `max_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u64>,
    /// Softmax temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Top-k (vLLM; 0 or −1: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    /// Nucleus threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Min-p threshold (vLLM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    /// Samples per prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u64>,
    /// Stop strings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    /// Stop token ids (vLLM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_token_ids: Option<Vec<u32>>,
    /// The seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Return log-probabilities, with this many of the most likely tokens at each position
    /// (0: only the sampled token's; at most 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
    /// Return `choices[].token_ids` and `prompt_token_ids` (vLLM ≥ 0.10.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_token_ids: Option<bool>,
    /// Drop special tokens from `text` (vLLM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_special_tokens: Option<bool>,
    /// Keep the matched stop string in `text` (vLLM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_stop_str_in_output: Option<bool>,
    /// Prepend the prompt to `text` (and its tokens, scored, to `logprobs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo: Option<bool>,
    /// Streaming (rein serve refuses it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
}

impl CompletionRequest {
    /// The settings under the common names.
    pub fn sampling(&self) -> Sampling {
        Sampling {
            max_new_tokens: self.max_tokens,
            max_completion_tokens: self.max_completion_tokens,
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            n: self.n,
            stop: self.stop.clone(),
            stop_token_ids: self.stop_token_ids.clone(),
            seed: self.seed,
        }
    }
}

/// OpenAI's completion object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionResponse {
    /// The request id.
    pub id: String,
    /// `"text_completion"`.
    pub object: String,
    /// Unix time.
    pub created: u64,
    /// The model name.
    pub model: String,
    /// The weights' identity (rein serve: `rein-weights-<version>`).
    #[serde(default)]
    pub system_fingerprint: Option<String>,
    /// One per sample, prompt-major (`index = prompt · n + sample`).
    pub choices: Vec<CompletionChoice>,
    /// Token counts.
    #[serde(default)]
    pub usage: Option<Usage>,
}

/// One sample of a completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    /// Its place in `choices`.
    pub index: usize,
    /// The decoded sample.
    pub text: String,
    /// Its tokens' log-probabilities, when asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// `"stop"` or `"length"` (`null` while streaming).
    pub finish_reason: Option<String>,
    /// vLLM: the stop token id or stop string that ended it; `null` for end of sequence or
    /// the length limit.
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
    /// vLLM: the sample's token ids (the stop token included), with `return_token_ids`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// vLLM: the prompt's token ids, with `return_token_ids`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// vLLM's `stop_reason`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StopReason {
    /// A stop token id.
    Token(u32),
    /// A stop string.
    Text(String),
}

/// OpenAI's legacy log-probabilities of a completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's log-probability (`null` for an echoed first prompt token).
    pub token_logprobs: Vec<Option<f32>>,
    /// The top alternatives per token, by text.
    #[serde(default)]
    pub top_logprobs: Option<Vec<Option<BTreeMap<String, f32>>>>,
    /// Each token's byte offset in `text`.
    #[serde(default)]
    pub text_offset: Vec<usize>,
}

/// Token counts of an answer (summed over its prompts).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Both.
    pub total_tokens: usize,
}

/// vLLM's `POST /v1/load_lora_adapter` request (its answer is plain text).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadLoraRequest {
    /// The adapter's name (what requests' `model` names).
    pub lora_name: String,
    /// Its directory (PEFT format).
    pub lora_path: String,
}

/// vLLM's `POST /v1/unload_lora_adapter` request (its answer is plain text).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnloadLoraRequest {
    /// The adapter's name.
    pub lora_name: String,
}

/// An error answer: `{"error": {"message", "type", "code"}}` (OpenAI's and vLLM's form, which
/// rein serve also sends for SGLang's endpoints).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorResponse {
    /// The error.
    pub error: ErrorBody,
}

/// The body of an [`ErrorResponse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub message: String,
    /// Its kind (`invalid_request_error`).
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    /// The HTTP status.
    #[serde(default)]
    pub code: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_take_every_shape_and_name_the_wrong_one() {
        let ids: Prompts = serde_json::from_str("[1, 2]").unwrap();
        assert_eq!(ids, Prompts::Ids(vec![1, 2]));
        let batch: Prompts = serde_json::from_str(r#"[[1], "two"]"#).unwrap();
        assert_eq!(
            batch,
            Prompts::Batch(vec![Prompt::Ids(vec![1]), Prompt::Text("two".into())])
        );
        assert!(batch.is_batch());
        let err = parse::<CompletionRequest>(r#"{"prompt": [1, -2]}"#).unwrap_err();
        assert!(err.starts_with("prompt: holds something other than token ids"), "{err}");
        let err = parse::<CompletionRequest>(r#"{"prompt": 3}"#).unwrap_err();
        assert!(err.starts_with("prompt: must be text, token ids"), "{err}");
    }

    #[test]
    fn a_wrong_field_is_named_with_its_path() {
        let err =
            parse::<GenerateRequest>(r#"{"input_ids": [1], "sampling_params": {"temperature": "hot"}}"#).unwrap_err();
        assert!(
            err.starts_with("sampling_params: temperature: invalid type: string"),
            "{err}"
        );
        let err = parse::<CompletionRequest>(r#"{"prompt": "x", "n": -1}"#).unwrap_err();
        assert!(err.starts_with("n: invalid value"), "{err}");
        let err = parse::<UpdateWeightsRequest>("{}").unwrap_err();
        assert!(err.contains("missing field `model_path`"), "{err}");
    }

    #[test]
    fn sglang_finish_reasons_read_as_sglang_writes_them() {
        let read = |s: &str| serde_json::from_str::<SglangFinish>(s).unwrap();
        assert_eq!(
            read(r#"{"type": "stop", "matched": 128009}"#),
            SglangFinish::Stop {
                matched: Some(Matched::Token(128009))
            }
        );
        assert_eq!(
            read(r#"{"type": "stop", "matched": "\n"}"#),
            SglangFinish::Stop {
                matched: Some(Matched::Text("\n".into()))
            }
        );
        assert_eq!(
            read(r#"{"type": "length", "length": 32}"#),
            SglangFinish::Length { length: 32 }
        );
        let abort = r#"{"type": "abort", "message": "timeout", "status_code": 503, "err_type": null}"#;
        assert!(matches!(read(abort), SglangFinish::Abort { message: Some(m) } if m == "timeout"));
    }
}
