//! Unpaired preference data: a prompt with one completion labelled desirable or undesirable,
//! in TRL's formats (what KTO learns from).
//!
//! - Unpaired: `{"prompt": "…", "completion": "…", "label": true}`; `prompt` text or messages,
//!   `completion` text or a list holding the assistant's message.
//! - Paired rows (`chosen`/`rejected`, every format of [`super::preferences`]) in the same file
//!   become two examples, the chosen one desirable and the rejected one not (TRL's
//!   `unpair_preference_dataset`).
//!
//! Rows that cannot train (no completion, a label that is not `true` or `false`, a prompt that
//! fills `max_length` alone) are skipped and reported by row, never fatal.

use std::path::Path;

use rein_model::lm::{ChatMessage, LmTokenizer};
use rein_recipe::{DataSection, Fields};

use crate::data::preferences::{
    PreferenceExample, Skipped, completion, completion_tokens, no_room, preference, prompt_messages, prompt_tokens,
    room_after,
};
use crate::data::{DataError, Row, read_rows};
use crate::rollout::transcript::TranscriptError;

/// One labelled completion as read.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelledExample {
    /// The prompt's messages (a plain prompt is one user message).
    pub prompt: Vec<ChatMessage>,
    /// The completion.
    pub completion: String,
    /// Whether the completion is desirable.
    pub desirable: bool,
    /// Where the row came from (`kto.jsonl (row 3)`), for messages.
    pub row: String,
}

/// A labelled completion ready to train on: the prompt's tokens (chat template applied) and the
/// completion's, end-of-sequence token included.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelledCompletion {
    /// The prompt's tokens.
    pub prompt: Vec<u32>,
    /// The completion's tokens.
    pub completion: Vec<u32>,
    /// Whether the completion is desirable.
    pub desirable: bool,
}

impl LabelledCompletion {
    /// The example as an SFT example: the prompt with its completion as the target.
    pub fn as_prompt(&self) -> crate::Prompt {
        crate::Prompt {
            text: String::new(),
            tokens: self.prompt.clone(),
            answer: None,
            target: Some(self.completion.clone()),
            target_trained: None,
            metadata: String::new(),
            source: String::new(),
            images: Default::default(),
            image_files: Default::default(),
        }
    }
}

/// Reads the labelled rows of `path` (`.jsonl` or `.parquet`), paired rows as two examples; rows
/// that cannot train are returned apart, each with its reason.
pub fn read_labelled(path: &Path, fields: &Fields) -> Result<(Vec<LabelledExample>, Vec<Skipped>), DataError> {
    let (mut examples, mut skipped) = (Vec::new(), Vec::new());
    for (i, mut row) in read_rows(path)?.into_iter().enumerate() {
        let name = format!("{} (row {})", path.display(), i + 1);
        let paired = row.contains_key(&fields.chosen) || row.contains_key(&fields.rejected);
        let read = match paired && !row.contains_key(&fields.label) {
            true => preference(&mut row, fields).map(|(prompt, chosen, rejected, _)| {
                unpair(PreferenceExample {
                    prompt,
                    chosen,
                    rejected,
                    margin: None,
                    row: name.clone(),
                })
                .to_vec()
            }),
            false => labelled(&mut row, fields, &name).map(|e| vec![e]),
        };
        match read {
            Ok(read) => examples.extend(read),
            Err(reason) => skipped.push(Skipped { row: name, reason }),
        }
    }
    Ok((examples, skipped))
}

/// An unpaired row's prompt, completion and label, or why it has none.
fn labelled(row: &mut Row, fields: &Fields, name: &str) -> Result<LabelledExample, String> {
    let mut take = |column: &str| row.remove(column).filter(|v| !v.is_null());
    let (prompt, text, label) = (take(&fields.prompt), take(&fields.completion), take(&fields.label));
    let prompt = prompt.ok_or_else(|| format!("no `{}` column", fields.prompt))?;
    let text = text.ok_or_else(|| format!("no `{}` column", fields.completion))?;
    let label = label.ok_or_else(|| format!("no `{}` column", fields.label))?;
    let desirable = label
        .as_bool()
        .ok_or_else(|| format!("`{}` is {label}, not true or false", fields.label))?;
    Ok(LabelledExample {
        prompt: prompt_messages(prompt)?,
        completion: completion(text, &fields.completion)?,
        desirable,
        row: name.to_string(),
    })
}

/// A preference pair as two labelled examples: its chosen completion desirable, its rejected one
/// not.
pub fn unpair(pair: PreferenceExample) -> [LabelledExample; 2] {
    let example = |completion: String, desirable: bool, which: &str| LabelledExample {
        prompt: pair.prompt.clone(),
        completion,
        desirable,
        row: format!("{}, {which}", pair.row),
    };
    [
        example(pair.chosen.clone(), true, "chosen"),
        example(pair.rejected.clone(), false, "rejected"),
    ]
}

