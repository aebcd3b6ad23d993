//! `rein serve` for a sequence classifier (a reward model): the classification API that vLLM
//! serves at `POST /classify` and SGLang at `POST /v1/classify` (the same format, both paths
//! answered here), plus `/health` and `/v1/models`.
//!
//! A request's `input` is a text, token ids, or a list of them; each gets its outputs in
//! `probs`, after the activation vLLM applies (sigmoid for one label, softmax for more) unless
//! the request says `"activation": false`, when they are the raw scores (what rein's reward
//! models read). Texts are tokenised as given (render chat templates before sending). Requests
//! run one at a time; the texts of one are scored in batches of similar lengths.

use std::sync::{Mutex, PoisonError};

use hyper::Method;
use rein_model::Cpu;
use rein_model::lm::{LmTokenizer, SequenceClassifier};
use rein_sampler::protocol::{ClassifyData, ClassifyRequest, ClassifyResponse, Prompt, Prompts, parse};
use serde_json::json;

use super::{Answer, Handler, error};

/// Sequences per forward pass.
const BATCH: usize = 32;

/// A classifier and its tokenizer, served (see the module docs).
pub(super) struct Classifier {
    model: Mutex<SequenceClassifier<Cpu>>,
    tokenizer: LmTokenizer,
    name: String,
    /// What a request may hold.
    limits: InputLimits,
}

impl Classifier {
    pub(super) fn new(
        model: SequenceClassifier<Cpu>,
        tokenizer: LmTokenizer,
        name: String,
        limits: InputLimits,
    ) -> Self {
        Self {
            limits,
            model: Mutex::new(model),
            tokenizer,
            name,
        }
    }

    fn classify(&self, body: &str) -> Result<ClassifyResponse, String> {
        let request: ClassifyRequest = parse(body).map_err(|e| format!("the body of /classify: {e}"))?;
        let ids = input_ids(&self.tokenizer, request.input, self.limits)?;
        // Scoring does not change the model, so a request that panicked left it whole.
        let model = self.model.lock().unwrap_or_else(PoisonError::into_inner);
        let labels = model.labels().to_vec();
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by_key(|&i| ids[i].len());
        let mut outputs = vec![Vec::new(); ids.len()];
        for chunk in order.chunks(BATCH) {
            let batch: Vec<Vec<u32>> = chunk.iter().map(|&i| ids[i].clone()).collect();
            let values = model.scores(&batch, &Default::default()).into_data();
            let values = values.convert::<f32>().to_vec::<f32>().map_err(|e| format!("{e:?}"))?;
            for (row, &i) in chunk.iter().enumerate() {
                let raw = &values[row * labels.len()..(row + 1) * labels.len()];
                outputs[i] = raw.iter().map(|&v| f64::from(v)).collect();
            }
        }
        let data = (outputs.into_iter().enumerate())
            .map(|(index, raw)| {
                let probs = match request.activation.unwrap_or(true) {
                    true => activation(&raw),
                    false => raw,
                };
                let best = (0..probs.len())
                    .max_by(|&a, &b| probs[a].total_cmp(&probs[b]))
                    .unwrap_or(0);
                ClassifyData {
                    index,
                    label: labels.get(best).cloned(),
                    num_classes: Some(probs.len()),
                    probs,
                }
            })
            .collect();
        Ok(ClassifyResponse {
            id: Some(format!("classify-{}", super::seed_from_clock())),
            object: Some("list".into()),
            model: Some(self.name.clone()),
            data,
            usage: Some(input_usage(&ids)),
        })
    }
}

/// What a classifier's request may hold: inputs of at most `max_len` tokens
/// (`--max-model-len`), ids within a vocabulary of `vocab`, at most `max_inputs` inputs
/// (`--max-num-seqs`).
#[derive(Debug, Clone, Copy)]
pub(super) struct InputLimits {
    pub(super) max_len: usize,
    pub(super) vocab: usize,
    pub(super) max_inputs: usize,
}

