//! vLLM's pooling API (`POST /pooling`) for token classifiers: each input's outputs per token —
//! every token's, or with a step tag (vLLM's `STEP` pooling, as it serves Qwen2.5-Math-PRM and
//! Math-Shepherd) those of the tag's tokens only. What [`crate::HttpTokenClassifier`] sends and
//! `rein serve` answers for a process reward model.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Prompts;

/// A pooling request (vLLM's `POST /pooling`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolingRequest {
    /// The served model's name (servers with one model accept none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A text, token ids, or a list of them.
    pub input: Prompts,
    /// Whether the server applies its activation (the softmax over labels) before answering;
    /// `false` asks for the raw scores. vLLM's name; its older `activation` is read too.
    #[serde(default, alias = "activation", skip_serializing_if = "Option::is_none")]
    pub use_activation: Option<bool>,
}

/// A pooling answer: one item per input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolingResponse {
    /// The request's id (`pool-…`).
    #[serde(default)]
    pub id: Option<String>,
    /// `list`.
    #[serde(default)]
    pub object: Option<String>,
    /// The model that answered.
    #[serde(default)]
    pub model: Option<String>,
    /// One item per input.
    pub data: Vec<PoolingData>,
    /// Token counts (`prompt_tokens`, `total_tokens`).
    #[serde(default)]
    pub usage: Option<Value>,
}

/// One input's outputs: a row per pooled token (every token, or each step tag's), one value
/// per label.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolingData {
    /// The input's position in the request.
    pub index: usize,
    /// `pooling`.
    #[serde(default)]
    pub object: Option<String>,
    /// The rows, in token order.
    pub data: Vec<Vec<f64>>,
}
