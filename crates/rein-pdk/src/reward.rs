//! The reward world: the [`Reward`] trait and its export adapter.

use std::marker::PhantomData;

use crate::__private::reward::exports::rein::plugin::reward_api as wit;
use crate::__private::reward::rein::plugin::types::{PluginError, PluginMetadata as WitMetadata};
use crate::config::Config;
use crate::metadata::Metadata;

/// One prompt with its G completions, as the host sends it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Group {
    /// The prompt.
    pub prompt: String,
    /// The completions to score, in order.
    pub completions: Vec<String>,
    /// The reference answer, if the dataset has one.
    pub reference: Option<String>,
    /// The dataset row's metadata as JSON text (empty when none).
    pub metadata: String,
    /// Each completion's tokens when the reward reads them ([`Reward::READS_TOKENS`]); empty
    /// otherwise.
    pub tokens: Vec<Vec<Token>>,
    /// The prompt's images when the reward reads them ([`Reward::READS_IMAGES`]); empty
    /// otherwise. The prompt's `<image>` markers show where the model saw each.
    pub images: Vec<crate::Image>,
}

/// One token of a completion, as the sampler drew it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Token {
    /// The characters it added to the completion (the texts of a completion's tokens,
    /// concatenated, are the completion).
    pub text: String,
    /// Its log-probability under the policy that sampled it.
    pub logprob: f32,
}

impl Group {
    /// The metadata parsed as JSON (`null` when empty).
    pub fn metadata_json(&self) -> Result<serde_json::Value, String> {
        parse_row_metadata(&self.metadata, "group")
    }
}

/// A dataset row's metadata (JSON text) parsed, `null` when empty; `whose` names it in the
/// error (`group metadata is not valid JSON: …`).
pub(crate) fn parse_row_metadata(text: &str, whose: &str) -> Result<serde_json::Value, String> {
    if text.trim().is_empty() {
        return Ok(serde_json::Value::Null);
    }
    serde_json::from_str(text).map_err(|e| format!("{whose} metadata is not valid JSON: {e}"))
}

/// The reward of one completion: a value (or "not applicable"), named components, and scores
/// of its steps.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Score {
    /// The score, `None` when the reward does not apply.
    pub value: Option<f64>,
    /// Named parts, for logging.
    pub components: Vec<(String, f64)>,
    /// Scores of steps: `(start, end, score)` over the completion's characters (see
    /// [`crate::steps`]).
    pub steps: Vec<(usize, usize, f64)>,
}

impl Score {
    /// A score of `value`.
    pub fn new(value: f64) -> Self {
        Self {
            value: Some(value),
            ..Self::default()
        }
    }

    /// "Not applicable": the completion is not judged by this reward.
    pub fn not_applicable() -> Self {
        Self::default()
    }

    /// Adds a named component.
    pub fn with(mut self, name: &str, value: f64) -> Self {
        self.components.push((name.to_string(), value));
        self
    }

    /// Adds the score of one step ([`crate::steps::Step`]), which the host credits to the token
    /// completing the step when the recipe trains on step scores.
    pub fn step(mut self, step: &crate::steps::Step<'_>, score: f64) -> Self {
        self.steps.push((step.start, step.end, score));
        self
    }
}

impl From<f64> for Score {
    fn from(value: f64) -> Self {
        Score::new(value)
    }
}

impl From<bool> for Score {
    /// 1 for `true`, 0 for `false`.
    fn from(ok: bool) -> Self {
        Score::new(if ok { 1.0 } else { 0.0 })
    }
}

/// A reward function over groups of completions.
pub trait Reward: Sized + 'static {
    /// Name, version, description and accepted config keys.
    const METADATA: Metadata;

    /// It reads each completion's tokens ([`Group::tokens`]); the host sends them only then.
    const READS_TOKENS: bool = false;

    /// It reads the prompt's images ([`Group::images`]); the host sends them only then.
    const READS_IMAGES: bool = false;

    /// Builds the reward from its config (unknown keys were already rejected).
    fn new(config: &Config) -> Result<Self, String>;

    /// Scores one group: exactly one [`Score`] per completion, in order.
    fn score(&mut self, group: &Group) -> Result<Vec<Score>, String>;
}

/// Adapts a [`Reward`] to the generated `reward-api` exports.
#[doc(hidden)]
pub struct RewardExport<R>(PhantomData<R>);

fn error(message: String) -> PluginError {
    PluginError { message }
}

impl<R: Reward> wit::Guest for RewardExport<R> {
    fn metadata() -> WitMetadata {
        R::METADATA.to_wit()
    }

    fn inputs() -> wit::RewardInputs {
        let mut inputs = wit::RewardInputs::empty();
        inputs.set(wit::RewardInputs::TOKENS, R::READS_TOKENS);
        inputs.set(wit::RewardInputs::IMAGES, R::READS_IMAGES);
        inputs
    }

    fn init(config: String) -> Result<(), PluginError> {
        let config = Config::parse(&config, &R::METADATA).map_err(error)?;
        let reward = R::new(&config).map_err(error)?;
        crate::instance::set(reward);
        Ok(())
    }

    fn score(groups: Vec<wit::Group>) -> Result<Vec<Vec<wit::CompletionScore>>, PluginError> {
        crate::instance::with("score", |reward: &mut R| {
            groups
                .into_iter()
                .enumerate()
                .map(|(i, g)| {
                    let group = Group {
                        prompt: g.prompt,
                        completions: g.completions,
                        reference: g.reference,
                        metadata: g.metadata,
                        tokens: (g.tokens.into_iter())
                            .map(|tokens| {
                                (tokens.into_iter())
                                    .map(|t| Token {
                                        text: t.text,
                                        logprob: t.logprob,
                                    })
                                    .collect()
                            })
                            .collect(),
                        images: g.images.into_iter().map(crate::Image::from).collect(),
                    };
                    let scores = reward.score(&group).map_err(|e| error(format!("group {i}: {e}")))?;
                    Ok(scores
                        .into_iter()
                        .map(|s| wit::CompletionScore {
                            score: s.value,
                            components: s
                                .components
                                .into_iter()
                                .map(|(name, value)| wit::Component { name, value })
                                .collect(),
                            steps: (s.steps.into_iter())
                                .map(|(start, end, score)| wit::StepScore {
                                    start: start as u32,
                                    end: end as u32,
                                    score,
                                })
                                .collect(),
                        })
                        .collect())
                })
                .collect()
        })
        .map_err(error)?
    }
}
