//! Language-model post-training: supervised fine-tuning, the GRPO family, PPO with a critic,
//! the DPO family and reward models, with prompts or preference pairs from files or a generated
//! task, rewards from sandboxed plugins, and held-out evaluation. [`run_lm`] runs a recipe's
//! stages; each algorithm is a `rein_run::driver::Trainer` the run's machinery drives.
//!
//! **Architecture invariant:** this crate trains language models only; environments and
//! classic control are `rein-control`'s, the driver, checkpoints and metrics `rein-run`'s.

mod batch;
mod bradley_terry;
pub(crate) mod critic;
mod data;
pub mod data_parallel;
mod dpo;
pub mod episodes;
mod error;
mod eval;
mod grpo;
mod judge;
mod preferences;
mod recipe_data;
mod recipe_keys;
mod report;
mod reward_model;
mod reward_setup;
mod rewards;
mod rollout_source;
mod run;
mod setup;
mod sft;
mod task;
pub mod tool_calls;
pub mod transcript;
mod turn_advantages;

use std::path::{Path, PathBuf};

pub use batch::{
    CompletionLogits, CompletionOutputs, TokenBatch, completion_log_probs, completion_logits, completion_outputs,
};
pub use bradley_terry::{BradleyTerry, PairScores, pair_scores, pairwise_accuracy};
pub use critic::Critic;
pub use data::{DataError, Example, Fields, read, write_jsonl};
pub use dpo::{Dpo, PairLogProbs, dpo_batch_loss, pair_batch, reference_log_probs};
pub use error::LmError;
pub use eval::{
    EpisodeSummary, EvalExample, EvalReport, EvalSettings, SHOWN_EXAMPLES, counts_as_correct, evaluate, is_correct,
};
pub use grpo::{Grpo, GrpoContext, GrpoOutcome};
pub use judge::NativeJudge;
pub use preferences::{
    PreferenceExample, PreferencePair, Skipped, pairs_from_examples, prepare_preferences, read_preferences,
    report_skipped,
};
pub(crate) use recipe_data::{PreferenceUse, RecipeData, read_data};
pub use rein_sampler::{completion_text, stop_check};
pub use reward_model::{ModelReward, RewardModelError};
pub use rewards::{
    GroupReward, OnError, Renamed, RewardFailure, ThinkingStripped, WeightedReward, score_groups, without_thinking,
};
pub use run::{DpoOutcome, LmOutcome, RewardModelOutcome, describe, run_lm};
pub use setup::evaluate_recipe;
pub use sft::Sft;
pub use task::{ArithmeticTask, generate_task, slipped_solution};

use rein_model::lm::{ChatMessage, LmTokenizer};
use transcript::{Transcript, TranscriptError};

use rein_recipe::DataSection;

/// A prompt ready to sample from.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    /// The prompt as written in the data (what reward plugins see).
    pub text: String,
    /// Its tokens, chat template applied.
    pub tokens: Vec<u32>,
    /// The reference answer.
    pub answer: Option<String>,
    /// The target completion's tokens, end-of-sequence included (SFT).
    pub target: Option<Vec<u32>>,
    /// Which target tokens are the model's (trained on): all of a single-turn completion; a
    /// multi-turn trace's assistant turns but not its tool results.
    pub target_trained: Option<Vec<bool>>,
    /// Metadata JSON.
    pub metadata: String,
    /// The data source it came from (the `data.fields.source` column, verl's `data_source`);
    /// empty when the row names none.
    pub source: String,
}

/// The opening messages of a prompt: a system prompt (if any), then the user turn.
pub fn opening_messages(prompt: &str, system: Option<&str>) -> Vec<ChatMessage> {
    let system = system.iter().map(|system| ChatMessage {
        role: "system".into(),
        content: system.to_string(),
    });
    let user = ChatMessage {
        role: "user".into(),
        content: prompt.to_string(),
    };
    system.chain(std::iter::once(user)).collect()
}

/// A target completion written as a conversation (TRL's conversational format: a JSON list of
/// `{"role", "content"}` messages, assistant turns alternating with tool or user turns).
fn trace(completion: &str) -> Option<Vec<ChatMessage>> {
    if !completion.trim_start().starts_with('[') {
        return None;
    }
    let messages: Vec<ChatMessage> = serde_json::from_str(completion).ok()?;
    messages
        .first()
        .is_some_and(|m| m.role == "assistant")
        .then_some(messages)
}

