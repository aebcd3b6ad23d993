//! Held-out evaluation: greedy pass@1, sampled pass@k and maj@k, judged by the same reward
//! plugins the run trains with.

use std::collections::BTreeMap;

use rein_core::{CompletionScore, Group, RewardFn};
use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, LmTokenizer};
use rein_model::vision::ProcessedImage;
use rein_sampler::{GenerationConfig, PromptsWithImages, generate_prompts};
use serde::{Deserialize, Serialize};

use crate::LmError;
use crate::Prompt;
use crate::rollout::episodes::{Agent, play};

/// How many held-out prompts an [`EvalReport`] keeps with their greedy completions.
pub const SHOWN_EXAMPLES: usize = 4;

/// One held-out prompt with its greedy completion, for the run's report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalExample {
    /// The prompt as written in the data.
    pub prompt: String,
    /// The reference answer.
    pub reference: Option<String>,
    /// The greedy completion (up to its stop string).
    pub completion: String,
    /// Whether it was judged correct.
    pub correct: bool,
}

/// Accuracy figures on the held-out split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    /// Prompts evaluated.
    pub examples: usize,
    /// Fraction answered correctly by the greedy completion.
    pub greedy_accuracy: f64,
    /// Samples per prompt for the sampled figures.
    pub k: usize,
    /// Fraction with at least one correct sample out of `k`.
    pub pass_at_k: Option<f64>,
    /// Fraction whose majority answer among `k` samples is correct.
    pub maj_at_k: Option<f64>,
    /// The first [`SHOWN_EXAMPLES`] prompts with their greedy completions.
    #[serde(default)]
    pub shown: Vec<EvalExample>,
    /// What the greedy episodes did with their tools (multi-turn recipes).
    #[serde(default)]
    pub episodes: Option<EpisodeSummary>,
    /// Greedy accuracy per data source, when the held-out prompts come from several.
    #[serde(default)]
    pub by_source: BTreeMap<String, f64>,
}

impl EvalReport {
    /// The report in one line (`greedy accuracy 62.5%, pass@4 …`), as the CLI and the run print
    /// it.
    pub fn one_line(&self) -> String {
        let pct = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.1}%", 100.0 * v));
        let by_source: Vec<String> = (self.by_source.iter())
            .map(|(source, accuracy)| format!("{source} {}", pct(Some(*accuracy))))
            .collect();
        let by_source = match by_source.is_empty() {
            true => String::new(),
            false => format!("; greedy by source: {}", by_source.join(", ")),
        };
        let sampled = match self.k {
            0 => String::new(),
            k => format!(", pass@{k} {}, maj@{k} {}", pct(self.pass_at_k), pct(self.maj_at_k)),
        };
        format!(
            "greedy accuracy {:.1}%{sampled} ({} prompts{by_source})",
            100.0 * self.greedy_accuracy,
            self.examples,
        )
    }
}

/// The greedy episodes' turns and tool use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeSummary {
    /// Mean model turns per episode.
    pub turns: f64,
    /// Fraction of episodes with at least one tool call.
    pub tool_call_rate: f64,
    /// Tool calls that came back as errors, over all episodes.
    pub tool_errors: usize,
    /// Fraction of episodes cut by a turn or token limit.
    pub truncated: f64,
}

/// Whether a completion counts as correct: a `correct` component of 1, or else a positive score.
pub fn is_correct(score: &CompletionScore) -> bool {
    let correct = score.components.iter().find(|(name, _)| name == "correct");
    counts_as_correct(correct.map(|(_, v)| *v), score.score)
}

/// [`is_correct`]'s rule on a completion's `correct` component and score (`None` where the
/// reward gives none).
pub fn counts_as_correct(correct: Option<f64>, score: Option<f64>) -> bool {
    match correct {
        Some(v) => v >= 1.0,
        None => score.is_some_and(|s| s > 0.0),
    }
}

/// Settings of one evaluation.
pub struct EvalSettings<'a> {
    /// Samples per prompt for pass@k / maj@k (0 = greedy only).
    pub k: usize,
    /// Temperature for the samples.
    pub temperature: f32,
    /// Most new tokens.
    pub max_new_tokens: usize,
    /// Prompts per generation batch.
    pub batch: usize,
    /// Seed of the samples.
    pub seed: u64,
    /// Extra stop strings.
    pub stop: &'a [String],
}

/// Evaluates `model` on `prompts` with `accuracy` as the judge and `majority` (a majority-vote
/// reward reporting an `agreement` component) for maj@k.
#[allow(clippy::too_many_arguments)]
pub fn evaluate<B: ReinBackend>(
    model: &CausalLm<B>,
    tokenizer: &LmTokenizer,
    prompts: &[Prompt],
    accuracy: &mut dyn RewardFn,
    majority: Option<&mut dyn RewardFn>,
    mut agent: Option<&mut Agent>,
    settings: &EvalSettings<'_>,
    device: &B::Device,
) -> Result<EvalReport, LmError> {
    let mut summary = agent.is_some().then_some(EpisodeSummary {
        turns: 0.0,
        tool_call_rate: 0.0,
        tool_errors: 0,
        truncated: 0.0,
    });
    let greedy = sample_and_score(
        model,
        tokenizer,
        prompts,
        accuracy,
        None,
        (agent.as_deref_mut(), summary.as_mut()),
        1,
        0.0,
        settings,
        device,
    )?;
    let greedy_accuracy = greedy.iter().filter(|g| g.correct[0]).count() as f64 / prompts.len().max(1) as f64;
    let (pass_at_k, maj_at_k) = if settings.k > 0 {
        let has_majority = majority.is_some();
        let sampled = sample_and_score(
            model,
            tokenizer,
            prompts,
            accuracy,
            majority,
            (agent, None),
            settings.k,
            settings.temperature,
            settings,
            device,
        )?;
        let pass = sampled.iter().filter(|g| g.correct.iter().any(|&c| c)).count() as f64 / prompts.len().max(1) as f64;
        let maj = has_majority.then(|| {
            let hits = sampled
                .iter()
                .filter(|g| g.correct.iter().zip(&g.agrees).any(|(&c, &a)| c && a))
                .count();
            hits as f64 / prompts.len().max(1) as f64
        });
        (Some(pass), maj)
    } else {
        (None, None)
    };
    let by_source = accuracy_by_source(prompts, &greedy);
    let shown = (prompts.iter().zip(greedy))
        .take(SHOWN_EXAMPLES)
        .map(|(prompt, mut judged)| EvalExample {
            prompt: prompt.text.clone(),
            reference: prompt.answer.clone(),
            completion: judged.completions.swap_remove(0),
            correct: judged.correct[0],
        })
        .collect();
    Ok(EvalReport {
        examples: prompts.len(),
        greedy_accuracy,
        k: settings.k,
        pass_at_k,
        maj_at_k,
        shown,
        episodes: summary,
        by_source,
    })
}

