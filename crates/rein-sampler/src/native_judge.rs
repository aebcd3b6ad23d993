//! A judge model in process: the [`Judge`] a recipe grants a reward plugin
//! (`[[reward]] judge = {…}`), running on the native sampler.
//!
//! Each request's conversation goes through the judge's chat template (with the generation
//! prompt); requests with the same sampling settings are generated in one batch, each from the
//! stream its own seed names ([`crate::generate_seeded`]), so an answer does not depend on
//! what else was asked with it. Each answer token's log-probability is at temperature 1, as
//! inference servers report them: the sampler's own when it sampled greedily or at temperature 1
//! and no alternatives were asked for, else read back through one forward pass of the model,
//! which also gives the most likely alternatives at each position.

use std::time::Instant;

use crate::{FinishReason, GenerationConfig, generate_seeded, stop_check};
use burn::module::Module;
use burn::tensor::activation::log_softmax;
use rein_core::{Judge, JudgeError, JudgeRequest, JudgedToken, Judgement};
use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, ChatMessage, LmTokenizer};

/// A causal language model answering judge requests (see the module docs).
pub struct NativeJudge<B: ReinBackend> {
    model: CausalLm<B>,
    tokenizer: LmTokenizer,
    name: String,
    device: B::Device,
}

impl<B: ReinBackend> NativeJudge<B> {
    /// A judge running `model` with `tokenizer`; `name` names it in logs.
    pub fn new(model: CausalLm<B>, tokenizer: LmTokenizer, name: &str, device: &B::Device) -> Self {
        Self {
            // A judge only reads the model: no autodiff graph, whatever the backend.
            model: model.no_grad(),
            tokenizer,
            name: name.into(),
            device: device.clone(),
        }
    }

