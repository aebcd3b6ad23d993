//! rein's domain types and the traits everything composes through.
//!
//! **Architecture invariant:** `rein-core` knows nothing about burn or wasmtime. It holds plain
//! data (groups of completions, scores, observations, actions, spaces, messages, images) and the small
//! traits other crates implement ([`RewardFn`], [`Environment`], [`VecEnv`], [`Tool`],
//! [`TextEnv`], [`Judge`]), so that a training loop can be written against these traits without seeing
//! how a reward, an environment or a tool runs.
//! Errors are typed ([`PluginError`], [`OutputError`]) and name what failed.

pub mod choices;
mod env;
mod error;
mod image;
mod judge;
mod limits;
mod reward;
mod rng;
mod text_env;
mod tool;

pub use choices::{
    Activation, AdaptiveEntropy, AdvantageKind, Aggregation, DifficultyWeight, DpoLossKind, KlEstimator, KtoLossKind,
    LagCorrection, ModelDtype, MultiObjectiveAggregation, ObjectiveKind, OnError, PolicySync, PrmAggregate,
    PrmSettings, RatioLevel, SamplerBackend, SamplerPrecision, SamplerSignal, ServerApi, StdScaling, TrainPrecision,
    ValueModel,
};
pub use env::{
    Action, BatchActions, BoxSpace, EnvSpec, Environment, Observation, Space, Step, VecEnv, VecStep, validate_action,
    validate_batch_actions, validate_observation,
};
pub use error::{FailureCounts, OutputError, PluginError, PluginErrorKind};
pub use image::{IMAGE_MARKER, Image, count_markers};
pub use judge::{
    Judge, JudgeError, JudgeLimits, JudgeRequest, JudgeUsage, JudgedToken, Judgement, ScriptedJudge, request_seed,
};
pub use limits::{InvalidLimit, SandboxLimits};
pub use reward::{CompletionScore, Group, GroupScores, RewardFn, StepScore, Token, validate_group_scores};
pub use rng::SeededRng;
pub use text_env::{
    ENV_ROLES, EpisodeStart, Message, Opening, Reply, TextEnv, Turn, validate_openings, validate_replies,
};
pub use tool::{Tool, ToolError, ToolErrorKind, ToolOutput, ToolSpec};
