//! Step-labelled rows, what a process reward model learns from, in TRL's stepwise-supervision
//! format: `{"prompt": "…", "completions": ["step 1", "step 2"], "labels": [true, false]}` (the
//! column names from `data.fields`), a label per step saying whether the step is right; or made
//! from the generated task's worked solutions and slipped ones.
//!
//! Tokenized as TRL's `PRMTrainer.tokenize_row` does (the layout is
//! `rein_model::lm::LmTokenizer::encode_steps`): each step is judged at its separator's last
//! token; `train_on_last_step_only` keeps only the last step's label for training; the steps
//! are cut to `max_completion_length` tokens and the whole to `max_length`, and a label whose
//! token was cut goes with it. Rows that cannot train (no steps, labels that are not one boolean
//! per step, a prompt that is not text, no label left after cutting) are skipped and reported by
//! row, never fatal.

use std::path::Path;

use rein_model::lm::{LmTokenizer, LoadError};
use rein_recipe::{Fields, ProcessRewardModelSection};
use rein_sampler::SeededRng;

use crate::data::preferences::Skipped;
use crate::data::{DataError, Example, Row, read_rows};

/// One step-labelled row as read.
#[derive(Debug, Clone, PartialEq)]
pub struct StepwiseExample {
    /// The prompt's text (no chat template: TRL's format reads text).
    pub prompt: String,
    /// The steps, in order.
    pub steps: Vec<String>,
    /// Whether each step is right.
    pub labels: Vec<bool>,
    /// Where the row came from (`prm.jsonl (row 3)`), for messages.
    pub row: String,
}

/// How rows are tokenized: `PRMConfig`'s settings.
#[derive(Debug, Clone, Copy)]
pub struct StepTokenizing<'a> {
    /// The text after each step.
    pub separator: &'a str,
    /// Keep only the last step's label (training rows only).
    pub last_step_only: bool,
    /// Most tokens of prompt and steps together.
    pub max_length: Option<usize>,
    /// Most tokens of the steps.
    pub max_completion_length: Option<usize>,
}

impl<'a> StepTokenizing<'a> {
    /// The settings of a recipe's `[algorithm]` section.
    pub fn of(section: &'a ProcessRewardModelSection) -> Self {
        Self {
            separator: &section.step_separator,
            last_step_only: section.train_on_last_step_only,
            max_length: Some(section.max_length),
            max_completion_length: section.max_completion_length,
        }
    }
}

/// A row tokenized as TRL tokenizes it: its tokens and, per token, the label it is trained on
/// (`None` where TRL writes `-100`).
#[derive(Debug, Clone, PartialEq)]
pub struct StepTokens {
    /// `[bos] + prompt + (step + separator)…`, cut.
    pub input_ids: Vec<u32>,
    /// The label at each step's last token, `None` elsewhere.
    pub labels: Vec<Option<bool>>,
}

/// A row ready to train on: its tokens and where its labels are.
#[derive(Debug, Clone, PartialEq)]
pub struct StepLabelled {
    /// The tokens.
    pub ids: Vec<u32>,
    /// The positions of the labelled tokens, ascending.
    pub at: Vec<usize>,
    /// Their labels (1: the step is right, 0: it is not).
    pub labels: Vec<usize>,
}

/// Tokenizes `row` (see the module docs); `training` says whether `last_step_only` applies.
pub fn tokenize_steps(
    row: &StepwiseExample,
    tokenizer: &LmTokenizer,
    settings: &StepTokenizing<'_>,
    training: bool,
) -> Result<StepTokens, LoadError> {
    let encoded = tokenizer.encode_steps(&row.prompt, &row.steps, settings.separator)?;
    let (mut input_ids, ends, prompt_len) = (encoded.ids, encoded.step_ends, encoded.prompt_len);
    let mut keep = input_ids.len();
    if let Some(max) = settings.max_completion_length {
        keep = keep.min(prompt_len + max);
    }
    if let Some(max) = settings.max_length {
        keep = keep.min(max);
    }
    input_ids.truncate(keep);
    let mut labels = vec![None; input_ids.len()];
    let last = ends.len().saturating_sub(1);
    for (k, (&end, &label)) in ends.iter().zip(&row.labels).enumerate() {
        if end < keep && !(training && settings.last_step_only && k != last) {
            labels[end] = Some(label);
        }
    }
    Ok(StepTokens { input_ids, labels })
}

