//! `rein serve` for a token classifier (a process reward model): vLLM's pooling API at
//! `POST /pooling`, plus `/health` and `/v1/models`.
//!
//! A request's `input` is a text, token ids, or a list of them; each gets its rows in `data`:
//! the label probabilities (the softmax, unless the request says `"use_activation": false`, when
//! they are the raw scores) of every token, or, when the server was started with `--step-tag`,
//! of each occurrence of the tag's token only (vLLM's `STEP` pooling, as it serves
//! Qwen2.5-Math-PRM). Texts are tokenised as given. Requests run one at a time; the inputs of
//! one are judged in batches of similar lengths.

use std::sync::{Mutex, PoisonError};

use hyper::Method;
use rein_model::Cpu;
use rein_model::lm::{LmTokenizer, TokenClassifier};
use rein_sampler::protocol::{PoolingData, PoolingRequest, PoolingResponse, parse};
use serde_json::json;

use super::classify::{InputLimits, about, activation, input_ids, input_usage};
use super::{Answer, Handler, error};

/// Sequences per forward pass.
const BATCH: usize = 16;

/// A token classifier and its tokenizer, served (see the module docs).
pub(super) struct TokenClassifierServer {
    model: Mutex<TokenClassifier<Cpu>>,
    tokenizer: LmTokenizer,
    name: String,
    /// What a request may hold.
    limits: InputLimits,
    /// The step tag's token (`--step-tag`): only its rows are answered; `None`, every token's.
    step_tag: Option<u32>,
}

impl TokenClassifierServer {
    pub(super) fn new(
        model: TokenClassifier<Cpu>,
        tokenizer: LmTokenizer,
        name: String,
        limits: InputLimits,
        step_tag: Option<u32>,
    ) -> Self {
        Self {
            limits,
            model: Mutex::new(model),
            tokenizer,
            name,
            step_tag,
        }
    }

    fn pool(&self, body: &str) -> Result<PoolingResponse, String> {
        let request: PoolingRequest = parse(body).map_err(|e| format!("the body of /pooling: {e}"))?;
        let ids = input_ids(&self.tokenizer, request.input, self.limits)?;
        let pooled = |sequence: &[u32]| -> Vec<usize> {
            match self.step_tag {
                Some(tag) => (sequence.iter().enumerate())
                    .filter(|&(_, &id)| id == tag)
                    .map(|(t, _)| t)
                    .collect(),
                None => (0..sequence.len()).collect(),
            }
        };
        // Judging does not change the model, so a request that panicked left it whole.
        let model = self.model.lock().unwrap_or_else(PoisonError::into_inner);
        let labels = model.labels().len();
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by_key(|&i| ids[i].len());
        let mut rows = vec![Vec::new(); ids.len()];
        for chunk in order.chunks(BATCH) {
            let sequences: Vec<&[u32]> = chunk.iter().map(|&i| ids[i].as_slice()).collect();
            let positions: Vec<Vec<usize>> = sequences.iter().map(|sequence| pooled(sequence)).collect();
            let at: Vec<(usize, usize)> = (positions.iter().enumerate())
                .flat_map(|(row, positions)| positions.iter().map(move |&t| (row, t)))
                .collect();
            if at.is_empty() {
                continue;
            }
            let values = model.logits_at(&sequences, &at, &Default::default()).into_data();
            let values = values.convert::<f32>().to_vec::<f32>().map_err(|e| format!("{e:?}"))?;
            let mut values = values.chunks_exact(labels);
            for (&i, positions) in chunk.iter().zip(&positions) {
                rows[i] = (values.by_ref().take(positions.len()))
                    .map(|raw| {
                        let raw: Vec<f64> = raw.iter().map(|&v| f64::from(v)).collect();
                        match request.use_activation.unwrap_or(true) {
                            true => activation(&raw),
                            false => raw,
                        }
                    })
                    .collect();
            }
        }
        let data = (rows.into_iter().enumerate())
            .map(|(index, data)| PoolingData {
                index,
                object: Some("pooling".into()),
                data,
            })
            .collect();
        Ok(PoolingResponse {
            id: Some(format!("pool-{}", super::seed_from_clock())),
            object: Some("list".into()),
            model: Some(self.name.clone()),
            data,
            usage: Some(input_usage(&ids)),
        })
    }
}

impl Handler for TokenClassifierServer {
    fn route(&self, method: &Method, path: &str, body: &str) -> Answer {
        if let Some(answer) = about(&self.name, method, path) {
            return answer;
        }
        match (method, path) {
            (&Method::POST, "/pooling") => match self.pool(body) {
                Ok(response) => (200, json!(response)),
                Err(message) => error(400, message),
            },
            (_, "/pooling") => error(405, "/pooling takes POST"),
            _ => error(
                404,
                format!("no endpoint {path}: this server holds a token classifier (POST /pooling)"),
            ),
        }
    }
}
