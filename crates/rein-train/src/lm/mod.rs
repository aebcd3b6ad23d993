//! Language-model training: supervised fine-tuning and the GRPO family, with prompts from files
//! or a generated task, rewards from sandboxed plugins, and held-out evaluation.

mod batch;
mod data;
mod eval;
mod grpo;
mod rewards;
mod sft;
mod task;
pub mod tool_calls;
pub mod transcript;

use std::path::{Path, PathBuf};

pub use batch::{TokenBatch, completion_log_probs};
pub use data::{DataError, Example, Fields, read, write_jsonl};
pub use eval::{EvalExample, EvalReport, EvalSettings, SHOWN_EXAMPLES, evaluate, is_correct};
pub use grpo::{Grpo, GrpoContext, GrpoOutcome};
pub use rewards::{GroupReward, OnError, RewardFailure, WeightedReward, score_groups};
pub use sft::Sft;
pub use task::{ArithmeticTask, generate_task};

use rein_model::lm::{ChatMessage, LmTokenizer};

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
    /// Metadata JSON.
    pub metadata: String,
}

/// Tokenizes examples: chat template (when the data asks and the tokenizer has one), target
/// completions followed by the end-of-sequence token.
pub fn prepare(
    examples: &[Example],
    tokenizer: &LmTokenizer,
    data: &DataSection,
) -> Result<Vec<Prompt>, rein_model::lm::LoadError> {
    let eos = tokenizer.eos_ids().first().copied();
    examples
        .iter()
        .map(|e| {
            let text = if data.chat_template && tokenizer.has_chat_template() {
                let mut messages = Vec::new();
                if let Some(system) = &data.system_prompt {
                    messages.push(ChatMessage {
                        role: "system".into(),
                        content: system.clone(),
                    });
                }
                messages.push(ChatMessage {
                    role: "user".into(),
                    content: e.prompt.clone(),
                });
                tokenizer
                    .apply_chat_template(&messages, true)?
                    .unwrap_or_else(|| e.prompt.clone())
            } else {
                e.prompt.clone()
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
                tokens: tokenizer.encode(&text)?,
                answer: e.answer.clone(),
                target,
                metadata: e.metadata.clone(),
            })
        })
        .collect()
}

/// A stop check for [`rein_sampler::generate`]: true once the decoded completion contains
/// one of `stops`.
pub fn stop_check<'a>(tokenizer: &'a LmTokenizer, stops: &'a [String]) -> impl FnMut(usize, &[u32]) -> bool + 'a {
    move |_, tokens| {
        !stops.is_empty()
            && tokenizer
                .decode(tokens, false)
                .is_ok_and(|t| stops.iter().any(|s| t.contains(s.as_str())))
    }
}

/// The completion's text without special tokens, cut at the first stop string.
pub fn completion_text(tokenizer: &LmTokenizer, tokens: &[u32], stops: &[String]) -> String {
    let mut text = tokenizer.decode(tokens, true).unwrap_or_default();
    if let Some(at) = stops.iter().filter_map(|s| text.find(s.as_str())).min() {
        text.truncate(at);
    }
    text
}

/// Where a run keeps the data it generated.
pub fn data_dir(run: Option<&Path>) -> Option<PathBuf> {
    run.map(|r| r.join("data"))
}
