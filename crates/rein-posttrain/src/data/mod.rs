//! Prompt datasets: JSON lines or Parquet files with a prompt, an optional reference answer, an
//! optional target completion (for SFT) and metadata.

pub(crate) mod from_recipe;
pub mod images;
pub mod labelled;
pub mod preferences;
pub mod prompt_images;
pub mod prompts;
pub mod shapes;
pub mod stepwise;
pub mod task;

use std::path::Path;

pub use rein_recipe::Fields;
use serde::{Deserialize, Serialize};

/// One dataset row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Example {
    /// The user prompt (before any chat template).
    pub prompt: String,
    /// The reference answer, for rewards that check one.
    #[serde(default)]
    pub answer: Option<String>,
    /// The target completion, for supervised fine-tuning.
    #[serde(default)]
    pub completion: Option<String>,
    /// Other columns, as a JSON object (handed to reward plugins).
    #[serde(default)]
    pub metadata: String,
    /// The prompt's images, for a vision-language model (`data.fields.images`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<images::ImageSource>,
}

/// Why a dataset cannot be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct DataError {
    /// The file (with `:line` for JSON lines).
    pub path: String,
    /// What is wrong.
    pub reason: String,
}

/// One dataset row as a JSON object.
pub(crate) type Row = serde_json::Map<String, serde_json::Value>;

/// The rows of `path` (`.jsonl`/`.json` lines or `.parquet`), each a JSON object.
pub(crate) fn read_rows(path: &Path) -> Result<Vec<Row>, DataError> {
    let fail = |reason: String| DataError {
        path: path.display().to_string(),
        reason,
    };
    let rows: Vec<Row> = match path.extension().and_then(|e| e.to_str()) {
        Some("parquet") => read_parquet(path).map_err(fail)?,
        Some("jsonl" | "json") => {
            let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
            let mut rows = Vec::new();
            for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
                let value: serde_json::Value = serde_json::from_str(line).map_err(|e| DataError {
                    path: format!("{}:{}", path.display(), i + 1),
                    reason: e.to_string(),
                })?;
                match value {
                    serde_json::Value::Object(map) => rows.push(map),
                    _ => {
                        return Err(DataError {
                            path: format!("{}:{}", path.display(), i + 1),
                            reason: "not a JSON object".into(),
                        });
                    }
                }
            }
            rows
        }
        _ => return Err(fail("unknown format: expected .jsonl or .parquet".into())),
    };
    if rows.is_empty() {
        return Err(fail("holds no rows".into()));
    }
    Ok(rows)
}

/// Reads `path` (`.jsonl`/`.json` lines or `.parquet`).
pub fn read(path: &Path, fields: &Fields) -> Result<Vec<Example>, DataError> {
    let rows = read_rows(path)?;
    let mut examples = Vec::with_capacity(rows.len());
    for (i, mut row) in rows.into_iter().enumerate() {
        let row_name = || DataError {
            path: format!("{} (row {})", path.display(), i + 1),
            reason: String::new(),
        };
        let text = |v: serde_json::Value| match v {
            serde_json::Value::String(s) => s,
            other => other.to_string(),
        };
        let prompt = row.remove(&fields.prompt).map(text).ok_or_else(|| DataError {
            reason: format!(
                "no `{}` field (set data.fields.prompt to the prompt column)",
                fields.prompt
            ),
            ..row_name()
        })?;
        let answer = row.remove(&fields.answer).filter(|v| !v.is_null()).map(text);
        let completion = row.remove(&fields.completion).filter(|v| !v.is_null()).map(text);
        let dir = path.parent().unwrap_or(Path::new("."));
        let images = (row
            .remove(&fields.images)
            .map(|v| images::row_images(v, dir))
            .transpose())
        .map_err(|reason| DataError {
            reason: format!("`{}`: {reason}", fields.images),
            ..row_name()
        })?
        .unwrap_or_default();
        let metadata = if row.is_empty() {
            String::new()
        } else {
            serde_json::Value::Object(row).to_string()
        };
        examples.push(Example {
            prompt,
            answer,
            completion,
            metadata,
            images,
        });
    }
    Ok(examples)
}

/// Writes examples as JSON lines.
pub fn write_jsonl(path: &Path, examples: &[Example]) -> std::io::Result<()> {
    let mut text = String::new();
    for e in examples {
        text.push_str(&serde_json::to_string(e).map_err(std::io::Error::other)?);
        text.push('\n');
    }
    std::fs::write(path, text)
}

fn read_parquet(path: &Path) -> Result<Vec<Row>, String> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let reader = SerializedFileReader::new(file).map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for row in reader.get_row_iter(None).map_err(|e| e.to_string())? {
        let row = row.map_err(|e| e.to_string())?;
        match row.to_json_value() {
            serde_json::Value::Object(map) => rows.push(map),
            other => return Err(format!("row is not a record: {other}")),
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_rows_map_fields_and_keep_the_rest_as_metadata() {
        let dir = std::env::temp_dir().join(format!("rein-data-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.jsonl");
        std::fs::write(
            &path,
            "{\"question\": \"1+1?\", \"solution\": 2, \"level\": 3}\n\n{\"question\": \"x\", \"solution\": null}\n",
        )
        .unwrap();
        let fields = Fields {
            prompt: "question".into(),
            answer: "solution".into(),
            ..Fields::default()
        };
        let rows = read(&path, &fields).unwrap();
        assert_eq!(rows[0].prompt, "1+1?");
        assert_eq!(rows[0].answer.as_deref(), Some("2"));
        assert_eq!(rows[0].metadata, "{\"level\":3}");
        assert_eq!(rows[1].answer, None);
        let err = read(&path, &Fields::default()).unwrap_err();
        assert!(err.to_string().contains("(row 1): no `prompt` field"), "{err}");
        std::fs::write(&path, "{\"prompt\": 1}\nnot json\n").unwrap();
        assert!(read(&path, &Fields::default()).unwrap_err().path.ends_with("d.jsonl:2"));
        assert!(read(&dir.join("d.csv"), &Fields::default()).is_err());
    }
}
