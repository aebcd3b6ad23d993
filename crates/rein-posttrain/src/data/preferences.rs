//! Preference data: a prompt with a preferred (`chosen`) and a dispreferred (`rejected`)
//! completion, in TRL's formats.
//!
//! - Plain: `{"prompt": "…", "chosen": "…", "rejected": "…"}`.
//! - Conversational: `prompt` a list of `{"role", "content"}` messages, `chosen` and `rejected`
//!   each a list holding the assistant's message.
//! - Implicit prompt: no `prompt` column, `chosen` and `rejected` whole conversations; the
//!   messages they share are the prompt (TRL's `maybe_extract_prompt`).
//!
//! An optional `margin` column says by how much `chosen` is preferred (reward-model training).
//! Rows that cannot train (a missing or empty completion, the two completions the same, a
//! prompt that fills `max_length` alone) are skipped and reported by row, never fatal.

use std::path::Path;

use rein_model::lm::{ChatMessage, LmTokenizer};
use rein_recipe::{DataSection, Fields};
use serde_json::Value;

use crate::data::{DataError, Example, Row, read_rows};
use crate::opening_messages;
use crate::rollout::transcript::TranscriptError;

/// One preference row as read.
#[derive(Debug, Clone, PartialEq)]
pub struct PreferenceExample {
    /// The prompt's messages (a plain prompt is one user message).
    pub prompt: Vec<ChatMessage>,
    /// The preferred completion.
    pub chosen: String,
    /// The dispreferred completion.
    pub rejected: String,
    /// How much `chosen` is preferred, when the data says.
    pub margin: Option<f32>,
    /// Where the row came from (`pairs.jsonl (row 3)`), for messages.
    pub row: String,
}

/// A row left out of training, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Skipped {
    /// Where the row came from.
    pub row: String,
    /// Why it cannot train.
    pub reason: String,
}

/// A pair ready to train on: the prompt's tokens (chat template applied) and each completion's,
/// end-of-sequence token included.
#[derive(Debug, Clone, PartialEq)]
pub struct PreferencePair {
    /// The prompt's tokens.
    pub prompt: Vec<u32>,
    /// The preferred completion's tokens.
    pub chosen: Vec<u32>,
    /// The dispreferred completion's tokens.
    pub rejected: Vec<u32>,
    /// The data's margin (0 without one).
    pub margin: f32,
}

impl PreferencePair {
    /// The pair as an SFT example: the prompt with the chosen completion as its target.
    pub fn chosen_prompt(&self) -> crate::Prompt {
        crate::Prompt {
            text: String::new(),
            tokens: self.prompt.clone(),
            answer: None,
            target: Some(self.chosen.clone()),
            target_trained: None,
            metadata: String::new(),
            source: String::new(),
            images: Default::default(),
            image_files: Default::default(),
        }
    }
}

/// Reads the preference rows of `path` (`.jsonl` or `.parquet`); rows that cannot train are
/// returned apart, each with its reason.
pub fn read_preferences(path: &Path, fields: &Fields) -> Result<(Vec<PreferenceExample>, Vec<Skipped>), DataError> {
    let rows = read_rows(path)?;
    let (mut examples, mut skipped) = (Vec::new(), Vec::new());
    for (i, mut row) in rows.into_iter().enumerate() {
        let name = format!("{} (row {})", path.display(), i + 1);
        match preference(&mut row, fields) {
            Ok((prompt, chosen, rejected, margin)) => examples.push(PreferenceExample {
                prompt,
                chosen,
                rejected,
                margin,
                row: name,
            }),
            Err(reason) => skipped.push(Skipped { row: name, reason }),
        }
    }
    Ok((examples, skipped))
}

type Parts = (Vec<ChatMessage>, String, String, Option<f32>);

