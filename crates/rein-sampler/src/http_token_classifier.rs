//! [`HttpTokenClassifier`]: a token classifier (a process reward model) behind an inference
//! server, through vLLM's pooling API (`POST /pooling`; `rein serve` answers it for a token
//! classifier).
//!
//! Token ids go as `input` (a list of lists), laid out by the caller exactly as the model was
//! trained on them; each comes back as rows of label probabilities (the server's softmax,
//! asked for with `"use_activation": true`): one row per token when the server pools every
//! token, or one per step tag token when it pools at a step tag (vLLM's `STEP` pooling).

use std::time::Duration;

use crate::http::{Failure, post_json};
use crate::protocol::{PoolingRequest, PoolingResponse, Prompt, Prompts, parse};

/// A token classifier on an inference server (see the module docs).
pub struct HttpTokenClassifier {
    url: String,
    model: Option<String>,
    agent: ureq::Agent,
}

impl HttpTokenClassifier {
    /// The token classifier served at `url` (`http://host:port`), under the name `model` (none:
    /// the server's only model); each request may take `timeout`.
    pub fn new(url: &str, model: Option<&str>, timeout: Duration) -> Self {
        Self {
            url: url.trim_end_matches('/').to_string(),
            model: model.map(str::to_string),
            agent: ureq::AgentBuilder::new()
                .timeout_connect(Duration::from_secs(5).min(timeout))
                .timeout(timeout)
                .build(),
        }
    }

    /// The server's address.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Each sequence's rows of label probabilities, in order. The error names the server and
    /// what went wrong (unreachable, an HTTP error, an answer of the wrong shape).
    pub fn rows(&self, sequences: &[&[u32]]) -> Result<Vec<Vec<Vec<f64>>>, String> {
        if sequences.is_empty() {
            return Ok(Vec::new());
        }
        let body = PoolingRequest {
            model: self.model.clone(),
            input: Prompts::Batch(sequences.iter().map(|ids| Prompt::Ids(ids.to_vec())).collect()),
            use_activation: Some(true),
        };
        let path = "/pooling";
        let answer = post_json(self.agent.post(&format!("{}{path}", self.url)), path, &body)
            .map_err(|(Failure::Bad(message) | Failure::Unreachable(message))| format!("{}: {message}", self.url))?;
        let response: PoolingResponse = parse(&answer).map_err(|e| format!("{}: the pooling answer: {e}", self.url))?;
        let mut out: Vec<Option<Vec<Vec<f64>>>> = vec![None; sequences.len()];
        for item in response.data {
            let slot = (out.get_mut(item.index))
                .ok_or_else(|| format!("{}: answered for input {} of {}", self.url, item.index, sequences.len()))?;
            *slot = Some(item.data);
        }
        (out.into_iter().enumerate())
            .map(|(i, rows)| rows.ok_or_else(|| format!("{}: no answer for input {i}", self.url)))
            .collect()
    }
}
