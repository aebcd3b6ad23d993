//! Sequence classifiers in Hugging Face format (`LlamaForSequenceClassification`,
//! `Qwen2ForSequenceClassification`, `MistralForSequenceClassification`): the decoder of a causal
//! model with a `score` head, `[hidden] → [num_labels]` without bias, read at each sequence's last
//! token that is not the padding token, as transformers reads it. This is what reward models are:
//! [`SequenceClassifier::load`] reads one to score with, [`SequenceClassifier::from_decoder`]
//! puts a fresh one-score head on a causal model's decoder to train, and
//! [`SequenceClassifier::save`] writes one in the same format.

use std::path::Path;

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::{Bool, Int, Tensor, TensorData};
use rein_core::SeededRng;

use super::model::{CausalLm, Context};
use super::model_dir::{Decoder, Weights, decoder_tensors, linear_weight, read_config, write_model_dir};
use super::{LmConfig, LoadError};
use crate::backend::{ReinBackend, affine};

/// A decoder with a classification head (see the module docs).
#[derive(Module, Debug)]
pub struct SequenceClassifier<B: ReinBackend> {
    /// The decoder, its own head unused (a classifier has none).
    trunk: CausalLm<B>,
    /// `score`, `[hidden, num_labels]`.
    score: Linear<B>,
    /// The labels in order (`id2label`).
    #[module(skip)]
    labels: Vec<String>,
    /// The token whose positions pooling skips (`pad_token_id`).
    #[module(skip)]
    pad_token_id: Option<u32>,
}

impl<B: ReinBackend> SequenceClassifier<B> {
    /// Whether the model in `dir` (or the fetched model of that name) is a sequence
    /// classifier: its `config.json` names a `*ForSequenceClassification`. False when there is
    /// no such model (loading it then says why).
    pub fn is_classifier(dir: &Path) -> bool {
        let config = super::locate(dir).ok().and_then(|dir| read_config(&dir).ok());
        config.is_some_and(|(_, raw)| {
            (raw["architectures"][0].as_str()).is_some_and(|a| a.ends_with("ForSequenceClassification"))
        })
    }

    /// The labels of the classifier in `dir` (`id2label` in id order, as [`Self::labels`]),
    /// read from its `config.json` without its weights.
    pub fn labels_of(dir: &Path) -> Result<Vec<String>, LoadError> {
        let dir = super::locate(dir)?;
        let (_, raw) = read_config(&dir)?;
        labels(&raw).map_err(|reason| LoadError::Json {
            path: dir.join("config.json"),
            reason,
        })
    }

    /// Loads the classifier in `dir` onto `device`, for inference (no gradients).
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self, LoadError> {
        Ok(Self::open(dir, device)?.no_grad())
    }

    /// A classifier on `decoder` (its LM head, if any, dropped) with a fresh `score` head of one
    /// label (a reward model), its weights drawn from `N(0, std²)` as transformers initialises
    /// it; pooling skips `pad_token_id`.
    pub fn from_decoder(
        decoder: CausalLm<B>,
        pad_token_id: Option<u32>,
        std: f64,
        rng: &mut SeededRng,
        device: &B::Device,
    ) -> Self {
        let hidden = decoder.config().hidden_size;
        let weights: Vec<f32> = (0..hidden).map(|_| (rng.normal() * std) as f32).collect();
        let score = Tensor::from_data(TensorData::new(weights, [hidden, 1]), device);
        Self::with_score(decoder, score, pad_token_id)
    }

    /// A one-label classifier on `decoder` with the given `score` weights, `[hidden, 1]`.
    pub fn with_score(mut decoder: CausalLm<B>, score: Tensor<B, 2>, pad_token_id: Option<u32>) -> Self {
        decoder.lm_head = None;
        Self {
            trunk: decoder,
            score: Linear {
                weight: Param::from_tensor(score),
                bias: None,
            },
            labels: vec!["LABEL_0".into()],
            pad_token_id,
        }
    }

    /// Writes the classifier to `dir` in Hugging Face format (`config.json` naming the
    /// `*ForSequenceClassification` class, its labels and padding token; `model.safetensors`,
    /// f32), loadable by transformers and by [`Self::load`]. Tokenizer files are the caller's.
    pub fn save(&self, dir: &Path) -> Result<(), LoadError> {
        let mut tensors = decoder_tensors(&self.trunk.merged());
        tensors.insert("score.weight".into(), linear_weight(&self.score));
        let mut config: serde_json::Value =
            serde_json::from_str(&self.config().to_hf_json()).expect("the config serialises");
        let class = config["architectures"][0]
            .as_str()
            .unwrap_or_default()
            .replace("ForCausalLM", "ForSequenceClassification");
        config["architectures"] = serde_json::json!([class]);
        let labels = self.labels.iter().enumerate();
        let id2label: serde_json::Map<String, serde_json::Value> = labels
            .clone()
            .map(|(i, l)| (i.to_string(), l.as_str().into()))
            .collect();
        let label2id: serde_json::Map<String, serde_json::Value> = labels.map(|(i, l)| (l.clone(), i.into())).collect();
        config["id2label"] = id2label.into();
        config["label2id"] = label2id.into();
        config["num_labels"] = self.labels.len().into();
        config["pad_token_id"] = self.pad_token_id.into();
        config["tie_word_embeddings"] = false.into();
        let text = serde_json::to_string_pretty(&config).expect("the config serialises") + "\n";
        write_model_dir(dir, &tensors, &text)
    }