/// Tokenizes examples: chat template (when the data asks and the tokenizer has one) offering
/// `tools`, target completions followed by the end-of-sequence token. A target written as a
/// conversation (see [`trace`]) becomes the transcript a multi-turn episode would produce:
/// the model's turns trained on, the tools' results appended as the template renders them and
/// masked.
pub fn prepare(
    examples: &[Example],
    tokenizer: &LmTokenizer,
    data: &DataSection,
    tools: &[serde_json::Value],
) -> Result<Vec<Prompt>, TranscriptError> {
    let eos = tokenizer.eos_ids().first().copied();
    let templated = data.chat_template && tokenizer.has_chat_template();
    examples
        .iter()
        .map(|e| {
            let opening = opening_messages(&e.prompt, data.system_prompt.as_deref());
            if let Some(messages) = e.completion.as_deref().and_then(trace).filter(|_| templated) {
                let mut transcript = Transcript::open(tokenizer, opening, tools.to_vec())?;
                for message in messages {
                    match message.role.as_str() {
                        "assistant" => {
                            let mut ids = tokenizer.encode(&message.content)?;
                            ids.extend(eos);
                            transcript.push_model_turn(tokenizer, &ids, &vec![0.0; ids.len()])?;
                        }
                        _ => {
                            transcript.push_env_messages(tokenizer, vec![message])?;
                        }
                    }
                }
                let at = transcript.prompt_len();
                return Ok(Prompt {
                    text: e.prompt.clone(),
                    tokens: transcript.tokens()[..at].to_vec(),
                    answer: e.answer.clone(),
                    target: Some(transcript.tokens()[at..].to_vec()),
                    target_trained: Some(transcript.sampled()[at..].to_vec()),
                    metadata: e.metadata.clone(),
                    source: source_of(&e.metadata, &data.fields.source),
                });
            }
            let text = match templated {
                true => tokenizer
                    .apply_chat_template_with_tools(&opening, tools, true)?
                    .unwrap_or_else(|| e.prompt.clone()),
                false => e.prompt.clone(),
            };
            let target = match &e.completion {
                Some(c) => {
                    let mut ids = tokenizer.encode(c)?;
                    ids.extend(eos);
                    Some(ids)
                }
                None => None,
            };
            Ok(Prompt {
                text: e.prompt.clone(),
                tokens: match templated {
                    true => tokenizer.encode(&text)?,
                    false => tokenizer.encode_prompt(&text)?,
                },
                answer: e.answer.clone(),
                target,
                target_trained: None,
                metadata: e.metadata.clone(),
                source: source_of(&e.metadata, &data.fields.source),
            })
        })
        .collect()
}

/// How metrics name a data source: rows without one are `unnamed`.
pub(crate) fn source_label(source: &str) -> &str {
    if source.is_empty() { "unnamed" } else { source }
}

/// The `column` of a row's metadata JSON as a source name (a number or other value as written;
/// empty when the row has no such column).
pub(crate) fn source_of(metadata: &str, column: &str) -> String {
    let Ok(serde_json::Value::Object(row)) = serde_json::from_str(metadata) else {
        return String::new();
    };
    match row.get(column) {
        None | Some(serde_json::Value::Null) => String::new(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// Where a run keeps the data it generated.
pub fn data_dir(run: Option<&Path>) -> Option<PathBuf> {
    run.map(|r| r.join("data"))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// A target written as a conversation becomes the transcript an episode would give: the
    /// assistant turns trained on (end-of-turn token included), the tool's answer and the
    /// template's text around it not.
    #[test]
    fn conversational_targets_train_on_the_assistant_turns_only() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes/assets/arithmetic-tokenizer");
        let tokenizer = LmTokenizer::load(&dir, &[]).unwrap();
        let data: DataSection = toml::from_str("").unwrap();
        let completion = serde_json::json!([
            {"role": "assistant", "content": "<tool_call>x</tool_call>"},
            {"role": "tool", "content": "408"},
            {"role": "assistant", "content": "<answer>408</answer>"},
        ]);
        let example = Example {
            prompt: "What is 12 * 34?".into(),
            answer: Some("408".into()),
            completion: Some(completion.to_string()),
            metadata: String::new(),
        };
        let prompt = prepare(&[example], &tokenizer, &data, &[]).unwrap().remove(0);
        let (target, trained) = (prompt.target.unwrap(), prompt.target_trained.unwrap());
        let text = |keep: bool| {
            let ids: Vec<u32> = (target.iter().zip(&trained))
                .filter(|(_, t)| **t == keep)
                .map(|(i, _)| *i)
                .collect();
            tokenizer.decode(&ids, false).unwrap()
        };
        assert_eq!(
            text(true),
            "<tool_call>x</tool_call><|im_end|><answer>408</answer><|im_end|>"
        );
        assert_eq!(
            text(false),
            "\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        );
    }
}
