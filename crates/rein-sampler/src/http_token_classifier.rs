//! [`HttpTokenClassifier`]: a token classifier (a process reward model) behind an inference
//! server, through vLLM's pooling API (`POST /pooling`; `rein serve` answers it for a token
//! classifier).
//!
//! Token ids go as `input` (a list of lists), laid out by the caller exactly as the model was
//! trained on them; each comes back as rows of label probabilities (the server's softmax,
//! asked for with `"use_activation": true`): one row per token when the server pools every
//! token, or one per step tag token when it pools at a step tag (vLLM's `STEP` pooling).

use std::time::Duration;

use crate::http::{Failure, ServedModel, in_input_order};
use crate::protocol::{PoolingRequest, PoolingResponse, Prompt, Prompts, parse};

/// A token classifier on an inference server (see the module docs).
pub struct HttpTokenClassifier {
    server: ServedModel,
}

impl HttpTokenClassifier {
    /// The token classifier served at `url` (`http://host:port`), under the name `model` (none:
    /// the server's only model); each request may take `timeout`.
    pub fn new(url: &str, model: Option<&str>, timeout: Duration) -> Self {
        Self {
            server: ServedModel::new(url, model, timeout),
        }
    }

    /// The server's address.
    pub fn url(&self) -> &str {
        &self.server.url
    }

    /// Each sequence's rows of label probabilities, in order. The error names the server and
    /// what went wrong (unreachable, an HTTP error, an answer of the wrong shape).
    pub fn rows(&self, sequences: &[&[u32]]) -> Result<Vec<Vec<Vec<f64>>>, String> {
        if sequences.is_empty() {
            return Ok(Vec::new());
        }
        let body = PoolingRequest {
            model: self.server.model.clone(),
            input: Prompts::Batch(sequences.iter().map(|ids| Prompt::Ids(ids.to_vec())).collect()),
            use_activation: Some(true),
        };
        let answer = (self.server.post("/pooling", &body))
            .map_err(|(Failure::Bad(message) | Failure::Unreachable(message))| format!("{}: {message}", self.url()))?;
        let response: PoolingResponse =
            parse(&answer).map_err(|e| format!("{}: the pooling answer: {e}", self.url()))?;
        let items = response.data.into_iter().map(|item| (item.index, item.data));
        in_input_order(self.url(), sequences.len(), items)
    }
}
