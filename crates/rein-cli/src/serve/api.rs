//! The HTTP APIs `rein serve` speaks: OpenAI's completions and chat completions (with vLLM's
//! token-id extensions) and SGLang's `/generate`, from and to the typed requests and answers of
//! [`rein_sampler::protocol`], which the client uses too.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use rein_model::lm::{ChatMessage, LmTokenizer};
use rein_model::vision::ProcessedImage;
use rein_sampler::protocol::{
    ChatChoice, ChatLogprobs, ChatRequest, ChatResponse, ChatResponseMessage, CompletionChoice, CompletionLogprobs,
    CompletionRequest, CompletionResponse, ContentPart, GenerateOutput, GenerateRequest, GenerateResponse,
    LogprobEntry, Matched, MessageContent, MetaInfo, Prompt, Prompts, Sampling, SamplingParamsField, SglangFinish,
    StopReason, TokenLogprob, TopLogprob, Usage,
};
use rein_sampler::{FinishReason, Generation, GenerationConfig, completion_text, prompt_seed};
use serde_json::{Value, json};

use super::engine::{Done, Work};
use super::images::ServedImages;
use super::limits::RequestLimits;

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
    /// How products with the model's quantised codes are computed.
    pub precision: rein_core::SamplerPrecision,
    /// What a request may ask for.
    pub limits: &'a RequestLimits,
    /// How a vision-language model's images are read; `None` for a language model.
    pub images: Option<&'a ServedImages>,
}

