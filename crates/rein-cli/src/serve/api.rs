//! The HTTP APIs `rein serve` speaks, as JSON in and out: OpenAI's completions and chat
//! completions (with vLLM's token-id extensions), SGLang's `/generate` and
//! `/update_weights_from_disk`.

use std::time::{SystemTime, UNIX_EPOCH};

use rein_model::lm::{ChatMessage, LmTokenizer};
use rein_sampler::{FinishReason, Generation, GenerationConfig, completion_text, prompt_seed};
use serde_json::{Value, json};

use super::engine::{Done, Work};

/// A request rein cannot serve: HTTP 400 with this message.
pub(crate) struct BadRequest(pub String);

fn bad(message: impl Into<String>) -> BadRequest {
    BadRequest(message.into())
}

/// What the APIs need besides the engine.
pub(crate) struct Api<'a> {
    /// The served model's tokenizer.
    pub tokenizer: &'a LmTokenizer,
    /// The name clients use for it.
    pub model_name: &'a str,
    /// A seed for requests that give none.
    pub fresh_seed: &'a dyn Fn() -> u64,
}

fn u64_field(body: &Value, key: &str) -> Result<Option<u64>, BadRequest> {
    match &body[key] {
        Value::Null => Ok(None),
        v => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| bad(format!("`{key}` must be a non-negative integer"))),
    }
}

fn f32_field(body: &Value, key: &str) -> Result<Option<f32>, BadRequest> {
    match &body[key] {
        Value::Null => Ok(None),
        v => v
            .as_f64()
            .map(|x| Some(x as f32))
            .ok_or_else(|| bad(format!("`{key}` must be a number"))),
    }
}

/// `stop` as a string or a list of strings.
fn stops(body: &Value) -> Result<Vec<String>, BadRequest> {
    match &body["stop"] {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(items) => (items.iter())
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("`stop` must be a string or a list of strings")),
        _ => Err(bad("`stop` must be a string or a list of strings")),
    }
}

fn token_ids(value: &Value) -> Option<Vec<u32>> {
    (value.as_array()?.iter())
        .map(|v| v.as_u64().and_then(|x| u32::try_from(x).ok()))
        .collect()
}