/// A row's prompt, completions and margin, or why it has none.
pub(super) fn preference(row: &mut Row, fields: &Fields) -> Result<Parts, String> {
    let mut take = |column: &str| row.remove(column).filter(|v| !v.is_null());
    let (prompt, chosen, rejected) = (take(&fields.prompt), take(&fields.chosen), take(&fields.rejected));
    let margin = match take(&fields.margin) {
        None => None,
        Some(value) => Some(
            value
                .as_f64()
                .filter(|m| m.is_finite())
                .ok_or_else(|| format!("`{}` is {value}, not a finite number", fields.margin))? as f32,
        ),
    };
    let chosen = chosen.ok_or_else(|| format!("no `{}` completion", fields.chosen))?;
    let rejected = rejected.ok_or_else(|| format!("no `{}` completion", fields.rejected))?;
    let (prompt, chosen, rejected) = match prompt {
        Some(prompt) => (prompt_messages(prompt)?, chosen, rejected),
        None => implicit_prompt(chosen, rejected, fields)?,
    };
    let chosen = completion(chosen, &fields.chosen)?;
    let rejected = completion(rejected, &fields.rejected)?;
    if chosen == rejected {
        return Err(format!(
            "`{}` and `{}` are the same completion: the pair prefers nothing",
            fields.chosen, fields.rejected
        ));
    }
    Ok((prompt, chosen, rejected, margin))
}

/// A prompt column: text (one user message) or a list of messages.
pub(super) fn prompt_messages(value: Value) -> Result<Vec<ChatMessage>, String> {
    match value {
        Value::String(text) if text.trim().is_empty() => Err("the prompt is empty".into()),
        Value::String(text) => Ok(opening_messages(&text, None)),
        other => messages(other)
            .filter(|m| !m.is_empty())
            .ok_or_else(|| "the prompt is neither text nor a list of {\"role\", \"content\"} messages".to_string()),
    }
}

fn messages(value: Value) -> Option<Vec<ChatMessage>> {
    serde_json::from_value(value).ok()
}

/// TRL's implicit prompt: the messages `chosen` and `rejected` start with in common.
fn implicit_prompt(
    chosen: Value,
    rejected: Value,
    fields: &Fields,
) -> Result<(Vec<ChatMessage>, Value, Value), String> {
    let (Some(chosen), Some(rejected)) = (messages(chosen), messages(rejected)) else {
        return Err(format!(
            "no `{}` column, and the completions are not conversations to take the prompt from",
            fields.prompt
        ));
    };
    let shared = chosen.iter().zip(&rejected).take_while(|(c, r)| c == r).count();
    if shared == 0 {
        return Err(format!(
            "no `{}` column, and the conversations share no opening messages",
            fields.prompt
        ));
    }
    let rest = |messages: &[ChatMessage]| serde_json::to_value(messages).expect("messages serialise");
    Ok((
        chosen[..shared].to_vec(),
        rest(&chosen[shared..]),
        rest(&rejected[shared..]),
    ))
}

/// A completion column: text, or a list holding one assistant message.
pub(super) fn completion(value: Value, column: &str) -> Result<String, String> {
    let text = match value {
        Value::String(text) => text,
        other => match messages(other).as_deref() {
            Some([message]) if message.role == "assistant" => message.content.clone(),
            Some(_) => return Err(format!("`{column}` is not one assistant message")),
            None => return Err(format!("`{column}` is neither text nor a list of messages")),
        },
    };
    match text.trim().is_empty() {
        true => Err(format!("`{column}` is empty")),
        false => Ok(text),
    }
}

/// Preference rows made from examples that have a target completion: `chosen` the target,
/// `rejected` what `reject` makes of the example (`None`: the example makes no pair).
pub fn pairs_from_examples(
    examples: &[Example],
    mut reject: impl FnMut(&Example) -> Option<String>,
) -> Vec<PreferenceExample> {
    (examples.iter().enumerate())
        .filter_map(|(i, e)| {
            Some(PreferenceExample {
                prompt: opening_messages(&e.prompt, None),
                chosen: e.completion.clone()?,
                rejected: reject(e)?,
                margin: None,
                row: format!("generated example {}", i + 1),
            })
        })
        .collect()
}

