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
use burn::tensor::{Bool, Tensor, TensorData};
use rein_core::SeededRng;

use super::classifier_config::{
    ClassifierConfig, classifier_config_json, labels_of, names_class, read_classifier_config,
};
use super::model::CausalLm;
use super::model_dir::{Weights, decoder_tensors, linear_weight, read_classifier, write_model_dir};
use super::{LmConfig, LoadError};
use crate::backend::{ReinBackend, affine};

/// The class suffix of a sequence classifier in `config.json`.
const CLASS: &str = "ForSequenceClassification";

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
        names_class(dir, CLASS)
    }

    /// The labels of the classifier in `dir` (`id2label` in id order, as [`Self::labels`]),
    /// read from its `config.json` without its weights.
    pub fn labels_of(dir: &Path) -> Result<Vec<String>, LoadError> {
        labels_of(dir)
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
        let head = ClassifierConfig {
            labels: self.labels.clone(),
            pad_token_id: self.pad_token_id,
        };
        write_model_dir(dir, &tensors, &classifier_config_json(self.config(), CLASS, &head))
    }

    /// Reads the classifier in `dir` onto `device`, trainable.
    pub fn open(dir: &Path, device: &B::Device) -> Result<Self, LoadError> {
        let dir = &super::locate(dir)?;
        let what = "sequence classifier: a reward model is a `*ForSequenceClassification` with a `score` head";
        let (config, ClassifierConfig { labels, pad_token_id }) = read_classifier_config(dir, CLASS, what)?;
        let n = labels.len();
        let score =
            |weights: &Weights, config: &LmConfig| weights.linear("score", config.hidden_size, n, false, device);
        let (trunk, score) = read_classifier(dir, config, score, device)?;
        Ok(Self {
            trunk,
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
        let at: Vec<(usize, usize)> = (sequences.iter().enumerate())
            .map(|(b, ids)| (b, self.pooled_position(ids)))
            .collect();
        let pad = self.pad_token_id.unwrap_or(0);
        let pooled = self.trunk.hidden_at(sequences, pad, &at, device);
        let scores = affine(pooled, self.score.weight.val(), None);
        let empty: Vec<bool> = sequences.iter().map(Vec::is_empty).collect();
        if !empty.contains(&true) {
            return scores;
        }
        let empty = Tensor::<B, 1, Bool>::from_data(TensorData::new(empty, [batch]), device);
        scores.mask_fill(empty.reshape([batch, 1]).expand([batch, width]), 0.0)
    }
}