    /// The request's conversation rendered for the model, as token ids.
    fn prompt(&self, request: &JudgeRequest) -> Result<Vec<u32>, JudgeError> {
        let messages: Vec<ChatMessage> = request.messages.iter().cloned().map(ChatMessage::from).collect();
        let failed = |e: rein_model::lm::LoadError| JudgeError::Failed { reason: e.to_string() };
        let text = match self.tokenizer.apply_chat_template(&messages, true).map_err(failed)? {
            Some(text) => text,
            // Without a template, the turns one after another.
            None => request
                .messages
                .iter()
                .map(|m| m.content.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
        };
        let ids = self.tokenizer.encode(&text).map_err(failed)?;
        if ids.is_empty() {
            let reason = "the conversation renders to no tokens".into();
            return Err(JudgeError::InvalidRequest { reason });
        }
        Ok(ids)
    }

    /// The log-probability of each of `answer`'s tokens after `prompt`, and the `top` most
    /// likely tokens at each of its positions.
    fn read_back(&self, prompt: &[u32], answer: &[u32], top: usize) -> Vec<JudgedToken> {
        if answer.is_empty() {
            return Vec::new();
        }
        let ids: Vec<u32> = prompt.iter().chain(answer).copied().collect();
        let hidden = self.model.padded_hidden(&[ids], 0, &self.device);
        // Position p's logits predict token p + 1: the answer's tokens are predicted from the
        // prompt's last position on.
        let rows = hidden.narrow(1, prompt.len() - 1, answer.len());
        let logprobs = log_softmax(self.model.logits(rows), 2);
        let vocab = logprobs.dims()[2];
        let values: Vec<f32> = logprobs.into_data().convert::<f32>().to_vec().unwrap_or_default();
        let text = |id: usize| self.tokenizer.piece(id as u32);
        (answer.iter().enumerate())
            .map(|(p, &token)| {
                let row = &values[p * vocab..(p + 1) * vocab];
                let mut order: Vec<usize> = (0..vocab).collect();
                let top = top.min(vocab);
                if top > 0 {
                    order.select_nth_unstable_by(top - 1, |&a, &b| row[b].total_cmp(&row[a]));
                    order.truncate(top);
                    order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
                } else {
                    order.clear();
                }
                JudgedToken {
                    text: text(token as usize),
                    logprob: row[token as usize],
                    top: order.into_iter().map(|id| (text(id), row[id])).collect(),
                }
            })
            .collect()
    }
}

impl<B: ReinBackend> Judge for NativeJudge<B>
where
    CausalLm<B>: Send,
{
    fn judge(
        &mut self,
        requests: &[JudgeRequest],
        deadline: Instant,
        limit_ms: u32,
    ) -> Vec<Result<Judgement, JudgeError>> {
        let mut answers: Vec<Option<Result<Judgement, JudgeError>>> = vec![None; requests.len()];
        let prompts: Vec<Result<Vec<u32>, JudgeError>> = requests.iter().map(|r| self.prompt(r)).collect();
        // Requests sampled alike go in one batch.
        let mut pending: Vec<usize> = (0..requests.len()).collect();
        while let Some(&first) = pending.first() {
            let like = |i: &usize| {
                let (a, b) = (&requests[first], &requests[*i]);
                a.max_new_tokens == b.max_new_tokens
                    && a.temperature.to_bits() == b.temperature.to_bits()
                    && a.stop == b.stop
            };
            let (batch, rest): (Vec<usize>, Vec<usize>) = pending.into_iter().partition(like);
            pending = rest;
            let mut ready = Vec::new();
            for &i in &batch {
                match &prompts[i] {
                    Ok(_) => ready.push(i),
                    Err(error) => answers[i] = Some(Err(error.clone())),
                }
            }
            if ready.is_empty() {
                continue;
            }
            let request = &requests[first];
            let config = GenerationConfig {
                max_new_tokens: request.max_new_tokens,
                temperature: request.temperature,
                n: 1,
                stop_token_ids: self.tokenizer.eos_ids().to_vec(),
                ..GenerationConfig::default()
            };
            let batch_prompts: Vec<Vec<u32>> = ready.iter().map(|&i| prompts[i].clone().unwrap_or_default()).collect();
            let seeds: Vec<u64> = ready.iter().map(|&i| requests[i].seed).collect();
            let mut stops = stop_check(&self.tokenizer, &request.stop);
            let mut cut = vec![false; ready.len()];
            let mut stop = |seq: usize, tokens: &[u32]| {
                if Instant::now() >= deadline {
                    cut[seq] = true;
                    return true;
                }
                stops(seq, tokens)
            };
            let pad = self.tokenizer.pad_id().unwrap_or(0);
            let generations = generate_seeded(
                &self.model,
                &batch_prompts,
                &seeds,
                &config,
                pad,
                &mut stop,
                &self.device,
            );
            for (k, generation) in generations.into_iter().enumerate() {
                let i = ready[k];
                if cut[k] {
                    answers[i] = Some(Err(JudgeError::Deadline { limit_ms }));
                    continue;
                }
                let finished = generation.finish != FinishReason::Length;
                let mut tokens = match requests[i].top_logprobs == 0 && [0.0, 1.0].contains(&request.temperature) {
                    // The sampler's log-probabilities are already at temperature 1.
                    true => (generation.tokens.iter().zip(&generation.logprobs))
                        .map(|(&token, &logprob)| JudgedToken {
                            text: self.tokenizer.piece(token),
                            logprob,
                            top: Vec::new(),
                        })
                        .collect(),
                    false => self.read_back(&batch_prompts[k], &generation.tokens, requests[i].top_logprobs),
                };
                // As servers report them: without the stop token that ended the answer.
                if generation.finish == FinishReason::StopToken {
                    tokens.pop();
                }
                let text = crate::completion_text(&self.tokenizer, &generation.tokens, &requests[i].stop);
                answers[i] = Some(Ok(Judgement { text, tokens, finished }));
            }
        }
        answers
            .into_iter()
            .map(|a| a.expect("every request answered"))
            .collect()
    }

    fn prompt_tokens(&self, request: &JudgeRequest) -> Result<usize, JudgeError> {
        self.prompt(request).map(|ids| ids.len())
    }

    fn describe(&self) -> String {
        format!("native: {}", self.name)
    }
}