/// Tokenizes the pairs: the prompt through the chat template (when the data asks and the
/// tokenizer has one), each completion followed by the end-of-sequence token and cut to fit
/// `max_length` tokens with the prompt. Pairs whose prompt alone reaches `max_length`, or
/// whose completions tokenize the same, are skipped.
pub fn prepare_preferences(
    examples: &[PreferenceExample],
    tokenizer: &LmTokenizer,
    data: &DataSection,
    max_length: usize,
) -> Result<(Vec<PreferencePair>, Vec<Skipped>), TranscriptError> {
    let (mut pairs, mut skipped) = (Vec::new(), Vec::new());
    for e in examples {
        let prompt = prompt_tokens(&e.prompt, tokenizer, data)?;
        let Some(room) = room_after(&prompt, max_length) else {
            skipped.push(no_room(&e.row, &prompt, max_length));
            continue;
        };
        let (chosen, rejected) = (
            completion_tokens(&e.chosen, tokenizer, room)?,
            completion_tokens(&e.rejected, tokenizer, room)?,
        );
        if chosen == rejected {
            skipped.push(Skipped {
                row: e.row.clone(),
                reason: format!("the completions are the same in their first {room} tokens"),
            });
            continue;
        }
        pairs.push(PreferencePair {
            prompt,
            chosen,
            rejected,
            margin: e.margin.unwrap_or(0.0),
        });
    }
    Ok((pairs, skipped))
}