/// Tokenizes `rows` for training (`training`: `last_step_only` applies) or evaluation; rows
/// with no label left are skipped, with why.
pub fn prepare_stepwise(
    rows: &[StepwiseExample],
    tokenizer: &LmTokenizer,
    settings: &StepTokenizing<'_>,
    training: bool,
) -> Result<(Vec<StepLabelled>, Vec<Skipped>), LoadError> {
    if tokenizer.encode(settings.separator)?.is_empty() {
        return Err(LoadError::Tokenizer {
            path: "step_separator".into(),
            reason: format!(
                "{:?} encodes to no token: steps could not be judged",
                settings.separator
            ),
        });
    }
    let (mut prepared, mut skipped) = (Vec::new(), Vec::new());
    for row in rows {
        let StepTokens { input_ids, labels } = tokenize_steps(row, tokenizer, settings, training)?;
        let (at, labels): (Vec<usize>, Vec<usize>) = (labels.iter().enumerate())
            .filter_map(|(i, label)| label.map(|l| (i, usize::from(l))))
            .unzip();
        if at.is_empty() {
            skipped.push(Skipped {
                row: row.row.clone(),
                reason: format!(
                    "no step ends within max_length / max_completion_length ({} tokens)",
                    input_ids.len()
                ),
            });
            continue;
        }
        prepared.push(StepLabelled {
            ids: input_ids,
            at,
            labels,
        });
    }
    Ok((prepared, skipped))
}

/// Reads the step-labelled rows of `path` (`.jsonl` or `.parquet`); rows that cannot train are
/// returned apart, each with its reason.
pub fn read_stepwise(path: &Path, fields: &Fields) -> Result<(Vec<StepwiseExample>, Vec<Skipped>), DataError> {
    let (mut examples, mut skipped) = (Vec::new(), Vec::new());
    for (i, mut row) in read_rows(path)?.into_iter().enumerate() {
        let name = format!("{} (row {})", path.display(), i + 1);
        match stepwise(&mut row, fields, &name) {
            Ok(example) => examples.push(example),
            Err(reason) => skipped.push(Skipped { row: name, reason }),
        }
    }
    Ok((examples, skipped))
}

/// A row's prompt, steps and labels, or why it has none.
fn stepwise(row: &mut Row, fields: &Fields, name: &str) -> Result<StepwiseExample, String> {
    let mut take =
        |column: &str| (row.remove(column).filter(|v| !v.is_null())).ok_or_else(|| format!("no `{column}` column"));
    let (prompt, steps, labels) = (take(&fields.prompt)?, take(&fields.completions)?, take(&fields.labels)?);
    let prompt =
        (prompt.as_str()).ok_or_else(|| format!("`{}` is not text (TRL's stepwise rows are)", fields.prompt))?;
    let list = |value: &serde_json::Value, column: &str| -> Result<Vec<serde_json::Value>, String> {
        match value.as_array() {
            Some(items) if !items.is_empty() => Ok(items.clone()),
            Some(_) => Err(format!("`{column}` is empty")),
            None => Err(format!("`{column}` is not a list")),
        }
    };
    let steps: Vec<String> = (list(&steps, &fields.completions)?.iter())
        .map(|s| s.as_str().map(str::to_string))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("`{}` holds something other than text", fields.completions))?;
    let labels: Vec<bool> = (list(&labels, &fields.labels)?.iter())
        .map(serde_json::Value::as_bool)
        .collect::<Option<_>>()
        .ok_or_else(|| format!("`{}` holds something other than true or false", fields.labels))?;
    if labels.len() != steps.len() {
        return Err(format!(
            "{} steps but {} labels: one label per step",
            steps.len(),
            labels.len()
        ));
    }
    Ok(StepwiseExample {
        prompt: prompt.to_string(),
        steps,
        labels,
        row: name.to_string(),
    })
}

