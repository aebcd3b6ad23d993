//! Prompts ready to sample from: a dataset's rows through the chat template, a target written
//! as a conversation turned into the transcript a multi-turn episode would produce, and the
//! data source each row names.

use std::path::{Path, PathBuf};

use crate::data::prompt_images::{PromptImageFiles, PromptImageReader, PromptPixels, chat_message, with_markers};
use crate::{DataError, Example, LmError};

use crate::rollout::transcript::{Transcript, TranscriptError};
use rein_core::Image;
use rein_model::lm::{ChatMessage, LmTokenizer};
use rein_model::vision::{ImageProcessor, ProcessedImage};

use rein_recipe::DataSection;

/// A prompt ready to sample from.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    /// The prompt as written in the data (what reward plugins see).
    pub text: String,
    /// Its tokens, chat template applied.
    pub tokens: Vec<u32>,
    /// The reference answer.
    pub answer: Option<String>,
    /// The target completion's tokens, end-of-sequence included (SFT).
    pub target: Option<Vec<u32>>,
    /// Which target tokens are the model's (trained on): all of a single-turn completion; a
    /// multi-turn trace's assistant turns but not its tool results.
    pub target_trained: Option<Vec<bool>>,
    /// Metadata JSON.
    pub metadata: String,
    /// The data source it came from (the `data.fields.source` column, verl's `data_source`);
    /// empty when the row names none.
    pub source: String,
    /// Its images, processed for the model's image side (its `tokens` hold their image
    /// tokens); empty for a text prompt.
    pub images: PromptPixels,
    /// The same images as their files hold them (what rewards that read images receive).
    pub image_files: PromptImageFiles,
}

/// The opening messages of a prompt: a system prompt (if any), then the user turn.
pub fn opening_messages(prompt: &str, system: Option<&str>) -> Vec<ChatMessage> {
    let system = system.iter().map(|system| ChatMessage {
        role: "system".into(),
        content: system.to_string(),
    });
    let user = ChatMessage {
        role: "user".into(),
        content: prompt.to_string(),
    };
    system.chain(std::iter::once(user)).collect()
}

/// A target completion written as a conversation (TRL's conversational format: a JSON list of
/// `{"role", "content"}` messages, assistant turns alternating with tool or user turns).
fn trace(completion: &str) -> Option<Vec<ChatMessage>> {
    if !completion.trim_start().starts_with('[') {
        return None;
    }
    let messages: Vec<ChatMessage> = serde_json::from_str(completion).ok()?;
    messages
        .first()
        .is_some_and(|m| m.role == "assistant")
        .then_some(messages)
}

/// Tokenizes examples: chat template (when the data asks and the tokenizer has one) offering
/// `tools`, target completions followed by the end-of-sequence token. A target written as a
/// conversation (see [`trace`]) becomes the transcript a multi-turn episode would produce:
/// the model's turns trained on, the tools' results appended as the template renders them and
/// masked. A row's images are read and processed by `images` (a vision-language model's), and
/// its `<image>` markers — one per image, or all at its start — expanded to their tokens; an
/// error names the row (`row N`, counted from 1) and the image.
pub fn prepare(
    examples: &[Example],
    tokenizer: &LmTokenizer,
    data: &DataSection,
    tools: &[serde_json::Value],
    images: Option<&PromptImageReader>,
) -> Result<Vec<Prompt>, LmError> {
    let eos = tokenizer.eos_ids().first().copied();
    let templated = data.chat_template && tokenizer.has_chat_template();
    let row_error = |i: usize, reason: String| DataError {
        path: format!("row {}", i + 1),
        reason,
    };
    let mut prompts = Vec::with_capacity(examples.len());
    for (i, e) in examples.iter().enumerate() {
        let opening = opening_messages(&e.prompt, data.system_prompt.as_deref());
        let trace = e.completion.as_deref().and_then(trace).filter(|_| templated);
        if let Some(messages) = trace {
            let shown = row_images(e, images).map_err(|reason| row_error(i, reason))?;
            let prompt =
                transcript_prompt(e, messages, (tokenizer, tools, data), shown).map_err(|error| match error {
                    LmError::Transcript(error) => row_error(i, error.to_string()).into(),
                    error => error,
                })?;
            prompts.push(prompt);
            continue;
        }
        let (text, pixels, files) = match (e.images.is_empty(), images) {
            (true, _) => {
                let text = match templated {
                    true => tokenizer
                        .apply_chat_template_with_tools(&opening, tools, true)?
                        .unwrap_or_else(|| e.prompt.clone()),
                    false => e.prompt.clone(),
                };
                (text, PromptPixels::default(), PromptImageFiles::default())
            }
            (false, None) => {
                let reason = "the row has images, but the model reads no images".into();
                return Err(row_error(i, reason).into());
            }
            (false, Some(reader)) => {
                let (pixels, files) = reader
                    .read_with_files(&e.images)
                    .map_err(|reason| row_error(i, reason))?;
                let marked = with_markers(&e.prompt, pixels.len()).map_err(|reason| row_error(i, reason))?;
                let text = match templated {
                    true => {
                        let system = opening.iter().filter(|m| m.role == "system");
                        let mut messages: Vec<serde_json::Value> =
                            system.map(|m| serde_json::json!({"role": "system", "content": [{"type": "text", "text": m.content}]})).collect();
                        messages.push(chat_message(&marked));
                        tokenizer
                            .apply_chat_template_to_json(&messages, tools, true)?
                            .unwrap_or(marked)
                    }
                    false => marked,
                };
                let expanded = reader.expand(&text, &pixels).map_err(|reason| row_error(i, reason))?;
                (expanded, pixels.into(), files.into())
            }
        };
        let target = match &e.completion {
            Some(c) => {
                let mut ids = tokenizer.encode(c)?;
                ids.extend(eos);
                Some(ids)
            }
            None => None,
        };
        prompts.push(Prompt {
            text: e.prompt.clone(),
            tokens: match templated {
                true => tokenizer.encode(&text)?,
                false => tokenizer.encode_prompt(&text)?,
            },
            answer: e.answer.clone(),
            target,
            target_trained: None,
            metadata: e.metadata.clone(),
            source: source_of(&e.metadata, &data.fields.source),
            images: pixels,
            image_files: files,
        });
    }
    Ok(prompts)
}

