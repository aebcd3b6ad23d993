//! Token classifiers in Hugging Face format (`Qwen2ForTokenClassification`,
//! `LlamaForTokenClassification`, … — transformers' `GenericForTokenClassification`): the decoder
//! of a causal model with a `score` head, `[hidden] → [num_labels]` with a bias, read at every
//! token. A process reward model as TRL's `PRMTrainer` trains one is this with two labels, read
//! at each step's last token (label 1: the step is right). [`TokenClassifier::load`] reads one
//! to score with, [`TokenClassifier::from_decoder`] puts a fresh head on a causal model's
//! decoder to train, and [`TokenClassifier::save`] writes one in the same format.
//!
//! Qwen's process reward models (`Qwen2ForProcessRewardModel`, Qwen2.5-Math-PRM: custom code
//! that transformers loads with `trust_remote_code`) are the same with a two-layer head, `score`
//! = `Linear(hidden, hidden)` → ReLU → `Linear(hidden, 2)` (`score.0`, `score.2`), read and
//! written under those names.

use std::path::Path;

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::{Tensor, TensorData};
use rein_core::SeededRng;

use super::classifier_config::{ClassifierConfig, classifier_config_json, names_class, read_classifier_config};
use super::model::CausalLm;
use super::model_dir::{Weights, decoder_tensors, linear_weight, read_classifier, vector_tensor, write_model_dir};
use super::{LmConfig, LoadError};
use crate::backend::{ReinBackend, affine};

/// The class suffix of a token classifier in `config.json`.
const CLASS: &str = "ForTokenClassification";

/// The class suffix of Qwen's process reward models, whose head has two layers.
const PROCESS_REWARD_CLASS: &str = "ForProcessRewardModel";

/// A decoder with a per-token classification head (see the module docs).
#[derive(Module, Debug)]
pub struct TokenClassifier<B: ReinBackend> {
    /// The decoder, without an LM head.
    trunk: CausalLm<B>,
    /// Qwen's process-reward head's first layer (`score.0`, `[hidden, hidden]` and its bias,
    /// then ReLU); `None` for a one-layer head.
    hidden: Option<Linear<B>>,
    /// `score` (`score.2` after a first layer), `[hidden, num_labels]` and its bias.
    score: Linear<B>,
    /// The labels in order (`id2label`).
    #[module(skip)]
    labels: Vec<String>,
    /// The padding token, written to `config.json`.
    #[module(skip)]
    pad_token_id: Option<u32>,
}

impl<B: ReinBackend> TokenClassifier<B> {
    /// Whether the model in `dir` (or the fetched model of that name) is a token classifier: its
    /// `config.json` names a `*ForTokenClassification`. False when there is no such model.
    pub fn is_token_classifier(dir: &Path) -> bool {
        names_class(dir, CLASS) || names_class(dir, PROCESS_REWARD_CLASS)
    }

    /// The labels of the classifier in `dir` (`id2label` in id order, as [`Self::labels`]),
    /// read from its `config.json` without its weights.
    pub fn labels_of(dir: &Path) -> Result<Vec<String>, LoadError> {
        super::classifier_config::labels_of(dir)
    }

    /// Loads the classifier in `dir` onto `device`, for inference (no gradients).
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self, LoadError> {
        Ok(Self::open(dir, device)?.no_grad())
    }

    /// Reads the classifier in `dir` onto `device`, trainable.
    pub fn open(dir: &Path, device: &B::Device) -> Result<Self, LoadError> {
        let dir = &super::locate(dir)?;
        let what = "token classifier: a process reward model is a `*ForTokenClassification` with a `score` head";
        let two_layers = names_class(dir, PROCESS_REWARD_CLASS);
        let class = if two_layers { PROCESS_REWARD_CLASS } else { CLASS };
        let (config, ClassifierConfig { labels, pad_token_id }) = read_classifier_config(dir, class, what)?;
        let n = labels.len();
        let head = |weights: &Weights, config: &LmConfig| match two_layers {
            false => Ok((None, weights.linear("score", config.hidden_size, n, true, device)?)),
            true => Ok((
                Some(weights.linear("score.0", config.hidden_size, config.hidden_size, true, device)?),
                weights.linear("score.2", config.hidden_size, n, true, device)?,
            )),
        };
        let (trunk, (hidden, score)) = read_classifier(dir, config, head, device)?;
        Ok(Self {
            trunk,
            hidden,
            score,
            labels,
            pad_token_id,
        })
    }

