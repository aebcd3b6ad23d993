//! The classification API of vLLM (`POST /classify`) and SGLang (`POST /v1/classify`, the same
//! format): what [`crate::HttpClassifier`] sends and `rein serve` answers for a reward model.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Prompts;

/// A classification request (vLLM's `POST /classify`, SGLang's `POST /v1/classify`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassifyRequest {
    /// The served model's name (servers with one model accept none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A text, token ids, or a list of them.
    pub input: Prompts,
    /// Whether the server applies its activation (vLLM: sigmoid for one label, softmax for
    /// more) before answering; `false` asks for the raw scores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation: Option<bool>,
}

/// A classification answer: one item per input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassifyResponse {
    /// The request's id (`classify-…`).
    #[serde(default)]
    pub id: Option<String>,
    /// `list`.
    #[serde(default)]
    pub object: Option<String>,
    /// The model that answered.
    #[serde(default)]
    pub model: Option<String>,
    /// One item per input.
    pub data: Vec<ClassifyData>,
    /// Token counts (`prompt_tokens`, `total_tokens`).
    #[serde(default)]
    pub usage: Option<Value>,
}

/// One input's outputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassifyData {
    /// The input's position in the request.
    pub index: usize,
    /// The label of the largest output.
    #[serde(default)]
    pub label: Option<String>,
    /// One output per label, in label order.
    pub probs: Vec<f64>,
    /// How many labels.
    #[serde(default)]
    pub num_classes: Option<usize>,
}