/// A preference row's prompt as tokens: the data's system prompt first (unless the row has
/// one), through the chat template when the data asks and the tokenizer has one, else the
/// messages' texts joined by lines.
pub(super) fn prompt_tokens(
    prompt: &[ChatMessage],
    tokenizer: &LmTokenizer,
    data: &DataSection,
) -> Result<Vec<u32>, TranscriptError> {
    let mut messages = prompt.to_vec();
    if let Some(system) = &data.system_prompt
        && messages.first().is_none_or(|m| m.role != "system")
    {
        messages.insert(0, opening_messages("", Some(system)).remove(0));
    }
    let text = match data.chat_template && tokenizer.has_chat_template() {
        true => tokenizer.apply_chat_template_with_tools(&messages, &[], true)?,
        false => None,
    };
    let text = text.unwrap_or_else(|| {
        messages
            .iter()
            .map(|m| m.content.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    });
    Ok(tokenizer.encode_prompt(&text)?)
}

/// The tokens `max_length` leaves a completion after `prompt`, or `None` when it leaves none.
pub(super) fn room_after(prompt: &[u32], max_length: usize) -> Option<usize> {
    max_length.checked_sub(prompt.len()).filter(|&room| room > 0)
}

/// Why a row whose prompt fills `max_length` is skipped.
pub(super) fn no_room(row: &str, prompt: &[u32], max_length: usize) -> Skipped {
    Skipped {
        row: row.to_string(),
        reason: format!(
            "the prompt is {} tokens, and max_length ({max_length}) leaves no room for a completion",
            prompt.len()
        ),
    }
}

/// A completion's tokens with the end-of-sequence token, cut to `room`.
pub(super) fn completion_tokens(text: &str, tokenizer: &LmTokenizer, room: usize) -> Result<Vec<u32>, TranscriptError> {
    let mut ids = tokenizer.encode(text)?;
    ids.extend(tokenizer.eos_ids().first().copied());
    ids.truncate(room);
    Ok(ids)
}

/// Prints one line per skipped row (the first 20, then a count).
pub fn report_skipped(skipped: &[Skipped]) {
    const SHOWN: usize = 20;
    for s in skipped.iter().take(SHOWN) {
        eprintln!("skipped data row {}: {}", s.row, s.reason);
    }
    if skipped.len() > SHOWN {
        eprintln!("… and {} more skipped data rows", skipped.len() - SHOWN);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn read(rows: &[Value]) -> (Vec<PreferenceExample>, Vec<Skipped>) {
        let dir = std::env::temp_dir().join(format!("rein-preferences-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("p{}.jsonl", rows.len()));
        let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
        std::fs::write(&path, text).unwrap();
        read_preferences(&path, &Fields::default()).unwrap()
    }

    #[test]
    fn plain_conversational_and_implicit_prompts_read_the_same() {
        let user = json!({"role": "user", "content": "2+2?"});
        let say = |text: &str| json!([{"role": "assistant", "content": text}]);
        let (examples, skipped) = read(&[
            json!({"prompt": "2+2?", "chosen": "4", "rejected": "5", "margin": 0.5}),
            json!({"prompt": [user], "chosen": say("4"), "rejected": say("5")}),
            json!({"chosen": [user, say("4")[0]], "rejected": [user, say("5")[0]]}),
        ]);
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(examples.len(), 3);
        for e in &examples {
            assert_eq!(e.prompt, opening_messages("2+2?", None));
            assert_eq!((e.chosen.as_str(), e.rejected.as_str()), ("4", "5"));
        }
        assert_eq!(examples[0].margin, Some(0.5));
        assert_eq!(examples[1].margin, None);
    }

    #[test]
    fn rows_that_cannot_train_are_skipped_by_name() {
        let (examples, skipped) = read(&[
            json!({"prompt": "a", "chosen": "x"}),
            json!({"prompt": "a", "chosen": "  ", "rejected": "y"}),
            json!({"prompt": "a", "chosen": "same", "rejected": "same"}),
            json!({"prompt": "a", "chosen": "x", "rejected": "y", "margin": "big"}),
            json!({"chosen": "x", "rejected": "y"}),
            json!({"prompt": "a", "chosen": "x", "rejected": "y"}),
        ]);
        assert_eq!(examples.len(), 1);
        let reasons: Vec<String> = skipped.iter().map(|s| format!("{}: {}", s.row, s.reason)).collect();
        assert_eq!(reasons.len(), 5, "{reasons:?}");
        assert!(reasons[0].ends_with("(row 1): no `rejected` completion"), "{reasons:?}");
        assert!(reasons[1].ends_with("(row 2): `chosen` is empty"), "{reasons:?}");
        assert!(
            reasons[2].contains("(row 3): `chosen` and `rejected` are the same"),
            "{reasons:?}"
        );
        assert!(reasons[3].contains("(row 4): `margin` is \"big\""), "{reasons:?}");
        assert!(reasons[4].contains("(row 5): no `prompt` column"), "{reasons:?}");
    }

    #[test]
    fn long_prompts_are_skipped_and_long_completions_cut() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes/assets/arithmetic-tokenizer");
        let tokenizer = LmTokenizer::load(&dir, &[]).unwrap();
        let data: DataSection = toml::from_str("chat_template = false").unwrap();
        let example = |prompt: &str, chosen: &str, rejected: &str| PreferenceExample {
            prompt: opening_messages(prompt, None),
            chosen: chosen.into(),
            rejected: rejected.into(),
            margin: None,
            row: format!("row {prompt}"),
        };
        let examples = [
            example("12", "3456789", "9456789"),
            example("1234567890", "1", "2"),
            example("12", "3456789", "3456789000"),
        ];
        let prompt_len = tokenizer.encode("12").unwrap().len();
        let (pairs, skipped) = prepare_preferences(&examples, &tokenizer, &data, prompt_len + 4).unwrap();
        assert_eq!(pairs.len(), 1);
        assert_eq!(pairs[0].chosen.len(), 4);
        assert_eq!(pairs[0].prompt.len() + pairs[0].chosen.len(), prompt_len + 4);
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(skipped[0].reason.contains("leaves no room"), "{skipped:?}");
        assert!(
            skipped[1].reason.contains("the same in their first 4 tokens"),
            "{skipped:?}"
        );
    }
}
