//! A process reward model as a reward, in either of two conventions.
//!
//! **A causal LM** (Math-Shepherd's convention; Wang et al. 2024, "Math-Shepherd: Verify and
//! Reinforce LLMs Step-by-step without Human Annotations") reads the prompt and the completion
//! with a tag after each step, and judges each step by the next-token distribution at the tag's
//! last token, restricted to a `good` and a `bad` token:
//!
//! ```text
//! text      = prompt + " " + join(separator, [step_k + tag])
//! score_k   = softmax(z_t[good], z_t[bad])[good]        t: the position of step k's tag token
//! ```
//!
//! The tag, `good` and `bad` must each be in the model's vocabulary (`good` and `bad` one token
//! each; the tag is judged at its last token, as Math-Shepherd's code does), and the tag's token
//! must appear in the text exactly once per step: a step that contains it is a failure of the
//! reward, counted, that the run survives as `on_error` says.
//!
//! **A token classifier** with two labels (`*ForTokenClassification`, as TRL's `PRMTrainer` and
//! rein's `algorithm.name = "prm"` train one) reads the prompt and each step followed by the tag
//! — the text its training put after each step — each piece tokenized on its own as in training
//! (`LmTokenizer::encode_steps`), and judges each step at its tag's last token:
//!
//! ```text
//! score_k   = softmax(z_t)[1]                            t: the last token of step k's tag
//! ```
//!
//! A token classifier may also be **served** (`rein serve`, or vLLM serving it with its pooling
//! API): the texts are laid out and tokenized here, as above, and the server gives each token's
//! label probabilities (every token's, or each step tag's: vLLM's `STEP` pooling), through
//! [`crate::HttpTokenClassifier`].
//!
//! Either way the completion is split into steps at `separator`, empty steps dropped; a
//! completion with no step gets no score (the reward does not apply to it); the completion's
//! score is the steps' `aggregate` (min, mean, last or prod), and each step's score is also
//! reported on the step's span of the completion, for recipes that train on step scores.

use std::path::Path;

use burn::module::Module;
use rein_core::{
    CompletionScore, FailureCounts, Group, GroupScores, PluginError, PluginErrorKind, PrmAggregate, PrmSettings,
    RewardFn, StepScore,
};
use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, EncodedSteps, LmTokenizer, LoadError, TokenClassifier, load};

use crate::HttpTokenClassifier;

/// Completions a token-classifier PRM judges in one forward pass.
pub const CLASSIFIER_BATCH: usize = 16;

/// A process reward model scoring completions (see the module docs).
pub struct PrmReward<B: ReinBackend> {
    name: String,
    judge: Judge<B>,
    tokenizer: LmTokenizer,
    settings: PrmSettings,
    device: B::Device,
    failures: FailureCounts,
}

/// The model and how it judges a step.
enum Judge<B: ReinBackend> {
    /// A causal LM: `good` against `bad` after the `tag` token.
    NextToken {
        model: Box<CausalLm<B>>,
        tag: u32,
        good: u32,
        bad: u32,
    },
    /// A two-label token classifier: label 1 at each step's last token.
    Classifier(Box<TokenClassifier<B>>),
    /// A two-label token classifier on a server: label 1's probability at each step's last
    /// token, as the server answers it.
    Served(HttpTokenClassifier),
}

/// Why a process reward model cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PrmError {
    /// The model directory or its tokenizer cannot be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A token classifier without exactly two labels.
    #[error(
        "process reward model `{model}` is a token classifier with {labels} labels: a process reward model's has \
         two (label 1: the step is right)"
    )]
    NotTwoLabels {
        /// The model.
        model: String,
        /// How many labels it has.
        labels: usize,
    },
    /// A causal LM named for a server: only a token classifier's outputs come back from one.
    #[error(
        "process reward model `{model}` is not a token classifier: a served process reward model is a \
         `*ForTokenClassification` (a server's pooling API answers its label probabilities per token)"
    )]
    NotServable {
        /// The model.
        model: String,
    },
    /// A token the convention needs is not one token of the model's vocabulary.
    #[error(
        "process reward model `{model}`: prm.{key} = {text:?} encodes to {count} tokens of its vocabulary \
         (`good` and `bad` must be one token each, the tag at least one)"
    )]
    NotOneToken {
        /// The model.
        model: String,
        /// The setting (`good`, `bad`, `tag`).
        key: &'static str,
        /// Its text.
        text: String,
        /// How many tokens it encodes to.
        count: usize,
    },
}

