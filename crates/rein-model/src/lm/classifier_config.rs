//! What a classifier's `config.json` adds to its decoder's, as transformers reads and writes it:
//! the class (`*ForSequenceClassification`, `*ForTokenClassification`), the labels (`id2label`,
//! `label2id`, `num_labels`) and the padding token. Shared by [`super::SequenceClassifier`] and
//! [`super::TokenClassifier`].

use std::path::Path;

use super::model_dir::read_config;
use super::{LmConfig, LoadError};

/// A classifier's own settings.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ClassifierConfig {
    /// The labels in id order (`id2label`).
    pub(super) labels: Vec<String>,
    /// `pad_token_id`.
    pub(super) pad_token_id: Option<u32>,
}

/// Whether `dir` (or the fetched model of that name) holds a model whose `config.json` names a
/// class ending in `suffix` (`ForTokenClassification`). False when there is no such model.
pub(super) fn names_class(dir: &Path, suffix: &str) -> bool {
    let config = super::locate(dir).ok().and_then(|dir| read_config(&dir).ok());
    config.is_some_and(|(_, raw)| (raw["architectures"][0].as_str()).is_some_and(|a| a.ends_with(suffix)))
}

/// The decoder's and the classifier's configuration in `dir`, refusing a model whose class does
/// not end in `suffix`; `what` names such a model for the message (`sequence classifier: a
/// reward model is …`).
pub(super) fn read_classifier_config(
    dir: &Path,
    suffix: &str,
    what: &str,
) -> Result<(LmConfig, ClassifierConfig), LoadError> {
    let (config, raw) = read_config(dir)?;
    let invalid = |reason: String| LoadError::Json {
        path: dir.join("config.json"),
        reason,
    };
    let architecture = raw["architectures"][0].as_str().unwrap_or("");
    if !architecture.ends_with(suffix) {
        return Err(invalid(format!("`architectures` is `{architecture}`, not a {what}")));
    }
    let labels = labels(&raw).map_err(invalid)?;
    let pad_token_id = match &raw["pad_token_id"] {
        serde_json::Value::Null => None,
        value => Some(
            (value.as_u64().and_then(|id| u32::try_from(id).ok()))
                .ok_or_else(|| invalid(format!("`pad_token_id` is {value}, not a token id")))?,
        ),
    };
    Ok((config, ClassifierConfig { labels, pad_token_id }))
}

/// The labels of the classifier in `dir`, read from its `config.json` without its weights.
pub(super) fn labels_of(dir: &Path) -> Result<Vec<String>, LoadError> {
    let dir = super::locate(dir)?;
    let (_, raw) = read_config(&dir)?;
    labels(&raw).map_err(|reason| LoadError::Json {
        path: dir.join("config.json"),
        reason,
    })
}

/// `config.json` of a classifier on the decoder `config`: the causal class renamed to
/// `*{suffix}`, its labels and padding token, untied (a classifier has no LM head to tie).
pub(super) fn classifier_config_json(config: &LmConfig, suffix: &str, head: &ClassifierConfig) -> String {
    let mut json: serde_json::Value = serde_json::from_str(&config.to_hf_json()).expect("the config serialises");
    let class = (json["architectures"][0].as_str().unwrap_or_default()).replace("ForCausalLM", suffix);
    json["architectures"] = serde_json::json!([class]);
    let labels = head.labels.iter().enumerate();
    let id2label: serde_json::Map<String, serde_json::Value> = (labels.clone())
        .map(|(i, l)| (i.to_string(), l.as_str().into()))
        .collect();
    let label2id: serde_json::Map<String, serde_json::Value> = labels.map(|(i, l)| (l.clone(), i.into())).collect();
    json["id2label"] = id2label.into();
    json["label2id"] = label2id.into();
    json["num_labels"] = head.labels.len().into();
    json["pad_token_id"] = head.pad_token_id.into();
    json["tie_word_embeddings"] = false.into();
    serde_json::to_string_pretty(&json).expect("the config serialises") + "\n"
}

/// The labels of `config.json`: `id2label` in id order, else `num_labels` generic names
/// (`LABEL_0`, …), else transformers' default of two.
fn labels(raw: &serde_json::Value) -> Result<Vec<String>, String> {
    if let Some(map) = raw["id2label"].as_object() {
        let mut labels: Vec<(usize, String)> = Vec::with_capacity(map.len());
        for (id, label) in map {
            let id = id
                .parse()
                .map_err(|_| format!("`id2label` has the key `{id}`, not a label id"))?;
            let label = label
                .as_str()
                .ok_or_else(|| format!("`id2label.{id}` is not a string"))?;
            labels.push((id, label.to_string()));
        }
        labels.sort();
        if labels.iter().enumerate().any(|(i, (id, _))| i != *id) {
            return Err("`id2label`'s ids are not 0, 1, 2, …".into());
        }
        if labels.is_empty() {
            return Err("`id2label` is empty: a classifier needs at least one label".into());
        }
        return Ok(labels.into_iter().map(|(_, label)| label).collect());
    }
    let n = match &raw["num_labels"] {
        serde_json::Value::Null => 2,
        value => value
            .as_u64()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("`num_labels` is {value}, not a positive count"))? as usize,
    };
    Ok((0..n).map(|i| format!("LABEL_{i}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_come_from_id2label_in_id_order() {
        let raw = serde_json::json!({"id2label": {"1": "good", "0": "bad"}});
        assert_eq!(labels(&raw).unwrap(), ["bad", "good"]);
        let raw = serde_json::json!({"num_labels": 1});
        assert_eq!(labels(&raw).unwrap(), ["LABEL_0"]);
        assert_eq!(labels(&serde_json::json!({})).unwrap().len(), 2);
        let gap = serde_json::json!({"id2label": {"0": "a", "2": "c"}});
        assert!(labels(&gap).unwrap_err().contains("0, 1, 2"));
        assert!(labels(&serde_json::json!({"num_labels": 0})).is_err());
    }
}