    /// Reads the classifier in `dir` onto `device`, trainable.
    pub fn open(dir: &Path, device: &B::Device) -> Result<Self, LoadError> {
        let dir = &super::locate(dir)?;
        let (config, raw) = read_config(dir)?;
        let config_path = dir.join("config.json");
        let architecture = raw["architectures"][0].as_str().unwrap_or("");
        if !architecture.ends_with("ForSequenceClassification") {
            return Err(LoadError::Json {
                path: config_path,
                reason: format!(
                    "`architectures` is `{architecture}`, not a sequence classifier: a reward model is a \
                     `*ForSequenceClassification` with a `score` head"
                ),
            });
        }
        let labels = labels(&raw).map_err(|reason| LoadError::Json {
            path: config_path.clone(),
            reason,
        })?;
        let pad_token_id = match &raw["pad_token_id"] {
            serde_json::Value::Null => None,
            value => Some(
                value
                    .as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .ok_or_else(|| LoadError::Json {
                        path: config_path.clone(),
                        reason: format!("`pad_token_id` is {value}, not a token id"),
                    })?,
            ),
        };
        let weights = Weights::open(dir)?;
        let Decoder {
            embed_tokens,
            layers,
            norm,
        } = Decoder::read(&weights, &config, device)?;
        let score = weights.linear("score", config.hidden_size, labels.len(), false, device)?;
        let unused = weights.unused(true);
        if !unused.is_empty() {
            return Err(LoadError::UnexpectedTensors { names: unused });
        }
        let config = LmConfig {
            tie_word_embeddings: true,
            ..config
        };
        Ok(Self {
            trunk: CausalLm::from_parts(config, embed_tokens, layers, norm, None),
            score,
            labels,
            pad_token_id,
        })
    }

    /// The decoder and the `score` weights, `[hidden, num_labels]` (a critic made from a reward
    /// model reads values with them).
    pub fn into_parts(self) -> (CausalLm<B>, Tensor<B, 2>) {
        (self.trunk, self.score.weight.val())
    }

    /// The labels, in the order of the scores' columns.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The decoder's configuration.
    pub fn config(&self) -> &LmConfig {
        self.trunk.config()
    }

    /// Where a sequence is read: its last token that is not `pad_token_id` (transformers' rule,
    /// which also skips a trailing end-of-sequence token when it is the padding token), or its
    /// first when every token is; its last token when the model has no padding token.
    pub fn pooled_position(&self, ids: &[u32]) -> usize {
        match self.pad_token_id {
            Some(pad) => ids.iter().rposition(|&id| id != pad).unwrap_or(0),
            None => ids.len().saturating_sub(1),
        }
    }

    /// The scores of each sequence, `[sequences.len(), num_labels]`, the sequences batched
    /// together, right-padded. Empty sequences are not scored: their row is zeros.
    pub fn scores(&self, sequences: &[Vec<u32>], device: &B::Device) -> Tensor<B, 2> {
        let (batch, width) = (sequences.len(), self.labels.len());
        let seq = sequences.iter().map(Vec::len).max().unwrap_or(0);
        if batch == 0 || seq == 0 {
            return Tensor::zeros([batch, width], device);
        }
        let pad = self.pad_token_id.unwrap_or(0);
        let tokens: Vec<i64> = sequences
            .iter()
            .flat_map(|ids| (0..seq).map(move |t| i64::from(ids.get(t).copied().unwrap_or(pad))))
            .collect();
        let padded = sequences.iter().any(|ids| ids.len() < seq);
        let padding = padded.then(|| {
            let flags: Vec<bool> = sequences
                .iter()
                .flat_map(|ids| (0..seq).map(move |t| t >= ids.len()))
                .collect();
            Tensor::<B, 2, Bool>::from_data(TensorData::new(flags, [batch, seq]), device)
        });
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, device)
            .reshape([1, seq])
            .repeat_dim(0, batch);
        let rope = self.trunk.rope(seq, device);
        let ctx = Context {
            rope: &rope,
            positions,
            padding,
            sequence_lengths: None,
            fused: None,
            routing: None,
        };
        let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(tokens, [batch, seq]), device);
        let hidden = self.trunk.hidden(tokens, &ctx, None);
        let rows: Vec<i64> = (sequences.iter().enumerate())
            .map(|(b, ids)| (b * seq + self.pooled_position(ids)) as i64)
            .collect();
        let rows = Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [batch]), device);
        let width_hidden = self.config().hidden_size;
        let pooled = hidden.reshape([batch * seq, width_hidden]).select(0, rows);
        let scores = affine(pooled, self.score.weight.val(), None);
        let empty: Vec<bool> = sequences.iter().map(Vec::is_empty).collect();
        if !empty.contains(&true) {
            return scores;
        }
        let empty = Tensor::<B, 1, Bool>::from_data(TensorData::new(empty, [batch]), device);
        scores.mask_fill(empty.reshape([batch, 1]).expand([batch, width]), 0.0)
    }
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