/// Tokenizes the examples: the prompt as [`super::preferences::prepare_preferences`] does, the
/// completion followed by the end-of-sequence token and cut to fit `max_length` tokens with the
/// prompt. Examples whose prompt alone reaches `max_length` are skipped.
pub fn prepare_labelled(
    examples: &[LabelledExample],
    tokenizer: &LmTokenizer,
    data: &DataSection,
    max_length: usize,
) -> Result<(Vec<LabelledCompletion>, Vec<Skipped>), TranscriptError> {
    let (mut prepared, mut skipped) = (Vec::new(), Vec::new());
    for e in examples {
        let prompt = prompt_tokens(&e.prompt, tokenizer, data)?;
        let Some(room) = room_after(&prompt, max_length) else {
            skipped.push(no_room(&e.row, &prompt, max_length));
            continue;
        };
        prepared.push(LabelledCompletion {
            completion: completion_tokens(&e.completion, tokenizer, room)?,
            prompt,
            desirable: e.desirable,
        });
    }
    Ok((prepared, skipped))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::opening_messages;

    fn read(rows: &[Value]) -> (Vec<LabelledExample>, Vec<Skipped>) {
        let dir = std::env::temp_dir().join(format!("rein-labelled-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("l{}.jsonl", rows.len()));
        let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
        std::fs::write(&path, text).unwrap();
        read_labelled(&path, &Fields::default()).unwrap()
    }

    #[test]
    fn unpaired_and_paired_rows_read_as_labelled_examples() {
        let user = json!({"role": "user", "content": "2+2?"});
        let (examples, skipped) = read(&[
            json!({"prompt": "2+2?", "completion": "4", "label": true}),
            json!({"prompt": [user], "completion": [{"role": "assistant", "content": "5"}], "label": false}),
            json!({"prompt": "2+2?", "chosen": "4", "rejected": "5"}),
        ]);
        assert!(skipped.is_empty(), "{skipped:?}");
        let read: Vec<(&str, bool)> = examples.iter().map(|e| (e.completion.as_str(), e.desirable)).collect();
        assert_eq!(read, [("4", true), ("5", false), ("4", true), ("5", false)]);
        assert!(examples.iter().all(|e| e.prompt == opening_messages("2+2?", None)));
        assert!(examples[3].row.ends_with("(row 3), rejected"), "{}", examples[3].row);
    }

    #[test]
    fn rows_that_cannot_train_are_skipped_by_name() {
        let (examples, skipped) = read(&[
            json!({"prompt": "a", "completion": "x"}),
            json!({"prompt": "a", "completion": "x", "label": "yes"}),
            json!({"prompt": "a", "label": true}),
            json!({"completion": "x", "label": true}),
            json!({"prompt": "a", "completion": " ", "label": false}),
            json!({"prompt": "a", "chosen": "x"}),
            json!({"prompt": "a", "completion": "x", "label": false}),
        ]);
        assert_eq!(examples.len(), 1);
        let reasons: Vec<String> = skipped.iter().map(|s| format!("{}: {}", s.row, s.reason)).collect();
        let expected = [
            "(row 1): no `label` column",
            "(row 2): `label` is \"yes\", not true or false",
            "(row 3): no `completion` column",
            "(row 4): no `prompt` column",
            "(row 5): `completion` is empty",
            "(row 6): no `rejected` completion",
        ];
        assert_eq!(reasons.len(), expected.len(), "{reasons:?}");
        for (reason, expected) in reasons.iter().zip(expected) {
            assert!(reason.ends_with(expected), "{reason} vs {expected}");
        }
    }

    #[test]
    fn long_prompts_are_skipped_and_long_completions_cut() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes/assets/arithmetic-tokenizer");
        let tokenizer = LmTokenizer::load(&dir, &[]).unwrap();
        let data: DataSection = toml::from_str("chat_template = false").unwrap();
        let example = |prompt: &str, completion: &str| LabelledExample {
            prompt: opening_messages(prompt, None),
            completion: completion.into(),
            desirable: true,
            row: format!("row {prompt}"),
        };
        let prompt_len = tokenizer.encode("12").unwrap().len();
        let examples = [example("12", "3456789"), example("1234567890", "1")];
        let (prepared, skipped) = prepare_labelled(&examples, &tokenizer, &data, prompt_len + 4).unwrap();
        assert_eq!(prepared.len(), 1);
        assert_eq!(prepared[0].completion.len(), 4);
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        assert!(skipped[0].reason.contains("leaves no room"), "{skipped:?}");
    }
}
