//! A process reward model as a reward, in Math-Shepherd's convention (Wang et al. 2024,
//! "Math-Shepherd: Verify and Reinforce LLMs Step-by-step without Human Annotations"): a causal
//! LM reads the prompt and the completion with a tag after each step, and judges each step by
//! the next-token distribution at the tag's last token, restricted to a `good` and a `bad`
//! token:
//!
//! ```text
//! text      = prompt + " " + join(separator, [step_k + tag])
//! score_k   = softmax(z_t[good], z_t[bad])[good]        t: the position of step k's tag token
//! reward(y) = aggregate_k score_k                        (min, mean, last or prod)
//! ```
//!
//! The completion is split into steps at `separator`, empty steps dropped; a completion with no
//! step gets no score (the reward does not apply to it). Each step's score is also reported on
//! the step's span of the completion, for recipes that train on step scores. The tag, `good` and `bad` must each be
//! in the model's vocabulary (`good` and `bad` one token each; the tag is judged at its last
//! token, as Math-Shepherd's code does), and the tag's token must appear in the text exactly once
//! per step: a step that contains it is a failure of the reward, counted, that the run survives
//! as `on_error` says.

use std::path::Path;

use burn::module::Module;
use burn::tensor::{Int, Tensor, TensorData};
use rein_core::{
    CompletionScore, FailureCounts, Group, GroupScores, PluginError, PluginErrorKind, PrmAggregate, PrmSettings,
    RewardFn, StepScore,
};
use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, LmTokenizer, LoadError, load};

use crate::prompt_logprobs::sequence_hidden;

/// A process reward model scoring completions (see the module docs).
pub struct PrmReward<B: ReinBackend> {
    name: String,
    model: CausalLm<B>,
    tokenizer: LmTokenizer,
    settings: PrmSettings,
    /// The token each step is judged at.
    tag: u32,
    good: u32,
    bad: u32,
    device: B::Device,
    failures: FailureCounts,
}

/// Why a process reward model cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PrmError {
    /// The model directory or its tokenizer cannot be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
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
    /// Loads the causal LM in `dir` and its tokenizer, and finds the tag's, `good`'s and `bad`'s
    /// tokens.
    pub fn load(name: &str, dir: &Path, settings: &PrmSettings, device: &B::Device) -> Result<Self, PrmError> {
        let dir = rein_model::lm::locate(dir)?;
        let model = load::<B>(&dir, device)?.no_grad();
        let tokenizer = LmTokenizer::load(&dir, &[])?;
        let model_name = dir.display().to_string();
        let token = |key: &'static str, text: &str, last: bool| -> Result<u32, PrmError> {
            let ids = tokenizer.encode(text)?;
            match (ids.as_slice(), last) {
                ([id], _) | ([.., id], true) => Ok(*id),
                _ => Err(PrmError::NotOneToken {
                    model: model_name.clone(),
                    key,
                    text: text.into(),
                    count: ids.len(),
                }),
            }
        };
        Ok(Self {
            name: name.into(),
            tag: token("tag", &settings.tag, true)?,
            good: token("good", &settings.good, false)?,
            bad: token("bad", &settings.bad, false)?,
            model,
            tokenizer,
            settings: settings.clone(),
            device: device.clone(),
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
        let steps = self.steps(completion);
        if steps.is_empty() {
            return Ok(Vec::new());
        }
        let tagged: Vec<String> = steps.iter().map(|s| format!("{s}{}", self.settings.tag)).collect();
        let text = format!("{prompt} {}", tagged.join(&self.settings.separator));
        let ids = self.tokenizer.encode(&text).map_err(|e| e.to_string())?;
        let at: Vec<usize> = (ids.iter().enumerate())
            .filter(|(_, id)| **id == self.tag)
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
        let len = ids.len();
        let hidden = sequence_hidden(&self.model, &ids, &self.device);
        let rows: Vec<i64> = at.iter().map(|&i| i as i64).collect();
        let rows = Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [at.len()]), &self.device);
        let width = self.model.config().hidden_size;
        let judged = hidden.reshape([len, width]).select(0, rows).unsqueeze::<3>();
        let logits = self.model.logits(judged).into_data().convert::<f32>();
        let logits = logits.to_vec::<f32>().unwrap_or_default();
        let vocab = self.model.config().vocab_size;
        Ok((logits.chunks_exact(vocab))
            .map(|row| {
                let (good, bad) = (f64::from(row[self.good as usize]), f64::from(row[self.bad as usize]));
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
            for completion in &group.completions {
                let steps = self.step_scores(&group.prompt, completion).map_err(failed)?;
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