/// A row's images read for a vision-language model whose processor is `processor`.
struct RowImages<'a> {
    processor: &'a ImageProcessor,
    pixels: Vec<ProcessedImage>,
    files: Vec<Image>,
}

/// The images of row `e` read for a vision-language model's reader `images` (`None` for a
/// text model, whose rows must have none); an error says which image and why.
fn row_images<'r>(e: &Example, images: Option<&'r PromptImageReader>) -> Result<Option<RowImages<'r>>, String> {
    match images {
        None if !e.images.is_empty() => Err("the row has images, but the model reads no images".into()),
        None => Ok(None),
        Some(reader) => {
            let (pixels, files) = reader.read_with_files(&e.images)?;
            Ok(Some(RowImages {
                processor: &reader.processor,
                pixels,
                files,
            }))
        }
    }
}

/// The prompt of `e`, whose target is the conversation `messages` after its opening (the
/// data's system prompt and the row's prompt): the transcript a multi-turn episode offering
/// `tools` would produce, the model's turns trained on. A vision-language model's (`shown`)
/// renders it as its episodes do, the opening showing the row's images.
fn transcript_prompt(
    e: &Example,
    messages: Vec<ChatMessage>,
    (tokenizer, tools, data): (&LmTokenizer, &[serde_json::Value], &DataSection),
    shown: Option<RowImages<'_>>,
) -> Result<Prompt, LmError> {
    let eos = tokenizer.eos_ids().first().copied();
    let prompt = match shown.as_ref().map_or(0, |s| s.pixels.len()) {
        0 => e.prompt.clone(),
        count => with_markers(&e.prompt, count).map_err(TranscriptError::Images)?,
    };
    let opening = opening_messages(&prompt, data.system_prompt.as_deref());
    let (mut transcript, files) = match shown {
        Some(RowImages {
            processor,
            pixels,
            files,
        }) => (
            Transcript::open_with_images(tokenizer, opening, tools.to_vec(), processor, pixels)?,
            files,
        ),
        None => (Transcript::open(tokenizer, opening, tools.to_vec())?, Vec::new()),
    };
    for message in messages {
        match message.role.as_str() {
            "assistant" => {
                let mut ids = tokenizer.encode(&message.content)?;
                ids.extend(eos);
                transcript.push_model_turn(tokenizer, &ids, &vec![0.0; ids.len()])?;
            }
            _ => {
                transcript.push_env_messages(tokenizer, vec![message])?;
            }
        }
    }
    let at = transcript.prompt_len();
    Ok(Prompt {
        text: e.prompt.clone(),
        tokens: transcript.tokens()[..at].to_vec(),
        answer: e.answer.clone(),
        target: Some(transcript.tokens()[at..].to_vec()),
        target_trained: Some(transcript.sampled()[at..].to_vec()),
        metadata: e.metadata.clone(),
        source: source_of(&e.metadata, &data.fields.source),
        images: transcript.images().into(),
        image_files: files.into(),
    })
}

/// How metrics name a data source: rows without one are `unnamed`.
pub(crate) fn source_label(source: &str) -> &str {
    if source.is_empty() { "unnamed" } else { source }
}

/// The `column` of a row's metadata JSON as a source name (a number or other value as written;
/// empty when the row has no such column).
pub(crate) fn source_of(metadata: &str, column: &str) -> String {
    let Ok(serde_json::Value::Object(row)) = serde_json::from_str(metadata) else {
        return String::new();
    };
    match row.get(column) {
        None | Some(serde_json::Value::Null) => String::new(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// Where a run keeps the data it generated.
pub fn data_dir(run: Option<&Path>) -> Option<PathBuf> {
    run.map(|r| r.join("data"))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// A target written as a conversation becomes the transcript an episode would give: the
    /// assistant turns trained on (end-of-turn token included), the tool's answer and the
    /// template's text around it not.
    #[test]
    fn conversational_targets_train_on_the_assistant_turns_only() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes/assets/arithmetic-tokenizer");
        let tokenizer = LmTokenizer::load(&dir, &[]).unwrap();
        let data: DataSection = toml::from_str("").unwrap();
        let completion = serde_json::json!([
            {"role": "assistant", "content": "<tool_call>x</tool_call>"},
            {"role": "tool", "content": "408"},
            {"role": "assistant", "content": "<answer>408</answer>"},
        ]);
        let example = Example {
            prompt: "What is 12 * 34?".into(),
            answer: Some("408".into()),
            completion: Some(completion.to_string()),
            metadata: String::new(),
            images: Vec::new(),
        };
        let prompt = prepare(&[example], &tokenizer, &data, &[], None).unwrap().remove(0);
        let (target, trained) = (prompt.target.unwrap(), prompt.target_trained.unwrap());
        let text = |keep: bool| {
            let ids: Vec<u32> = (target.iter().zip(&trained))
                .filter(|(_, t)| **t == keep)
                .map(|(i, _)| *i)
                .collect();
            tokenizer.decode(&ids, false).unwrap()
        };
        assert_eq!(
            text(true),
            "<tool_call>x</tool_call><|im_end|><answer>408</answer><|im_end|>"
        );
        assert_eq!(
            text(false),
            "\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        );
    }
}
