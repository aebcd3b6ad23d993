//! `[sampler]`: how completions are sampled, in process or by inference servers.

use serde::{Deserialize, Serialize};

/// Sampling completions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplerSection {
    /// Temperature.
    pub temperature: f32,
    /// Top-k.
    pub top_k: Option<usize>,
    /// Top-p.
    pub top_p: Option<f32>,
    /// Min-p.
    pub min_p: Option<f32>,
    /// Most new tokens per completion.
    pub max_new_tokens: usize,
    /// Completions per prompt (the group size G).
    pub n: usize,
    /// Extra stop strings (the tokenizer's end-of-sequence tokens always stop).
    pub stop: Vec<String>,
    /// `native` (in process) or `http` (inference servers at `urls`).
    pub backend: rein_core::SamplerBackend,
    /// `exact` (the trainer's logits, bit for bit) or `q8`: products with a quantised model's
    /// packed weights quantise their activations to 8 bits per block, as llama.cpp does —
    /// faster rollouts, not exact; the trainer's log-probabilities stay exact and
    /// `train/mismatch_kl` measures the difference (native sampler, a GGUF model).
    pub precision: rein_core::SamplerPrecision,
    /// The servers' base URLs (`http://host:port`), for `backend = "http"`.
    pub urls: Vec<String>,
    /// The servers' API: `sglang` (also `rein serve`) or `vllm`.
    pub api: rein_core::ServerApi,
    /// The name the servers know the policy by (vLLM's LoRA adapter name).
    pub server_model: String,
    /// How long one request may take, in seconds.
    pub request_timeout_s: f64,
    /// Retries of a failing request (with exponential backoff from `backoff_s`) before its
    /// server is dropped.
    pub retries: u32,
    /// The first retry's wait, in seconds.
    pub backoff_s: f64,
    /// `model` (the merged model) or `adapter` (the LoRA adapter only) is written for the servers.
    pub sync: rein_core::PolicySync,
    /// Write the policy for the servers every this many updates.
    pub sync_every: usize,
    /// Where policy versions are written for the servers (default `<run>/weights`).
    pub weights_dir: Option<String>,
}

impl Default for SamplerSection {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: None,
            top_p: None,
            min_p: None,
            max_new_tokens: 64,
            n: 8,
            stop: Vec::new(),
            backend: rein_core::SamplerBackend::Native,
            precision: rein_core::SamplerPrecision::Exact,
            urls: Vec::new(),
            api: rein_core::ServerApi::Sglang,
            server_model: "rein-policy".into(),
            request_timeout_s: 600.0,
            retries: 3,
            backoff_s: 0.5,
            sync: rein_core::PolicySync::Model,
            sync_every: 1,
            weights_dir: None,
        }
    }
}