    /// A classifier of `num_labels` labels (`LABEL_0`, …) on `decoder` (its LM head, if any,
    /// dropped), its head initialised as transformers does: weights from `N(0, std²)`, bias 0.
    pub fn from_decoder(
        decoder: CausalLm<B>,
        num_labels: usize,
        pad_token_id: Option<u32>,
        std: f64,
        rng: &mut SeededRng,
        device: &B::Device,
    ) -> Self {
        let hidden = decoder.config().hidden_size;
        let weights: Vec<f32> = (0..hidden * num_labels).map(|_| (rng.normal() * std) as f32).collect();
        let weight = Tensor::from_data(TensorData::new(weights, [hidden, num_labels]), device);
        let bias = Tensor::zeros([num_labels], device);
        Self::with_head(decoder, weight, bias, pad_token_id)
    }

    /// A classifier on `decoder` with the given head: `weight` `[hidden, num_labels]` and `bias`
    /// `[num_labels]`; its labels `LABEL_0`, ….
    pub fn with_head(
        mut decoder: CausalLm<B>,
        weight: Tensor<B, 2>,
        bias: Tensor<B, 1>,
        pad_token_id: Option<u32>,
    ) -> Self {
        decoder.lm_head = None;
        let num_labels = weight.dims()[1];
        Self {
            trunk: decoder,
            hidden: None,
            score: Linear {
                weight: Param::from_tensor(weight),
                bias: Some(Param::from_tensor(bias)),
            },
            labels: (0..num_labels).map(|i| format!("LABEL_{i}")).collect(),
            pad_token_id,
        }
    }

    /// Qwen's process reward model (`Qwen2ForProcessRewardModel`) on `decoder` (its LM head, if
    /// any, dropped) with the given two-layer head: `first` `[hidden, hidden]` and its bias, then
    /// ReLU, then `weight` `[hidden, num_labels]` and its bias.
    pub fn with_process_reward_head(
        decoder: CausalLm<B>,
        (first, first_bias): (Tensor<B, 2>, Tensor<B, 1>),
        weight: Tensor<B, 2>,
        bias: Tensor<B, 1>,
        pad_token_id: Option<u32>,
    ) -> Self {
        Self {
            hidden: Some(Linear {
                weight: Param::from_tensor(first),
                bias: Some(Param::from_tensor(first_bias)),
            }),
            ..Self::with_head(decoder, weight, bias, pad_token_id)
        }
    }

    /// Writes the classifier to `dir` in Hugging Face format (`config.json` naming the
    /// `*ForTokenClassification` class, or `*ForProcessRewardModel` with a two-layer head, its
    /// labels and padding token; `model.safetensors`, f32), loadable by transformers (Qwen's
    /// class with its custom code) and by [`Self::load`]. Tokenizer files are the caller's.
    pub fn save(&self, dir: &Path) -> Result<(), LoadError> {
        let mut tensors = decoder_tensors(&self.trunk.merged());
        let mut layer = |name: &str, linear: &Linear<B>| {
            tensors.insert(format!("{name}.weight"), linear_weight(linear));
            if let Some(bias) = &linear.bias {
                tensors.insert(format!("{name}.bias"), vector_tensor(bias.val()));
            }
        };
        let class = match &self.hidden {
            None => {
                layer("score", &self.score);
                CLASS
            }
            Some(first) => {
                layer("score.0", first);
                layer("score.2", &self.score);
                PROCESS_REWARD_CLASS
            }
        };
        let head = ClassifierConfig {
            labels: self.labels.clone(),
            pad_token_id: self.pad_token_id,
        };
        write_model_dir(dir, &tensors, &classifier_config_json(self.config(), class, &head))
    }

    /// The labels, in the order of the logits' columns.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The decoder's configuration.
    pub fn config(&self) -> &LmConfig {
        self.trunk.config()
    }

    /// The logits at the tokens `at` (`(sequence, position)` pairs), `[at.len(), num_labels]`:
    /// the sequences run batched together, right-padded, and only the positions asked for go
    /// through the head.
    ///
    /// # Panics
    /// When a pair names a sequence or a position that does not exist.
    pub fn logits_at<S: AsRef<[u32]>>(
        &self,
        sequences: &[S],
        at: &[(usize, usize)],
        device: &B::Device,
    ) -> Tensor<B, 2> {
        for &(row, position) in at {
            assert!(
                sequences.get(row).is_some_and(|ids| position < ids.as_ref().len()),
                "token ({row}, {position}) is not in the {} sequences",
                sequences.len()
            );
        }
        if at.is_empty() {
            return Tensor::zeros([0, self.labels.len()], device);
        }
        let pad = self.pad_token_id.unwrap_or(0);
        let mut picked = self.trunk.hidden_at(sequences, pad, at, device);
        if let Some(first) = &self.hidden {
            let first = affine(picked, first.weight.val(), first.bias.as_ref().map(Param::val));
            picked = burn::tensor::activation::relu(first);
        }
        affine(
            picked,
            self.score.weight.val(),
            self.score.bias.as_ref().map(Param::val),
        )
    }
}