impl<B: ReinBackend> PrmReward<B> {
    /// Loads the model in `dir` (a token classifier, or else a causal LM) and its tokenizer, and
    /// for a causal LM finds the tag's, `good`'s and `bad`'s tokens.
    pub fn load(name: &str, dir: &Path, settings: &PrmSettings, device: &B::Device) -> Result<Self, PrmError> {
        let dir = rein_model::lm::locate(dir)?;
        let tokenizer = LmTokenizer::load(&dir, &[])?;
        let model_name = dir.display().to_string();
        let token = |key, text: &str, last| setting_token(&tokenizer, &model_name, key, text, last);
        let judge = match TokenClassifier::<B>::is_token_classifier(&dir) {
            true => {
                check_token_classifier::<B>(&dir, &tokenizer, &model_name, settings)?;
                Judge::Classifier(Box::new(TokenClassifier::load(&dir, device)?))
            }
            false => Judge::NextToken {
                tag: token("tag", &settings.tag, true)?,
                good: token("good", &settings.good, false)?,
                bad: token("bad", &settings.bad, false)?,
                model: Box::new(load::<B>(&dir, device)?.no_grad()),
            },
        };
        Ok(Self {
            name: name.into(),
            judge,
            tokenizer,
            settings: settings.clone(),
            device: device.clone(),
            failures: FailureCounts::default(),
        })
    }

    /// The token classifier in `dir` served at `url` (under the name `served_model`, or the
    /// server's only model): `dir` gives the tokenizer and the labels (two), the server each
    /// token's label probabilities. Each request (a group's completions) may take `timeout`.
    pub fn served(
        name: &str,
        dir: &Path,
        settings: &PrmSettings,
        url: &str,
        served_model: Option<&str>,
        timeout: std::time::Duration,
    ) -> Result<Self, PrmError> {
        let dir = rein_model::lm::locate(dir)?;
        let model_name = dir.display().to_string();
        if !TokenClassifier::<B>::is_token_classifier(&dir) {
            return Err(PrmError::NotServable { model: model_name });
        }
        let tokenizer = LmTokenizer::load(&dir, &[])?;
        check_token_classifier::<B>(&dir, &tokenizer, &model_name, settings)?;
        Ok(Self {
            name: name.into(),
            judge: Judge::Served(HttpTokenClassifier::new(url, served_model, timeout)),
            tokenizer,
            settings: settings.clone(),
            device: Default::default(),
            failures: FailureCounts::default(),
        })
    }

