//! OpenAI's `POST /v1/chat/completions`: the request (with the sampling keys rein reads), the
//! answer and its per-token log-probabilities.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Sampling, Stop, Usage};

/// OpenAI's `POST /v1/chat/completions` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The model name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The conversation.
    pub messages: Vec<ChatRequestMessage>,
    /// Tools the model may call, as JSON schemas (passed to the chat template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Value>>,
    /// Most new tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// The newer name for `max_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u64>,
    /// Softmax temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Top-k (vLLM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    /// Nucleus threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Min-p threshold (vLLM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    /// Samples.
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
    /// Return the sampled tokens' log-probabilities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<bool>,
    /// How many of the most likely tokens to return at each position (0–20; needs `logprobs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u32>,
    /// Streaming (rein serve refuses it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
}

impl ChatRequest {
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

/// One message of a chat request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequestMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Its text, or a list of parts whose `text` entries are joined.
    #[serde(default)]
    pub content: Option<MessageContent>,
}

/// A message's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts (only text parts carry text).
    Parts(Vec<ContentPart>),
}

/// One content part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentPart {
    /// `text`, `image_url`, or another kind.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The part's text (absent for images and other kinds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// An image part's image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_url: Option<ImageUrl>,
}

/// An image part's image: a `data:` URL, or a URL the server may read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageUrl {
    /// The URL.
    pub url: String,
}

impl MessageContent {
    /// The text of the message.
    pub fn text(&self) -> String {
        match self {
            Self::Text(text) => text.clone(),
            Self::Parts(parts) => parts.iter().filter_map(|p| p.text.as_deref()).collect(),
        }
    }

    /// The URLs of its image parts, in order.
    pub fn image_urls(&self) -> Vec<&str> {
        match self {
            Self::Text(_) => Vec::new(),
            Self::Parts(parts) => (parts.iter())
                .filter_map(|p| p.image_url.as_ref().map(|i| i.url.as_str()))
                .collect(),
        }
    }
}

/// OpenAI's chat completion object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// The request id.
    pub id: String,
    /// `"chat.completion"`.
    pub object: String,
    /// Unix time.
    pub created: u64,
    /// The model name.
    pub model: String,
    /// The weights' identity.
    #[serde(default)]
    pub system_fingerprint: Option<String>,
    /// One per sample.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    #[serde(default)]
    pub usage: Option<Usage>,
}

/// One sample of a chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    /// Its place in `choices`.
    pub index: usize,
    /// The assistant's message.
    pub message: ChatResponseMessage,
    /// Its tokens' log-probabilities, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `"stop"` or `"length"`.
    pub finish_reason: Option<String>,
}

/// The assistant's message in a chat answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatResponseMessage {
    /// `"assistant"`.
    pub role: String,
    /// Its text.
    pub content: Option<String>,
}

/// A chat sample's log-probabilities.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatLogprobs {
    /// One entry per token.
    pub content: Vec<TokenLogprob>,
}

/// One token of a chat sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// Its text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely tokens at its position (as many as `top_logprobs` asked for).
    #[serde(default)]
    pub top_logprobs: Vec<TopLogprob>,
}

/// One of the most likely tokens at a chat sample's position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    /// Its text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes (`null` where a token is no whole character).
    #[serde(default)]
    pub bytes: Option<Vec<u8>>,
}
