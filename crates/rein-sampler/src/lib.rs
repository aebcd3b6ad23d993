//! rein's samplers: drawing actions from policy outputs (and, later, tokens from language
//! models), with the log-probabilities and entropies the losses need.
//!
//! Sampling happens on the host from plain `f32` rows with a seeded [`SeededRng`], so a run is
//! reproducible on any backend; log-probabilities and entropies used in losses are burn tensor
//! functions so gradients flow through them.
//!
//! Language-model generation ([`generate`]) drives a `rein_model::lm::CausalLm` with its KV
//! cache: batched prompts, temperature / top-k / top-p / min-p, `n` samples per prompt, stop
//! tokens and stop conditions, per-token log-probabilities (and the most likely alternatives,
//! when asked). [`prompt_logprobs`] scores a prompt's own tokens in one teacher-forced pass.
//! [`generate_with_images`] does the same for a vision-language model's decoder, its prompts'
//! image tokens reading the vision encoder's features ([`PromptImages`]) as they are prefilled.
//!
//! Trainers get completions through the [`Generator`] trait: [`NativeGenerator`] runs that
//! sampler in process, [`HttpGenerator`] asks inference servers (SGLang, vLLM, `rein serve`)
//! with token ids both ways and syncs the policy to them through files. A judge model answers
//! a reward plugin in process ([`NativeJudge`]) or on such a server through OpenAI's chat
//! completions ([`HttpJudge`]); a reward model scores completions as a reward in process or on a
//! server's classification API ([`ModelReward`], [`HttpClassifier`]), a process reward model
//! in process or on a server's pooling API ([`PrmReward`], [`HttpTokenClassifier`]).
//!
//! **Architecture invariant:** no knowledge of environments, plugins or training loops. The
//! one lateral edge: it drives `rein-model`'s language model (rein-model never imports it).

mod batch_decode;
mod categorical;
mod gaussian;
mod generator;
mod http;
mod http_classifier;
mod http_judge;
mod http_token_classifier;
mod model_reward;
mod native_judge;
mod prm_reward;
mod prompt_logprobs;
pub mod protocol;
mod session;
mod stop;
mod token_choice;

pub use batch_decode::{Decoding, Generation, generate, generate_seeded, generate_with_images};
pub use categorical::{categorical_entropy, categorical_log_prob, sample_categorical};
pub use gaussian::{gaussian_entropy, gaussian_log_prob, sample_gaussian};
pub use generator::{Generator, GeneratorError, NativeGenerator, PromptsWithImages, generate_prompts};
pub use http::{HttpGenerator, HttpSettings, ServerApi};
pub use http_classifier::HttpClassifier;
pub use http_judge::HttpJudge;
pub use http_token_classifier::HttpTokenClassifier;
pub use model_reward::{ModelReward, RewardModelError};
pub use native_judge::NativeJudge;
pub use prm_reward::{PrmError, PrmReward};
pub use prompt_logprobs::{ScoredToken, prompt_logprobs};
pub use rein_core::SeededRng;
pub use session::{AfterTurn, Prefill, PromptImages, PromptPositions, Session, Turn, TurnOutput, prompt_seed};
pub use stop::{completion_text, stop_check};
pub use token_choice::{
    FinishReason, GenerationConfig, TokenCertainty, allowed_tokens, choose, token_certainty, token_logprob,
    top_logprobs,
};
