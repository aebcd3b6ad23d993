//! [`HttpClassifier`]: a sequence classifier (a reward model) behind an inference server,
//! through the classification API that vLLM serves at `POST /classify` and SGLang at
//! `POST /v1/classify` (the same format; `rein serve` answers both).
//!
//! Texts go as `input` (a list), the raw scores come back as each item's `probs`, in input
//! order. rein asks for them without the activation (`"activation": false`, vLLM's name): the
//! score is the classifier's output as transformers computes it, as TRL reads a reward model.
//! A server that applies its activation anyway (sigmoid for one label, softmax for more, as
//! vLLM does by default and SGLang always) returns probabilities instead: an increasing function
//! of the same score, a valid reward with another scale.

use std::time::Duration;

use crate::http::{Failure, ServedModel, in_input_order};
use crate::protocol::{ClassifyRequest, ClassifyResponse, Prompt, Prompts, parse};

/// A classifier on an inference server (see the module docs).
pub struct HttpClassifier {
    server: ServedModel,
}

impl HttpClassifier {
    /// The classifier served at `url` (`http://host:port`), under the name `model` (none: the
    /// server's only model); each request may take `timeout`.
    pub fn new(url: &str, model: Option<&str>, timeout: Duration) -> Self {
        Self {
            server: ServedModel::new(url, model, timeout),
        }
    }

    /// The server's address.
    pub fn url(&self) -> &str {
        &self.server.url
    }

    /// Each text's outputs, one per label, in order. The error names the server and what went
    /// wrong (unreachable, an HTTP error, an answer of the wrong shape).
    pub fn scores(&self, texts: &[String]) -> Result<Vec<Vec<f64>>, String> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let body = ClassifyRequest {
            model: self.server.model.clone(),
            input: Prompts::Batch(texts.iter().cloned().map(Prompt::Text).collect()),
            activation: Some(false),
        };
        // vLLM's path first, then SGLang's.
        let post = |path: &str| self.server.post(path, &body);
        let answer = match post("/classify") {
            Err(Failure::Bad(message)) if message.contains("HTTP 404") => post("/v1/classify"),
            answer => answer,
        }
        .map_err(|(Failure::Bad(message) | Failure::Unreachable(message))| format!("{}: {message}", self.url()))?;
        let response: ClassifyResponse =
            parse(&answer).map_err(|e| format!("{}: the classification answer: {e}", self.url()))?;
        let items = response.data.into_iter().map(|item| (item.index, item.probs));
        in_input_order(self.url(), texts.len(), items)
    }
}