    /// The steps of `completion`: split at the separator, empty ones dropped.
    pub fn steps<'a>(&self, completion: &'a str) -> Vec<&'a str> {
        (completion.split(self.settings.separator.as_str()))
            .filter(|s| !s.trim().is_empty())
            .collect()
    }

    /// Where each of [`Self::steps`] lies in `completion`, in characters: the spans its step
    /// scores are reported on.
    pub fn step_spans(&self, completion: &str) -> Vec<(usize, usize)> {
        (self.steps(completion).into_iter())
            .map(|step| {
                let at = step.as_ptr() as usize - completion.as_ptr() as usize;
                let start = completion[..at].chars().count();
                (start, start + step.chars().count())
            })
            .collect()
    }

    /// Each step's score for `completion` after `prompt` (see the module docs); empty when the
    /// completion has no step. The error says why the text cannot be judged.
    pub fn step_scores(&self, prompt: &str, completion: &str) -> Result<Vec<f64>, String> {
        Ok(self.group_step_scores(prompt, &[completion])?.remove(0))
    }

    /// [`Self::step_scores`] of each of `completions` after `prompt`; a token classifier judges
    /// them `CLASSIFIER_BATCH` at a time, right-padded.
    pub fn group_step_scores(&self, prompt: &str, completions: &[&str]) -> Result<Vec<Vec<f64>>, String> {
        match &self.judge {
            Judge::NextToken { model, tag, good, bad } => (completions.iter())
                .map(|completion| match self.steps(completion) {
                    steps if steps.is_empty() => Ok(Vec::new()),
                    steps => self.next_token_scores(model, prompt, &steps, *tag, (*good, *bad)),
                })
                .collect(),
            Judge::Classifier(_) | Judge::Served(_) => self.classifier_scores(prompt, completions),
        }
    }

    /// A token classifier's step scores, in process or served: label 1's probability at each
    /// step's last token.
    fn classifier_scores(&self, prompt: &str, completions: &[&str]) -> Result<Vec<Vec<f64>>, String> {
        let mut encoded = Vec::with_capacity(completions.len());
        for (i, completion) in completions.iter().enumerate() {
            let steps = self.steps(completion);
            if !steps.is_empty() {
                let steps = self.tokenizer.encode_steps(prompt, &steps, &self.settings.tag);
                encoded.push((i, steps.map_err(|e| e.to_string())?));
            }
        }
        let mut scores = vec![Vec::new(); completions.len()];
        if let Judge::Served(server) = &self.judge {
            let sequences: Vec<&[u32]> = encoded.iter().map(|(_, e)| e.ids.as_slice()).collect();
            for ((i, e), rows) in encoded.iter().zip(server.rows(&sequences)?) {
                scores[*i] = served_step_scores(server.url(), e, &rows)?;
            }
            return Ok(scores);
        }
        let Judge::Classifier(model) = &self.judge else {
            unreachable!("classifier_scores judges with a token classifier")
        };
        for chunk in encoded.chunks(CLASSIFIER_BATCH) {
            let sequences: Vec<&[u32]> = chunk.iter().map(|(_, e)| e.ids.as_slice()).collect();
            let at: Vec<(usize, usize)> = (chunk.iter().enumerate())
                .flat_map(|(row, (_, e))| e.step_ends.iter().map(move |&end| (row, end)))
                .collect();
            let logits = model
                .logits_at(&sequences, &at, &self.device)
                .into_data()
                .convert::<f32>();
            let logits = logits.to_vec::<f32>().unwrap_or_default();
            let mut probabilities =
                (logits.chunks_exact(2)).map(|z| 1.0 / (1.0 + (f64::from(z[0]) - f64::from(z[1])).exp()));
            for (i, e) in chunk {
                scores[*i] = probabilities.by_ref().take(e.step_ends.len()).collect();
            }
        }
        Ok(scores)
    }

    /// Math-Shepherd's step scores: `good` against `bad` after each step's `tag`.
    fn next_token_scores(
        &self,
        model: &CausalLm<B>,
        prompt: &str,
        steps: &[&str],
        tag: u32,
        (good, bad): (u32, u32),
    ) -> Result<Vec<f64>, String> {
        let tagged: Vec<String> = steps.iter().map(|s| format!("{s}{}", self.settings.tag)).collect();
        let text = format!("{prompt} {}", tagged.join(&self.settings.separator));
        let ids = self.tokenizer.encode(&text).map_err(|e| e.to_string())?;
        let at: Vec<usize> = (ids.iter().enumerate())
            .filter(|(_, id)| **id == tag)
            .map(|(i, _)| i)
            .collect();
        if at.len() != steps.len() {
            return Err(format!(
                "the step tag's token appears {} times in the text of {} steps (a step contains it, or the \
                 tokenizer merges it with its neighbours): {:?}",
                at.len(),
                steps.len(),
                self.settings.tag
            ));
        }
        let at: Vec<(usize, usize)> = at.into_iter().map(|t| (0, t)).collect();
        let judged = model.hidden_at(&[ids], 0, &at, &self.device).unsqueeze::<3>();
        let logits = model.logits(judged).into_data().convert::<f32>();
        let logits = logits.to_vec::<f32>().unwrap_or_default();
        let vocab = model.config().vocab_size;
        Ok((logits.chunks_exact(vocab))
            .map(|row| {
                let (good, bad) = (f64::from(row[good as usize]), f64::from(row[bad as usize]));
                1.0 / (1.0 + (bad - good).exp())
            })
            .collect())
    }

    /// The completion's score from its steps' (`None` without steps).
    pub fn aggregate(&self, steps: &[f64]) -> Option<f64> {
        let n = steps.len();
        (n > 0).then(|| match self.settings.aggregate {
            PrmAggregate::Min => steps.iter().copied().fold(f64::INFINITY, f64::min),
            PrmAggregate::Mean => steps.iter().sum::<f64>() / n as f64,
            PrmAggregate::Last => steps[n - 1],
            PrmAggregate::Prod => steps.iter().product(),
        })
    }

    fn score_groups(&self, groups: &[Group]) -> Result<Vec<GroupScores>, PluginError> {
        let failed = |reason: String| PluginError::new(&self.name, Some("score"), PluginErrorKind::Host { reason });
        let mut out = Vec::with_capacity(groups.len());
        for group in groups {
            let mut scores = Vec::with_capacity(group.completions.len());
            let completions: Vec<&str> = group.completions.iter().map(String::as_str).collect();
            let group_steps = self.group_step_scores(&group.prompt, &completions).map_err(failed)?;
            for (completion, steps) in group.completions.iter().zip(group_steps) {
                let spans = self.step_spans(completion).into_iter().zip(&steps);
                scores.push(CompletionScore {
                    score: self.aggregate(&steps),
                    components: vec![("steps".into(), steps.len() as f64)],
                    steps: spans
                        .map(|((start, end), &score)| StepScore { start, end, score })
                        .collect(),
                });
            }
            out.push(scores);
        }
        rein_core::validate_group_scores(groups, &out)
            .map_err(|e| PluginError::new(&self.name, Some("score"), e.into()))?;
        Ok(out)
    }
}