/// A request's inputs as token ids: texts tokenised as given, ids as sent; refused (naming the
/// input and the limit) when there are more than `limits` allow, or one is empty, too long or
/// holds a token outside the vocabulary.
pub(super) fn input_ids(tokenizer: &LmTokenizer, input: Prompts, limits: InputLimits) -> Result<Vec<Vec<u32>>, String> {
    let inputs = match input {
        Prompts::Batch(items) => items,
        Prompts::Text(text) => vec![Prompt::Text(text)],
        Prompts::Ids(ids) => vec![Prompt::Ids(ids)],
    };
    if inputs.len() > limits.max_inputs {
        return Err(format!(
            "{} inputs in one request; this server takes at most {} (--max-num-seqs)",
            inputs.len(),
            limits.max_inputs
        ));
    }
    let ids = (inputs.into_iter())
        .map(|input| match input {
            Prompt::Ids(ids) => Ok(ids),
            Prompt::Text(text) => tokenizer.encode(&text).map_err(|e| e.to_string()),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(i) = ids.iter().position(Vec::is_empty) {
        return Err(format!("input {i} is empty: there is no token to classify"));
    }
    if let Some(i) = ids.iter().position(|ids| ids.len() > limits.max_len) {
        return Err(format!(
            "input {i} has {} tokens; this model's maximum context length is {} tokens (--max-model-len)",
            ids[i].len(),
            limits.max_len
        ));
    }
    if let Some(&id) = ids.iter().flatten().find(|&&id| id as usize >= limits.vocab) {
        return Err(format!(
            "token id {id} is outside the vocabulary ({} tokens)",
            limits.vocab
        ));
    }
    Ok(ids)
}

/// The `usage` of a classifier's answer: the inputs' tokens, none generated.
pub(super) fn input_usage(ids: &[Vec<u32>]) -> serde_json::Value {
    let tokens: usize = ids.iter().map(Vec::len).sum();
    json!({"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0})
}

/// `/health` and `/v1/models` of a server holding the model `name`; `None` for other paths.
pub(super) fn about(name: &str, method: &Method, path: &str) -> Option<Answer> {
    match (method, path) {
        (&Method::GET, "/health") => Some((200, json!({}))),
        (&Method::GET, "/v1/models") => Some((
            200,
            json!({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "rein"}]}),
        )),
        _ => None,
    }
}

/// vLLM's default activation of classifier outputs: the sigmoid of one, the softmax of several.
pub(super) fn activation(raw: &[f64]) -> Vec<f64> {
    if let [x] = raw {
        return vec![1.0 / (1.0 + (-x).exp())];
    }
    let max = raw.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exp: Vec<f64> = raw.iter().map(|x| (x - max).exp()).collect();
    let sum: f64 = exp.iter().sum();
    exp.into_iter().map(|e| e / sum).collect()
}

impl Handler for Classifier {
    fn route(&self, method: &Method, path: &str, body: &str) -> Answer {
        if let Some(answer) = about(&self.name, method, path) {
            return answer;
        }
        match (method, path) {
            (&Method::POST, "/classify" | "/v1/classify") => match self.classify(body) {
                Ok(response) => (200, json!(response)),
                Err(message) => error(400, message),
            },
            (_, "/classify" | "/v1/classify") => error(405, format!("{path} takes POST")),
            _ => error(
                404,
                format!("no endpoint {path}: this server holds a classifier (POST /classify)"),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::activation;

    #[test]
    fn one_output_goes_through_the_sigmoid_several_through_the_softmax() {
        assert!((activation(&[0.0])[0] - 0.5).abs() < 1e-12);
        let p = activation(&[1.0, 1.0, 1.0 + 2f64.ln()]);
        assert!((p[2] - 0.5).abs() < 1e-12 && (p[0] - 0.25).abs() < 1e-12);
    }
}
