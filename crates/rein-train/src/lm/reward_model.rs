//! A reward model as a reward: each completion, after its prompt and through the reward model's
//! own chat template (as TRL renders reward-model inputs), scored by a sequence classifier, a
//! batch of similar lengths at a time. Scores pass the same checks as a plugin's (one finite
//! score per completion) and join the weighted sum like any reward.

use std::path::Path;

use rein_core::{CompletionScore, FailureCounts, Group, GroupScores, PluginError, PluginErrorKind, RewardFn};
use rein_model::ReinBackend;
use rein_model::lm::{ChatMessage, LmTokenizer, LoadError, SequenceClassifier};

/// A sequence classifier scoring completions (see the module docs).
pub struct ModelReward<B: ReinBackend> {
    name: String,
    classifier: SequenceClassifier<B>,
    tokenizer: LmTokenizer,
    /// The column of the classifier's output that is the score.
    label: usize,
    batch_size: usize,
    device: B::Device,
    failures: FailureCounts,
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
        let dir = rein_model::lm::locate(dir)?;
        let tokenizer = LmTokenizer::load(&dir, &[])?;
        let label =
            match label {
                None => 0,
                Some(wanted) => classifier.labels().iter().position(|l| l == wanted).ok_or_else(|| {
                    RewardModelError::NoSuchLabel {
                        model: dir.display().to_string(),
                        label: wanted.into(),
                        labels: classifier.labels().to_vec(),
                    }
                })?,
            };
        Ok(Self {
            name: name.into(),
            classifier,
            tokenizer,
            label,
            batch_size: batch_size.max(1),
            device: device.clone(),
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

    /// The score of each text, in order.
    pub fn score_texts(&self, texts: &[String]) -> Result<Vec<f64>, LoadError> {
        let ids = texts
            .iter()
            .map(|t| self.tokenizer.encode(t))
            .collect::<Result<Vec<_>, _>>()?;
        // Similar lengths batched together, so little of each batch is padding. Each row's
        // score does not depend on the others in its batch.
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by_key(|&i| ids[i].len());
        let mut scores = vec![0.0; ids.len()];
        let width = self.classifier.labels().len();
        for chunk in order.chunks(self.batch_size) {
            let batch: Vec<Vec<u32>> = chunk.iter().map(|&i| ids[i].clone()).collect();
            let values = self.classifier.scores(&batch, &self.device).into_data();
            let values = values.convert::<f32>().to_vec::<f32>().unwrap_or_default();
            for (row, &i) in chunk.iter().enumerate() {
                scores[i] = values
                    .get(row * width + self.label)
                    .copied()
                    .map_or(f64::NAN, f64::from);
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
        let mut scores = self.score_texts(&texts).map_err(|e| failed(e.to_string()))?.into_iter();
        let out: Vec<GroupScores> = (groups.iter())
            .map(|g| {
                (g.completions.iter())
                    .map(|_| CompletionScore {
                        score: scores.next(),
                        components: Vec::new(),
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
