//! A reward model as a reward: each completion, after its prompt and through the reward model's
//! own chat template (as TRL renders reward-model inputs), scored by a sequence classifier, a
//! batch of similar lengths at a time, in process or on an inference server (vLLM's and
//! SGLang's classification API, [`HttpClassifier`]). Scores pass the same checks as a plugin's
//! (one finite score per completion) and join the weighted sum like any reward; a server that
//! fails is a failure of the reward, counted, that the run survives as `on_error` says.

use std::path::Path;
use std::time::Duration;

use crate::HttpClassifier;
use rein_core::{CompletionScore, FailureCounts, Group, GroupScores, PluginError, PluginErrorKind, RewardFn};
use rein_model::ReinBackend;
use rein_model::lm::{ChatMessage, LmTokenizer, LoadError, SequenceClassifier};

/// A sequence classifier scoring completions (see the module docs).
pub struct ModelReward<B: ReinBackend> {
    name: String,
    scorer: Scorer<B>,
    tokenizer: LmTokenizer,
    /// The classifier's labels, in output order.
    labels: Vec<String>,
    /// The column of the classifier's output that is the score.
    label: usize,
    batch_size: usize,
    failures: FailureCounts,
}

/// Where the classifier runs.
enum Scorer<B: ReinBackend> {
    /// In process, on `device`.
    Native {
        classifier: Box<SequenceClassifier<B>>,
        device: B::Device,
    },
    /// On an inference server.
    Served(HttpClassifier),
}

/// Why a reward model cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RewardModelError {
    /// The model directory or its tokenizer cannot be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The recipe names a label the classifier does not have.
    #[error("reward model `{model}` has no label `{label}` (its labels: {})", labels.join(", "))]
    NoSuchLabel {
        /// The model.
        model: String,
        /// The label asked for.
        label: String,
        /// The labels it has.
        labels: Vec<String>,
    },
}

impl<B: ReinBackend> ModelReward<B> {
    /// Loads the classifier in `dir` and its tokenizer; its score is the output column `label`
    /// (by name), or the first (TRL reads `logits[:, 0]`).
    pub fn load(
        name: &str,
        dir: &Path,
        label: Option<&str>,
        batch_size: usize,
        device: &B::Device,
    ) -> Result<Self, RewardModelError> {
        let classifier = SequenceClassifier::<B>::load(dir, device)?;
        let labels = classifier.labels().to_vec();
        let scorer = Scorer::Native {
            classifier: Box::new(classifier),
            device: device.clone(),
        };
        Self::new(name, dir, labels, label, batch_size, scorer)
    }

    /// The classifier in `dir` served at `url` (under the name `served_model`, or the server's
    /// only model): `dir` gives the chat template, the tokenizer and the labels, the server the
    /// scores. Each request (`batch_size` texts) may take `timeout`.
    pub fn served(
        name: &str,
        dir: &Path,
        label: Option<&str>,
        batch_size: usize,
        url: &str,
        served_model: Option<&str>,
        timeout: Duration,
    ) -> Result<Self, RewardModelError> {
        let labels = SequenceClassifier::<B>::labels_of(dir)?;
        let scorer = Scorer::Served(HttpClassifier::new(url, served_model, timeout));
        Self::new(name, dir, labels, label, batch_size, scorer)
    }

    fn new(
        name: &str,
        dir: &Path,
        labels: Vec<String>,
        label: Option<&str>,
        batch_size: usize,
        scorer: Scorer<B>,
    ) -> Result<Self, RewardModelError> {
        let dir = rein_model::lm::locate(dir)?;
        let tokenizer = LmTokenizer::load(&dir, &[])?;
        let label = match label {
            None => 0,
            Some(wanted) => labels
                .iter()
                .position(|l| l == wanted)
                .ok_or_else(|| RewardModelError::NoSuchLabel {
                    model: dir.display().to_string(),
                    label: wanted.into(),
                    labels: labels.clone(),
                })?,
        };
        Ok(Self {
            name: name.into(),
            scorer,
            tokenizer,
            labels,
            label,
            batch_size: batch_size.max(1),
            failures: FailureCounts::default(),
        })
    }

    /// The text the classifier reads for `completion` after `prompt`: the two as a user and an
    /// assistant turn through the chat template, or the prompt followed by the completion when
    /// the tokenizer has no template.
    pub fn text(&self, prompt: &str, completion: &str) -> Result<String, LoadError> {
        let message = |role: &str, content: &str| ChatMessage {
            role: role.into(),
            content: content.into(),
        };
        let messages = [message("user", prompt), message("assistant", completion)];
        Ok(self
            .tokenizer
            .apply_chat_template(&messages, false)?
            .unwrap_or_else(|| format!("{prompt}{completion}")))
    }

    /// The score of each text, in order. The error says what failed: the tokenizer, or the
    /// server (named) and how.
    pub fn score_texts(&self, texts: &[String]) -> Result<Vec<f64>, String> {
        let width = self.labels.len();
        let mut scores = vec![0.0; texts.len()];
        match &self.scorer {
            Scorer::Native { classifier, device } => {
                let ids = (texts.iter())
                    .map(|t| self.tokenizer.encode(t))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?;
                // Similar lengths batched together, so little of each batch is padding. Each
                // row's score does not depend on the others in its batch.
                let mut order: Vec<usize> = (0..ids.len()).collect();
                order.sort_by_key(|&i| ids[i].len());
                for chunk in order.chunks(self.batch_size) {
                    let batch: Vec<Vec<u32>> = chunk.iter().map(|&i| ids[i].clone()).collect();
                    let values = classifier.scores(&batch, device).into_data();
                    let values = values.convert::<f32>().to_vec::<f32>().unwrap_or_default();
                    for (row, &i) in chunk.iter().enumerate() {
                        scores[i] = values
                            .get(row * width + self.label)
                            .copied()
                            .map_or(f64::NAN, f64::from);
                    }
                }
            }
            Scorer::Served(server) => {
                for (chunk, out) in texts.chunks(self.batch_size).zip(scores.chunks_mut(self.batch_size)) {
                    for (outputs, score) in server.scores(chunk)?.into_iter().zip(out) {
                        if outputs.len() != width {
                            return Err(format!(
                                "{} answered {} outputs per text; the reward model's config has {width} labels",
                                server.url(),
                                outputs.len()
                            ));
                        }
                        *score = outputs[self.label];
                    }
                }
            }
        }
        Ok(scores)
    }

    fn score_groups(&self, groups: &[Group]) -> Result<Vec<GroupScores>, PluginError> {
        let failed = |reason: String| PluginError::new(&self.name, Some("score"), PluginErrorKind::Host { reason });
        let texts = (groups.iter())
            .flat_map(|g| g.completions.iter().map(|c| self.text(&g.prompt, c)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| failed(e.to_string()))?;
        let mut scores = self.score_texts(&texts).map_err(failed)?.into_iter();
        let out: Vec<GroupScores> = (groups.iter())
            .map(|g| {
                (g.completions.iter())
                    .map(|_| CompletionScore {
                        score: scores.next(),
                        ..CompletionScore::default()
                    })
                    .collect()
            })
            .collect();
        rein_core::validate_group_scores(groups, &out)
            .map_err(|e| PluginError::new(&self.name, Some("score"), e.into()))?;
        Ok(out)
    }
}

impl<B: ReinBackend> RewardFn for ModelReward<B>
where
    Self: Send,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, groups: &[Group]) -> Result<Vec<GroupScores>, PluginError> {
        let result = self.score_groups(groups);
        self.failures.count(result)
    }

    fn failures(&self) -> FailureCounts {
        self.failures
    }
}