/// Step-labelled rows from the generated task's examples: each worked solution split into
/// steps at `", "` (every step right), and the same problem with one slipped step
/// ([`crate::slipped_solution`]), whose steps are right up to the slip and wrong from it on (a
/// wrong partial result spoils every step after it, Math-Shepherd's labelling). Examples without
/// a solution that can slip are left out.
pub fn stepwise_from_examples(examples: &[Example], rng: &mut SeededRng) -> Vec<StepwiseExample> {
    let split = |text: &str| -> Vec<String> { text.split(", ").map(str::to_string).collect() };
    let mut rows = Vec::with_capacity(2 * examples.len());
    for (i, example) in examples.iter().enumerate() {
        let (Some(solution), Some(slipped)) = (
            example.completion.as_deref(),
            crate::slipped_solution(&example.prompt, rng),
        ) else {
            continue;
        };
        let (right, wrong) = (split(solution), split(&slipped));
        let slip = (right.iter().zip(&wrong))
            .position(|(a, b)| a != b)
            .unwrap_or(right.len());
        let row = |which: &str| format!("generated task (example {}, {which})", i + 1);
        rows.push(StepwiseExample {
            prompt: example.prompt.clone(),
            labels: vec![true; right.len()],
            steps: right,
            row: row("worked"),
        });
        rows.push(StepwiseExample {
            prompt: example.prompt.clone(),
            labels: (0..wrong.len()).map(|k| k < slip).collect(),
            steps: wrong,
            row: row("slipped"),
        });
    }
    rows
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn read(rows: &[Value]) -> (Vec<StepwiseExample>, Vec<Skipped>) {
        let dir = std::env::temp_dir().join(format!("rein-stepwise-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("s{}.jsonl", rows.len()));
        let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
        std::fs::write(&path, text).unwrap();
        read_stepwise(&path, &Fields::default()).unwrap()
    }

    #[test]
    fn rows_that_cannot_train_are_skipped_by_name() {
        let (examples, skipped) = read(&[
            json!({"prompt": "p", "completions": ["a", "b"], "labels": [true, false]}),
            json!({"prompt": "p", "completions": ["a", "b"], "labels": [true]}),
            json!({"prompt": "p", "completions": [], "labels": []}),
            json!({"prompt": "p", "completions": ["a"], "labels": ["yes"]}),
            json!({"prompt": [{"role": "user", "content": "p"}], "completions": ["a"], "labels": [true]}),
            json!({"prompt": "p", "labels": [true]}),
            json!({"prompt": "p", "completions": "a", "labels": [true]}),
        ]);
        assert_eq!(examples.len(), 1);
        assert_eq!(examples[0].labels, [true, false]);
        let expected = [
            "(row 2): 2 steps but 1 labels: one label per step",
            "(row 3): `completions` is empty",
            "(row 4): `labels` holds something other than true or false",
            "(row 5): `prompt` is not text (TRL's stepwise rows are)",
            "(row 6): no `completions` column",
            "(row 7): `completions` is not a list",
        ];
        let reasons: Vec<String> = skipped.iter().map(|s| format!("{}: {}", s.row, s.reason)).collect();
        assert_eq!(reasons.len(), expected.len(), "{reasons:?}");
        for (reason, expected) in reasons.iter().zip(expected) {
            assert!(reason.ends_with(expected), "{reason} vs {expected}");
        }
    }

    #[test]
    fn generated_rows_are_right_up_to_the_slip() {
        let example = Example {
            prompt: "What is 47 + 38?".into(),
            answer: Some("85".into()),
            completion: Some("<think>7+8=15, 4+3+1=8</think><answer>85</answer>".into()),
            metadata: String::new(),
            images: Vec::new(),
        };
        let rows = stepwise_from_examples(&[example], &mut SeededRng::new(3));
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].steps, ["<think>7+8=15", "4+3+1=8</think><answer>85</answer>"]);
        assert_eq!(rows[0].labels, [true, true]);
        let slip = rows[1].labels.iter().position(|l| !l).expect("a slipped step");
        assert!(rows[1].labels[slip..].iter().all(|l| !l), "{:?}", rows[1].labels);
        assert_ne!(rows[1].steps[slip], rows[0].steps[slip]);
        assert_eq!(rows[1].steps[..slip], rows[0].steps[..slip]);
    }
}
