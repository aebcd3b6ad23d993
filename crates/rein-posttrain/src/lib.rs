//! Language-model post-training: supervised fine-tuning, the GRPO family, PPO with a critic,
//! the DPO family and reward models, with prompts or preference pairs from files or a generated
//! task, rewards from sandboxed plugins, and held-out evaluation. [`run_lm`] runs a recipe's
//! stages; each algorithm is a `rein_run::driver::Trainer` the run's machinery drives.
//!
//! - [`data`]: datasets, prompts, preference pairs, the generated arithmetic task;
//! - [`rewards`]: reward plugins and models combined into one score per completion;
//! - [`rollout`]: where completions come from (in process, servers, a producer thread ahead of
//!   training), multi-turn episodes with tool calls and text environments;
//! - [`offline`]: learners on fixed data (SFT, DPO, reward-model training);
//! - `preference_batch`: a batch of preference pairs through the model and DPO's loss on it,
//!   shared by offline and online DPO;
//! - [`online`]: the online stage (the GRPO family, PPO with a critic, online DPO) with its
//!   curriculum;
//! - `run`: a recipe's stages from model to report, and their set-up.
//!
//! **Architecture invariant:** this crate trains language models only; environments and
//! classic control are `rein-control`'s, the driver, checkpoints and metrics `rein-run`'s.

mod batch;
pub mod data;
pub mod data_parallel;
mod error;
mod eval;
pub mod offline;
pub mod online;
mod packed_rows;
mod preference_batch;
pub mod rewards;
pub mod rollout;
mod run;
mod seeds;
mod token_batch;
mod token_trie;

pub use batch::{CompletionLogits, CompletionOutputs, completion_log_probs, completion_logits, completion_outputs};
pub use data::images::{ImageSource, row_images};
pub use data::labelled::{LabelledCompletion, LabelledExample, prepare_labelled, read_labelled, unpair};
pub use data::preferences::{
    PreferenceExample, PreferencePair, Skipped, pairs_from_examples, prepare_preferences, read_preferences,
    report_skipped,
};
pub use data::prompt_images::{
    PromptImageFiles, PromptImageReader, PromptPixels, chat_message, message_parts, with_markers,
};
pub use data::prompts::{Prompt, data_dir, opening_messages, prepare};
pub(crate) use data::prompts::{source_label, source_of};
pub use data::shapes::generate_shapes_task;
pub use data::stepwise::{
    StepLabelled, StepTokenizing, StepTokens, StepwiseExample, prepare_stepwise, read_stepwise, stepwise_from_examples,
    tokenize_steps,
};
pub use data::task::{ArithmeticTask, generate_task, slipped_solution};
pub use data::{DataError, Example, Fields, read, write_jsonl};
pub use error::LmError;
pub use eval::{
    EpisodeSummary, EvalExample, EvalReport, EvalSettings, SHOWN_EXAMPLES, counts_as_correct, evaluate, is_correct,
};
pub use offline::dpo::Dpo;
pub use offline::kto::{Kto, kto_batch_loss, labelled_batch, mismatched_batch, reference_point};
pub use offline::process_reward_model::{PrmTraining, step_accuracy, step_logits};
pub use offline::reward_model::{BradleyTerry, PairScores, pair_scores, pairwise_accuracy};
pub use offline::sft::Sft;
pub use online::critic::Critic;
pub use online::{ImplicitPrm, OnlineContext, OnlineOutcome, OnlineTrainer, PpoCritic, Update};
pub use preference_batch::{PairLogProbs, dpo_batch_loss, pair_batch, reference_log_probs};
pub use rein_sampler::{completion_text, stop_check};
pub use rewards::signal::{SignalReward, signal_score};
pub use rewards::{
    GroupReward, OnError, Renamed, RewardFailure, ThinkingStripped, WeightedReward, score_groups, without_thinking,
};
pub use run::setup::evaluate_recipe;
pub use run::{DpoOutcome, KtoOutcome, LmOutcome, ProcessRewardModelOutcome, RewardModelOutcome, run_lm};
pub use token_batch::TokenBatch;