impl Api<'_> {
    /// Sampling settings from a request for `prompts` (OpenAI's default of 16 new tokens, or
    /// SGLang's 128 with `sglang`, fewer where the context ends sooner), every value and size
    /// checked against the server's limits.
    fn config(
        &self,
        sampling: &Sampling,
        sglang: bool,
        top_logprobs: usize,
        prompts: &[Vec<u32>],
    ) -> Result<(GenerationConfig, Vec<String>, u64), BadRequest> {
        let limits = self.limits;
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let room = limits.max_model_len.saturating_sub(longest);
        let asked = sampling.max_new_tokens.or(sampling.max_completion_tokens);
        if longest >= limits.max_model_len || asked.is_some_and(|m| m > room as u64) {
            let completion = asked.unwrap_or(0);
            return Err(bad(format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens \
                 ({longest} in the messages, {completion} in the completion). Please reduce the length \
                 of the messages or completion. (--max-model-len)",
                limits.max_model_len,
                (longest as u64).saturating_add(completion),
            )));
        }
        let max_new_tokens = match asked {
            Some(asked) => asked as usize,
            None => room.min(if sglang { 128 } else { 16 }),
        };
        let temperature = sampling.temperature.unwrap_or(1.0);
        if !(temperature >= 0.0 && temperature.is_finite()) {
            return Err(bad(format!("temperature must be ≥ 0, got {temperature}")));
        }
        // vLLM and SGLang take top_k = -1 (and OpenAI clients 0) for "no top-k".
        if let Some(k) = sampling.top_k.filter(|&k| k < -1) {
            return Err(bad(format!("top_k must be -1 or 0 (no limit) or at least 1, got {k}")));
        }
        let top_k = sampling.top_k.filter(|&k| k > 0).map(|k| k as usize);
        if let Some(p) = sampling.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return Err(bad(format!("top_p must be in (0, 1], got {p}")));
        }
        let top_p = sampling.top_p.filter(|&p| p < 1.0);
        if let Some(p) = sampling.min_p.filter(|p| !(0.0..=1.0).contains(p)) {
            return Err(bad(format!("min_p must be in [0, 1], got {p}")));
        }
        let min_p = sampling.min_p.filter(|&p| p > 0.0);
        let n = sampling.n.unwrap_or(1);
        let sequences = n.saturating_mul(prompts.len() as u64);
        if n == 0 {
            return Err(bad("n must be at least 1"));
        }
        if sequences > limits.max_num_seqs as u64 {
            return Err(bad(format!(
                "this request asks for {sequences} sequences ({} prompts × n = {n}); this server decodes at most \
                 {} for one request (--max-num-seqs)",
                prompts.len(),
                limits.max_num_seqs
            )));
        }
        let stops = sampling.stop.as_ref().map(|s| s.strings()).unwrap_or_default();
        let stop_ids = sampling.stop_token_ids.as_deref().unwrap_or_default();
        let stop_bytes: usize = stops.iter().map(String::len).sum();
        if stops.len() > limits.max_stop_strings || stop_ids.len() > limits.max_stop_strings {
            return Err(bad(format!(
                "this request has {} stop strings and {} stop token ids; at most {} of each (--max-stop-strings)",
                stops.len(),
                stop_ids.len(),
                limits.max_stop_strings
            )));
        }
        if stop_bytes > limits.max_stop_bytes {
            return Err(bad(format!(
                "this request's stop strings hold {stop_bytes} bytes; at most {} (--max-stop-bytes)",
                limits.max_stop_bytes
            )));
        }
        let cache = limits.kv_bytes(prompts.len(), sequences as usize, longest, max_new_tokens);
        if cache > limits.max_kv_cache_bytes {
            return Err(bad(format!(
                "this request's keys and values would take {cache} bytes ({sequences} sequences of up to {} \
                 tokens); this server allows {} (--max-kv-cache-bytes)",
                longest + max_new_tokens,
                limits.max_kv_cache_bytes
            )));
        }
        let mut stop_token_ids = self.tokenizer.eos_ids().to_vec();
        stop_token_ids.extend(stop_ids);
        let seed = sampling.seed.unwrap_or_else(|| (self.fresh_seed)());
        let config = GenerationConfig {
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            min_p,
            n: n as usize,
            stop_token_ids,
            seed,
            top_logprobs,
            precision: self.precision,
            certainty: false,
        };
        Ok((config, stops, seed))
    }

    /// Prompts as token ids (text is encoded with the served model's tokenizer).
    fn prompts(&self, prompts: &Prompts, what: &str) -> Result<Vec<Vec<u32>>, BadRequest> {
        // As vLLM tokenizes a text prompt: with the tokenizer's beginning-of-sequence token.
        let encode = |text: &str| self.tokenizer.encode_prompt(text).map_err(|e| bad(e.to_string()));
        let prompts = match prompts {
            Prompts::Text(text) => vec![encode(text)?],
            Prompts::Ids(ids) => vec![ids.clone()],
            Prompts::Batch(items) => (items.iter())
                .map(|item| match item {
                    Prompt::Text(text) => encode(text),
                    Prompt::Ids(ids) => Ok(ids.clone()),
                })
                .collect::<Result<Vec<_>, _>>()?,
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

    fn work(
        prompts: Vec<Vec<u32>>,
        config: GenerationConfig,
        stops: Vec<String>,
        seed: u64,
        score_prompts: bool,
    ) -> Work {
        Work {
            seeds: (0..prompts.len()).map(|p| prompt_seed(seed, p)).collect(),
            prompts,
            config,
            stops,
            score_prompts,
            images: Vec::new(),
        }
    }

    fn text(&self, g: &Generation, stops: &[String]) -> String {
        completion_text(self.tokenizer, &g.tokens, stops)
    }

    /// The stop string a sample that stopped on one ended with.
    fn matched_stop(&self, g: &Generation, stops: &[String]) -> Option<String> {
        let text = self.tokenizer.decode(&g.tokens, false).unwrap_or_default();
        stops.iter().find(|s| text.contains(s.as_str())).cloned()
    }

    /// SGLang's `/generate`; also says whether the answer is a list (a batch of prompts).
    pub(crate) fn sglang_request(&self, request: &GenerateRequest) -> Result<(Work, bool), BadRequest> {
        let (prompts, batched) = match (&request.input_ids, &request.text) {
            (Some(ids), _) => (self.prompts(ids, "input_ids")?, ids.is_batch()),
            (None, Some(text)) => (self.prompts(text, "text")?, text.is_batch()),
            (None, None) => return Err(bad("give `input_ids` (token ids, or a list of them) or `text`")),
        };
        let sampling = match &request.sampling_params {
            None => Sampling::default(),
            Some(SamplingParamsField::One(params)) => params.sampling(),
            Some(SamplingParamsField::PerPrompt(_)) => {
                return Err(bad(
                    "per-prompt `sampling_params` lists are not supported; send one request per prompt",
                ));
            }
        };
        let (config, stops, seed) = self.config(&sampling, true, 0, &prompts)?;
        Ok((Self::work(prompts, config, stops, seed, false), batched))
    }

    /// SGLang's answer: one object per sample (a list when there is more than one).
    pub(crate) fn sglang_response(&self, work: &Work, done: &Done, batched: bool, logprobs: bool) -> GenerateResponse {
        let mut outputs: Vec<GenerateOutput> = (done.generations.iter())
            .map(|g| {
                let finish = match g.finish {
                    FinishReason::Length => SglangFinish::Length { length: g.tokens.len() },
                    FinishReason::StopToken => SglangFinish::Stop {
                        matched: g.tokens.last().map(|&t| Matched::Token(t)),
                    },
                    FinishReason::StopCondition => SglangFinish::Stop {
                        matched: self.matched_stop(g, &work.stops).map(Matched::Text),
                    },
                };
                let output_token_logprobs = logprobs.then(|| {
                    (g.logprobs.iter().zip(&g.tokens))
                        .map(|(&lp, &id)| LogprobEntry(Some(lp), id, None))
                        .collect()
                });
                GenerateOutput {
                    text: Some(self.text(g, &work.stops)),
                    output_ids: g.tokens.clone(),
                    meta_info: MetaInfo {
                        id: format!("{}-{}", g.prompt, g.sample),
                        finish_reason: Some(finish),
                        prompt_tokens: work.prompts[g.prompt].len(),
                        completion_tokens: g.tokens.len(),
                        weight_version: Some(done.version.clone()),
                        output_token_logprobs,
                    },
                }
            })
            .collect();
        match outputs.len() == 1 && !batched {
            true => GenerateResponse::One(outputs.remove(0)),
            false => GenerateResponse::Many(outputs),
        }
    }

    /// OpenAI's `/v1/completions` (vLLM's `return_token_ids` too).
    pub(crate) fn completion_request(&self, request: &CompletionRequest) -> Result<Work, BadRequest> {
        refuse_streaming(request.stream)?;
        let top = top_logprobs("logprobs", request.logprobs)?;
        let prompts = self.prompts(&request.prompt, "prompt")?;
        let (config, stops, seed) = self.config(&request.sampling(), false, top, &prompts)?;
        // The prompts are scored only when log-probabilities are asked for; `echo` alone is text.
        let score_prompts = request.echo == Some(true) && request.logprobs.is_some();
        Ok(Self::work(prompts, config, stops, seed, score_prompts))
    }

    /// OpenAI's completion object.
    pub(crate) fn completion_response(
        &self,
        request: &CompletionRequest,
        work: &Work,
        done: &Done,
    ) -> CompletionResponse {
        let token_ids = request.return_token_ids == Some(true);
        let prompt_texts = (request.echo == Some(true)).then(|| self.prompt_texts(&request.prompt, &work.prompts));
        let choices = (done.generations.iter().enumerate())
            .map(|(index, g)| CompletionChoice {
                index,
                text: match &prompt_texts {
                    Some(texts) => texts[g.prompt].clone() + &self.text(g, &work.stops),
                    None => self.text(g, &work.stops),
                },
                logprobs: request.logprobs.map(|_| self.completion_logprobs(work, done, g)),
                finish_reason: Some(finish_name(g.finish).into()),
                stop_reason: self.stop_reason(g, &work.stops),
                token_ids: token_ids.then(|| g.tokens.clone()),
                prompt_token_ids: token_ids.then(|| work.prompts[g.prompt].clone()),
            })
            .collect();
        CompletionResponse {
            id: format!("cmpl-{}", work.config.seed),
            object: "text_completion".into(),
            created: now(),
            model: self.model_name.into(),
            system_fingerprint: Some(format!("rein-weights-{}", done.version)),
            choices,
            usage: Some(usage(work, done)),
        }
    }

    /// The prompts as text, as `echo` returns them: a text prompt as sent, token ids decoded.
    fn prompt_texts(&self, sent: &Prompts, ids: &[Vec<u32>]) -> Vec<String> {
        let decoded = |ids: &[u32]| self.tokenizer.decode(ids, false).unwrap_or_default();
        match sent {
            Prompts::Text(text) => vec![text.clone()],
            Prompts::Ids(ids) => vec![decoded(ids)],
            Prompts::Batch(items) => (items.iter().zip(ids))
                .map(|(item, ids)| match item {
                    Prompt::Text(text) => text.clone(),
                    Prompt::Ids(_) => decoded(ids),
                })
                .collect(),
        }
    }

    /// A sample's tokens (after its prompt's, with `echo`), their log-probabilities, the most
    /// likely alternatives at each (when `logprobs` ≥ 1: those and the token itself, as vLLM) and
    /// their offsets in the text. The first prompt token has no log-probability (`null`).
    fn completion_logprobs(&self, work: &Work, done: &Done, g: &Generation) -> CompletionLogprobs {
        let with_top = work.config.top_logprobs > 0;
        let mut ids = Vec::new();
        let mut token_logprobs = Vec::new();
        let mut top = Vec::new();
        if work.score_prompts {
            let prompt = &work.prompts[g.prompt];
            ids.extend(prompt);
            token_logprobs.push(None);
            top.push(None);
            for (&id, scored) in prompt[1..].iter().zip(&done.prompt_logprobs[g.prompt]) {
                token_logprobs.push(Some(scored.logprob));
                top.push(Some(self.top_map(id, scored.logprob, &scored.top)));
            }
        }
        ids.extend(&g.tokens);
        token_logprobs.extend(g.logprobs.iter().map(|&lp| Some(lp)));
        for (i, (&id, &logprob)) in g.tokens.iter().zip(&g.logprobs).enumerate() {
            let alternatives = g.top_logprobs.get(i).map_or(&[][..], Vec::as_slice);
            top.push(Some(self.top_map(id, logprob, alternatives)));
        }
        let tokens: Vec<String> = ids.iter().map(|&id| self.tokenizer.piece(id)).collect();
        let text_offset = (tokens.iter())
            .scan(0, |offset, piece| {
                let at = *offset;
                *offset += piece.len();
                Some(at)
            })
            .collect();
        CompletionLogprobs {
            tokens,
            token_logprobs,
            top_logprobs: with_top.then_some(top),
            text_offset,
        }
    }

    /// One position's alternatives by text, the token itself included.
    fn top_map(&self, id: u32, logprob: f32, alternatives: &[(u32, f32)]) -> BTreeMap<String, f32> {
        let mut map: BTreeMap<String, f32> = (alternatives.iter())
            .map(|&(alt, lp)| (self.tokenizer.piece(alt), lp))
            .collect();
        map.entry(self.tokenizer.piece(id)).or_insert(logprob);
        map
    }

    /// vLLM's `stop_reason`: the stop token id, the stop string, or none (end of sequence, or
    /// the length limit).
    fn stop_reason(&self, g: &Generation, stops: &[String]) -> Option<StopReason> {
        match g.finish {
            FinishReason::Length => None,
            FinishReason::StopToken => {
                let last = *g.tokens.last()?;
                (!self.tokenizer.eos_ids().contains(&last)).then_some(StopReason::Token(last))
            }
            FinishReason::StopCondition => self.matched_stop(g, stops).map(StopReason::Text),
        }
    }

    /// OpenAI's `/v1/chat/completions`: the messages through the model's chat template.
    pub(crate) fn chat_request(&self, request: &ChatRequest) -> Result<Work, BadRequest> {
        refuse_streaming(request.stream)?;
        let top = top_logprobs("top_logprobs", request.top_logprobs)?;
        if top > 0 && request.logprobs != Some(true) {
            return Err(bad("`top_logprobs` needs `logprobs` = true"));
        }
        if request.messages.is_empty() {
            return Err(bad("`messages` is empty: give at least one message"));
        }
        let tools = request.tools.clone().unwrap_or_default();
        let urls: Vec<&str> = (request.messages.iter())
            .flat_map(|m| m.content.iter().flat_map(MessageContent::image_urls))
            .collect();
        let (text, images) = match urls.is_empty() {
            true => {
                let messages: Vec<ChatMessage> = (request.messages.iter())
                    .map(|m| ChatMessage {
                        role: m.role.clone(),
                        content: m.content.as_ref().map(|c| c.text()).unwrap_or_default(),
                    })
                    .collect();
                let text = self.tokenizer.apply_chat_template_with_tools(&messages, &tools, true);
                (text.map_err(|e| bad(e.to_string()))?, Vec::new())
            }
            false => self.chat_with_images(request, &urls, &tools)?,
        };
        let text = text.ok_or_else(|| bad("the served model's tokenizer has no chat template"))?;
        let prompts = self.prompts(&Prompts::Text(text), "messages")?;
        let (config, stops, seed) = self.config(&request.sampling(), false, top, &prompts)?;
        let mut work = Self::work(prompts, config, stops, seed, false);
        work.images = images;
        Ok(work)
    }

    /// A chat whose messages hold the images at `urls`: the images read and processed, the
    /// messages rendered with their content as parts (`{"type": "image"}` for each image, a text
    /// message as one text part), as vision-language templates read them, and each image's
    /// marker expanded to its tokens.
    fn chat_with_images(
        &self,
        request: &ChatRequest,
        urls: &[&str],
        tools: &[Value],
    ) -> Result<(Option<String>, Vec<ProcessedImage>), BadRequest> {
        let served = self
            .images
            .ok_or_else(|| bad("the served model reads no images: image_url parts are for a vision-language model"))?;
        if urls.len() > served.max_images {
            return Err(bad(format!(
                "this request has {} images; this server reads at most {} (--limit-images-per-prompt)",
                urls.len(),
                served.max_images
            )));
        }
        let images = (urls.iter().enumerate())
            .map(|(i, url)| served.read(url).map_err(|e| bad(format!("image {i}: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let part = |p: &ContentPart| match (&p.image_url, &p.text) {
            (Some(_), _) => Some(json!({"type": "image"})),
            (None, Some(text)) => Some(json!({"type": "text", "text": text})),
            (None, None) => None,
        };
        let messages: Vec<Value> = (request.messages.iter())
            .map(|m| {
                let content: Vec<Value> = match &m.content {
                    None => Vec::new(),
                    Some(MessageContent::Text(text)) => vec![json!({"type": "text", "text": text})],
                    Some(MessageContent::Parts(parts)) => parts.iter().filter_map(part).collect(),
                };
                json!({"role": m.role, "content": content})
            })
            .collect();
        let text =
            (self.tokenizer.apply_chat_template_to_json(&messages, tools, true)).map_err(|e| bad(e.to_string()))?;
        let text = (text.map(|t| served.processor.expand_prompt(&t, &images)).transpose()).map_err(bad)?;
        Ok((text, images))
    }

    /// OpenAI's chat completion object.
    pub(crate) fn chat_response(&self, request: &ChatRequest, work: &Work, done: &Done) -> ChatResponse {
        let want_logprobs = request.logprobs == Some(true);
        let choices = (done.generations.iter().enumerate())
            .map(|(index, g)| {
                let logprobs = want_logprobs.then(|| ChatLogprobs {
                    content: (g.tokens.iter().zip(&g.logprobs).enumerate())
                        .filter(|(_, (id, _))| !work.config.stop_token_ids.contains(id))
                        .map(|(i, (&id, &logprob))| {
                            let token = self.tokenizer.piece(id);
                            let alternatives = g.top_logprobs.get(i).map_or(&[][..], Vec::as_slice);
                            TokenLogprob {
                                bytes: token.as_bytes().to_vec(),
                                token,
                                logprob,
                                top_logprobs: (alternatives.iter())
                                    .map(|&(alt, logprob)| {
                                        let token = self.tokenizer.piece(alt);
                                        TopLogprob {
                                            bytes: Some(token.as_bytes().to_vec()),
                                            token,
                                            logprob,
                                        }
                                    })
                                    .collect(),
                            }
                        })
                        .collect(),
                });
                ChatChoice {
                    index,
                    message: ChatResponseMessage {
                        role: "assistant".into(),
                        content: Some(self.text(g, &work.stops)),
                    },
                    logprobs,
                    finish_reason: Some(finish_name(g.finish).into()),
                }
            })
            .collect();
        ChatResponse {
            id: format!("chatcmpl-{}", work.config.seed),
            object: "chat.completion".into(),
            created: now(),
            model: self.model_name.into(),
            system_fingerprint: Some(format!("rein-weights-{}", done.version)),
            choices,
            usage: Some(usage(work, done)),
        }
    }
}

/// Refuses streaming, which rein does not implement, rather than ignoring it.
fn refuse_streaming(stream: Option<bool>) -> Result<(), BadRequest> {
    match stream == Some(true) {
        true => Err(bad("streaming is not supported; send stream = false")),
        false => Ok(()),
    }
}

/// Most alternatives returned per position (vLLM's default `max_logprobs`).
const MAX_TOP_LOGPROBS: u32 = 20;

/// How many of the most likely tokens `key` asks for at each position.
fn top_logprobs(key: &str, asked: Option<u32>) -> Result<usize, BadRequest> {
    match asked.unwrap_or(0) {
        k if k <= MAX_TOP_LOGPROBS => Ok(k as usize),
        k => Err(bad(format!(
            "`{key}` = {k} asks for more alternatives than rein serve returns (at most {MAX_TOP_LOGPROBS})"
        ))),
    }
}

fn finish_name(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Length => "length",
        FinishReason::StopToken | FinishReason::StopCondition => "stop",
    }
}

fn usage(work: &Work, done: &Done) -> Usage {
    let prompt_tokens: usize = work.prompts.iter().map(Vec::len).sum();
    let completion_tokens: usize = done.generations.iter().map(|g| g.tokens.len()).sum();
    Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