impl<B: ReinBackend> RewardFn for PrmReward<B>
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

/// The token of the setting `prm.{key}` = `text` in `tokenizer`: its only one, or with `last`
/// its last; else an error naming `model`, the key and the token count.
fn setting_token(
    tokenizer: &LmTokenizer,
    model: &str,
    key: &'static str,
    text: &str,
    last: bool,
) -> Result<u32, PrmError> {
    let ids = tokenizer.encode(text)?;
    match (ids.as_slice(), last) {
        ([id], _) | ([.., id], true) => Ok(*id),
        _ => Err(PrmError::NotOneToken {
            model: model.into(),
            key,
            text: text.into(),
            count: ids.len(),
        }),
    }
}

/// Whether the token classifier in `dir` (`model`) can judge steps, in process or served: a tag
/// of at least one token, and two labels in its `config.json`.
fn check_token_classifier<B: ReinBackend>(
    dir: &Path,
    tokenizer: &LmTokenizer,
    model: &str,
    settings: &PrmSettings,
) -> Result<(), PrmError> {
    setting_token(tokenizer, model, "tag", &settings.tag, true)?;
    let labels = TokenClassifier::<B>::labels_of(dir)?.len();
    if labels != 2 {
        return Err(PrmError::NotTwoLabels {
            model: model.into(),
            labels,
        });
    }
    Ok(())
}

/// The step scores of one served sequence from the server's rows: a row per token (label 1 at
/// each step's last token) or a row per step (pooled at the step tag); two labels each.
fn served_step_scores(server: &str, encoded: &EncodedSteps, rows: &[Vec<f64>]) -> Result<Vec<f64>, String> {
    let (tokens, steps) = (encoded.ids.len(), encoded.step_ends.len());
    if let Some(row) = rows.iter().find(|row| row.len() != 2) {
        return Err(format!(
            "{server} answered {} label probabilities per token; a process reward model has two",
            row.len()
        ));
    }
    let picked: Vec<&Vec<f64>> = match rows.len() {
        n if n == tokens => encoded.step_ends.iter().map(|&end| &rows[end]).collect(),
        n if n == steps => rows.iter().collect(),
        n => {
            return Err(format!(
                "{server} answered {n} rows for a sequence of {tokens} tokens and {steps} steps: a process reward \
                 model's server pools every token, or one per step at the step tag"
            ));
        }
    };
    Ok(picked.into_iter().map(|row| row[1]).collect())
}