/// The greedy accuracy of each source's prompts; empty when there are fewer than two sources.
fn accuracy_by_source(prompts: &[Prompt], greedy: &[Judged]) -> BTreeMap<String, f64> {
    let mut counts: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for (prompt, judged) in prompts.iter().zip(greedy) {
        let name = crate::source_label(&prompt.source);
        let (right, all) = counts.entry(name.to_string()).or_default();
        *right += usize::from(judged.correct[0]);
        *all += 1;
    }
    if counts.len() < 2 {
        return BTreeMap::new();
    }
    (counts.into_iter())
        .map(|(name, (right, all))| (name, right as f64 / all as f64))
        .collect()
}

struct Judged {
    completions: Vec<String>,
    correct: Vec<bool>,
    agrees: Vec<bool>,
}

#[allow(clippy::too_many_arguments)]
fn sample_and_score<B: ReinBackend>(
    model: &CausalLm<B>,
    tokenizer: &LmTokenizer,
    prompts: &[Prompt],
    accuracy: &mut dyn RewardFn,
    mut majority: Option<&mut dyn RewardFn>,
    (mut agent, mut summary): (Option<&mut Agent>, Option<&mut EpisodeSummary>),
    n: usize,
    temperature: f32,
    settings: &EvalSettings<'_>,
    device: &B::Device,
) -> Result<Vec<Judged>, LmError> {
    let mut judged = Vec::with_capacity(prompts.len());
    let per_batch = (settings.batch / n).max(1);
    for (c, chunk) in prompts.chunks(per_batch).enumerate() {
        let config = GenerationConfig {
            max_new_tokens: settings.max_new_tokens,
            temperature,
            n,
            stop_token_ids: tokenizer.eos_ids().to_vec(),
            seed: settings.seed,
            ..GenerationConfig::default()
        };
        let completions: Vec<String> = match agent.as_deref_mut() {
            Some(agent) => {
                let chosen: Vec<&Prompt> = chunk.iter().collect();
                // Episode ids the training run never uses (it counts up from 0).
                let first_id = u64::MAX / 2 + (c * per_batch * n) as u64;
                let episodes = play(model, tokenizer, agent, &chosen, &config, first_id, device)?;
                if let Some(summary) = summary.as_deref_mut() {
                    let share = |x: usize| x as f64 / prompts.len().max(1) as f64;
                    for e in &episodes {
                        summary.turns += share(e.turns);
                        summary.tool_call_rate += share(usize::from(e.tool_calls > 0));
                        summary.tool_errors += e.tool_errors.values().sum::<usize>();
                        summary.truncated += share(usize::from(e.truncated));
                    }
                }
                episodes.into_iter().map(|e| e.text).collect()
            }
            None => {
                let ids: Vec<Vec<u32>> = chunk.iter().map(|p| p.tokens.clone()).collect();
                let images: Vec<&[ProcessedImage]> = chunk.iter().map(|p| &p.images[..]).collect();
                let generations = generate_prompts(
                    model,
                    PromptsWithImages {
                        prompts: &ids,
                        images: &images,
                    },
                    &config,
                    tokenizer.pad_id().unwrap_or(0),
                    &mut crate::stop_check(tokenizer, settings.stop),
                    device,
                )
                .map_err(|e| LmError::Unsupported(e.to_string()))?;
                (generations.iter())
                    .map(|g| crate::completion_text(tokenizer, &g.tokens, settings.stop))
                    .collect()
            }
        };
        let reads_images = accuracy.reads_images();
        let groups: Vec<Group> = chunk
            .iter()
            .enumerate()
            .map(|(i, p)| Group {
                prompt: p.text.clone(),
                completions: completions[i * n..(i + 1) * n].to_vec(),
                reference: p.answer.clone(),
                metadata: p.metadata.clone(),
                tokens: Vec::new(),
                images: match reads_images {
                    true => p.image_files.to_vec(),
                    false => Vec::new(),
                },
            })
            .collect();
        let scores = accuracy.score(&groups)?;
        let agreement = match majority.as_deref_mut() {
            Some(m) => Some(m.score(&groups)?),
            None => None,
        };
        for (g, (group_scores, group)) in scores.iter().zip(groups).enumerate() {
            let agrees = match &agreement {
                Some(a) => a[g]
                    .iter()
                    .map(|s| s.components.iter().any(|(k, v)| k == "agreement" && *v >= 1.0))
                    .collect(),
                None => vec![false; n],
            };
            judged.push(Judged {
                completions: group.completions,
                correct: group_scores.iter().map(is_correct).collect(),
                agrees,
            });
        }
    }
    Ok(judged)
}