impl Api<'_> {
    /// Sampling settings from `params` (OpenAI's names, or SGLang's with `sglang`).
    fn config(&self, params: &Value, sglang: bool) -> Result<(GenerationConfig, Vec<String>, u64), BadRequest> {
        let max_key = if sglang { "max_new_tokens" } else { "max_tokens" };
        let max_new_tokens = u64_field(params, max_key)?
            .or(u64_field(params, "max_completion_tokens")?)
            .unwrap_or(if sglang { 128 } else { 16 }) as usize;
        let temperature = f32_field(params, "temperature")?.unwrap_or(1.0);
        if !(temperature >= 0.0 && temperature.is_finite()) {
            return Err(bad(format!("temperature must be ≥ 0, got {temperature}")));
        }
        // vLLM and SGLang take top_k = -1 (and OpenAI clients 0) for "no top-k".
        let top_k = match &params["top_k"] {
            Value::Null => None,
            v => match v.as_i64() {
                Some(k) if k <= 0 => None,
                Some(k) => Some(k as usize),
                None => return Err(bad("`top_k` must be an integer")),
            },
        };
        let top_p = f32_field(params, "top_p")?.filter(|&p| p < 1.0);
        if top_p.is_some_and(|p| p <= 0.0) {
            return Err(bad("top_p must be in (0, 1]"));
        }
        let min_p = f32_field(params, "min_p")?.filter(|&p| p > 0.0);
        if min_p.is_some_and(|p| p >= 1.0) {
            return Err(bad("min_p must be in [0, 1)"));
        }
        let n = u64_field(params, "n")?.unwrap_or(1) as usize;
        if n == 0 || n > 256 {
            return Err(bad(format!("n must be in 1..=256, got {n}")));
        }
        let mut stop_token_ids = self.tokenizer.eos_ids().to_vec();
        if let Some(extra) = params.get("stop_token_ids").filter(|v| !v.is_null()) {
            stop_token_ids.extend(token_ids(extra).ok_or_else(|| bad("`stop_token_ids` must be token ids"))?);
        }
        let seed_key = if sglang { "sampling_seed" } else { "seed" };
        let seed = u64_field(params, seed_key)?.unwrap_or_else(|| (self.fresh_seed)());
        let config = GenerationConfig {
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            min_p,
            n,
            stop_token_ids,
            seed,
        };
        Ok((config, stops(params)?, seed))
    }

    /// Prompts as token ids: ids, lists of ids, a string or a list of strings.
    fn prompts(&self, value: &Value, what: &str) -> Result<Vec<Vec<u32>>, BadRequest> {
        let encode = |text: &str| self.tokenizer.encode(text).map_err(|e| bad(e.to_string()));
        let prompts = match value {
            Value::String(text) => vec![encode(text)?],
            Value::Array(items) if items.first().is_some_and(Value::is_number) => {
                vec![token_ids(value).ok_or_else(|| bad(format!("`{what}` holds something other than token ids")))?]
            }
            Value::Array(items) => (items.iter())
                .map(|item| match item {
                    Value::String(text) => encode(text),
                    ids => token_ids(ids).ok_or_else(|| bad(format!("`{what}` must be text, ids, or lists of them"))),
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => return Err(bad(format!("`{what}` must be text, token ids, or lists of them"))),
        };
        if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
            return Err(bad(format!("`{what}` holds an empty prompt")));
        }
        let vocab = self.tokenizer.vocab_size() as u32;
        if let Some(id) = prompts.iter().flatten().find(|&&id| id >= vocab) {
            return Err(bad(format!("token id {id} is outside the vocabulary ({vocab} tokens)")));
        }
        Ok(prompts)
    }

    fn work(prompts: Vec<Vec<u32>>, config: GenerationConfig, stops: Vec<String>, seed: u64) -> Work {
        Work {
            seeds: (0..prompts.len()).map(|p| prompt_seed(seed, p)).collect(),
            prompts,
            config,
            stops,
        }
    }

    fn text(&self, g: &Generation, stops: &[String]) -> String {
        completion_text(self.tokenizer, &g.tokens, stops)
    }

    fn piece(&self, id: u32) -> String {
        self.tokenizer.decode(&[id], false).unwrap_or_default()
    }

    /// SGLang's `/generate`.
    pub(crate) fn sglang_request(&self, body: &Value) -> Result<(Work, bool), BadRequest> {
        let (prompts, batched) = match (&body["input_ids"], &body["text"]) {
            (ids @ Value::Array(items), _) => (
                self.prompts(ids, "input_ids")?,
                items.first().is_some_and(Value::is_array),
            ),
            (Value::Null, text @ (Value::String(_) | Value::Array(_))) => {
                (self.prompts(text, "text")?, text.is_array())
            }
            _ => return Err(bad("give `input_ids` (token ids, or a list of them) or `text`")),
        };
        let params = match &body["sampling_params"] {
            Value::Null => json!({}),
            Value::Array(_) => {
                return Err(bad(
                    "per-prompt `sampling_params` lists are not supported; send one request per prompt",
                ));
            }
            p => p.clone(),
        };
        let (config, stops, seed) = self.config(&params, true)?;
        Ok((Self::work(prompts, config, stops, seed), batched))
    }

    /// SGLang's answer: one object per sample (a list when there is more than one).
    pub(crate) fn sglang_response(&self, work: &Work, done: &Done, batched: bool, logprobs: bool) -> Value {
        let outputs: Vec<Value> = (done.generations.iter())
            .map(|g| {
                let prompt_tokens = work.prompts[g.prompt].len();
                let finish = match g.finish {
                    FinishReason::Length => json!({"type": "length", "length": g.tokens.len()}),
                    FinishReason::StopToken => json!({"type": "stop", "matched": g.tokens.last()}),
                    FinishReason::StopCondition => {
                        let text = self.tokenizer.decode(&g.tokens, false).unwrap_or_default();
                        json!({"type": "stop", "matched": work.stops.iter().find(|s| text.contains(s.as_str()))})
                    }
                };
                let mut meta = json!({
                    "id": format!("{}-{}", g.prompt, g.sample),
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": g.tokens.len(),
                    "finish_reason": finish,
                    "weight_version": done.version,
                });
                if logprobs {
                    meta["output_token_logprobs"] = json!(
                        (g.logprobs.iter().zip(&g.tokens))
                            .map(|(lp, id)| json!([lp, id, null]))
                            .collect::<Vec<_>>()
                    );
                }
                json!({"text": self.text(g, &work.stops), "output_ids": g.tokens, "meta_info": meta})
            })
            .collect();
        match outputs.len() == 1 && !batched {
            true => outputs.into_iter().next().unwrap_or(Value::Null),
            false => Value::Array(outputs),
        }
    }

    /// OpenAI's `/v1/completions` (vLLM's `return_token_ids` too).
    pub(crate) fn completion_request(&self, body: &Value) -> Result<Work, BadRequest> {
        refuse_unsupported(body)?;
        if body["echo"].as_bool() == Some(true) {
            return Err(bad("`echo` is not supported"));
        }
        let prompts = self.prompts(&body["prompt"], "prompt")?;
        let (config, stops, seed) = self.config(body, false)?;
        Ok(Self::work(prompts, config, stops, seed))
    }

    /// OpenAI's completion object.
    pub(crate) fn completion_response(&self, body: &Value, work: &Work, done: &Done) -> Value {
        let want_logprobs = !body["logprobs"].is_null();
        let token_ids = body["return_token_ids"].as_bool() == Some(true);
        let choices: Vec<Value> = (done.generations.iter().enumerate())
            .map(|(index, g)| {
                let text = self.text(g, &work.stops);
                let mut choice = json!({
                    "index": index,
                    "text": text,
                    "finish_reason": finish_name(g.finish),
                    "stop_reason": stop_reason(g, &work.stops, self.tokenizer),
                    "logprobs": null,
                });
                if want_logprobs {
                    let pieces: Vec<String> = g.tokens.iter().map(|&id| self.piece(id)).collect();
                    let mut offset = 0;
                    let offsets: Vec<usize> = (pieces.iter())
                        .map(|p| {
                            let at = offset;
                            offset += p.len();
                            at
                        })
                        .collect();
                    choice["logprobs"] = json!({
                        "tokens": pieces,
                        "token_logprobs": g.logprobs,
                        "top_logprobs": null,
                        "text_offset": offsets,
                    });
                }
                if token_ids {
                    choice["token_ids"] = json!(g.tokens);
                    choice["prompt_token_ids"] = json!(work.prompts[g.prompt]);
                }
                choice
            })
            .collect();
        json!({
            "id": format!("cmpl-{}", work.config.seed),
            "object": "text_completion",
            "created": now(),
            "model": self.model_name,
            "system_fingerprint": format!("rein-weights-{}", done.version),
            "choices": choices,
            "usage": usage(work, done),
        })
    }

    /// OpenAI's `/v1/chat/completions`: the messages through the model's chat template.
    pub(crate) fn chat_request(&self, body: &Value) -> Result<Work, BadRequest> {
        refuse_unsupported(body)?;
        let messages = body["messages"]
            .as_array()
            .ok_or_else(|| bad("`messages` must be a list"))?;
        let messages = (messages.iter())
            .map(|m| {
                let role = m["role"].as_str().ok_or_else(|| bad("each message needs a `role`"))?;
                let content = match &m["content"] {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    Value::Array(parts) => (parts.iter())
                        .filter_map(|p| p["text"].as_str())
                        .collect::<Vec<_>>()
                        .join(""),
                    _ => return Err(bad("message `content` must be text")),
                };
                Ok(ChatMessage {
                    role: role.into(),
                    content,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let tools: Vec<Value> = body["tools"].as_array().cloned().unwrap_or_default();
        let text = (self.tokenizer.apply_chat_template_with_tools(&messages, &tools, true))
            .map_err(|e| bad(e.to_string()))?
            .ok_or_else(|| bad("the served model's tokenizer has no chat template"))?;
        let prompts = self.prompts(&Value::String(text), "messages")?;
        let (config, stops, seed) = self.config(body, false)?;
        Ok(Self::work(prompts, config, stops, seed))
    }

    /// OpenAI's chat completion object.
    pub(crate) fn chat_response(&self, body: &Value, work: &Work, done: &Done) -> Value {
        let want_logprobs = body["logprobs"].as_bool() == Some(true);
        let choices: Vec<Value> = (done.generations.iter().enumerate())
            .map(|(index, g)| {
                let logprobs = want_logprobs.then(|| {
                    let content: Vec<Value> = (g.tokens.iter().zip(&g.logprobs))
                        .filter(|(id, _)| !work.config.stop_token_ids.contains(id))
                        .map(|(&id, lp)| {
                            let piece = self.piece(id);
                            json!({"token": piece, "logprob": lp, "bytes": piece.as_bytes(), "top_logprobs": []})
                        })
                        .collect();
                    json!({ "content": content })
                });
                json!({
                    "index": index,
                    "message": {"role": "assistant", "content": self.text(g, &work.stops)},
                    "logprobs": logprobs,
                    "finish_reason": finish_name(g.finish),
                })
            })
            .collect();
        json!({
            "id": format!("chatcmpl-{}", work.config.seed),
            "object": "chat.completion",
            "created": now(),
            "model": self.model_name,
            "system_fingerprint": format!("rein-weights-{}", done.version),
            "choices": choices,
            "usage": usage(work, done),
        })
    }
}

/// Refuses options rein does not implement rather than ignoring them.
fn refuse_unsupported(body: &Value) -> Result<(), BadRequest> {
    if body["stream"].as_bool() == Some(true) {
        return Err(bad("streaming is not supported; send stream = false"));
    }
    let top = body["top_logprobs"].as_u64().unwrap_or(0).max(match &body["logprobs"] {
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    });
    if top > 0 {
        return Err(bad(
            "only the sampled token's log-probability is returned: ask logprobs = 0 (completions) or top_logprobs = 0",
        ));
    }
    Ok(())
}

fn finish_name(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Length => "length",
        FinishReason::StopToken | FinishReason::StopCondition => "stop",
    }
}

/// vLLM's `stop_reason`: the stop token id, the stop string, or null (end of sequence).
fn stop_reason(g: &Generation, stops: &[String], tokenizer: &LmTokenizer) -> Value {
    match g.finish {
        FinishReason::Length => Value::Null,
        FinishReason::StopToken => match tokenizer.eos_ids().contains(g.tokens.last().unwrap_or(&u32::MAX)) {
            true => Value::Null,
            false => json!(g.tokens.last()),
        },
        FinishReason::StopCondition => {
            let text = tokenizer.decode(&g.tokens, false).unwrap_or_default();
            json!(stops.iter().find(|s| text.contains(s.as_str())))
        }
    }
}

fn usage(work: &Work, done: &Done) -> Value {
    let prompt: usize = work.prompts.iter().map(Vec::len).sum();
    let completion: usize = done.generations.iter().map(|g| g.tokens.len()).sum();
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
