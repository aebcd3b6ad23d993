//! Where completions come from: the [`source`] that makes them (in process, on inference
//! servers, or a producer thread a bounded number of policy versions ahead of training), and
//! multi-turn [`episodes`] — the model's turns, Hermes [`tool_calls`] answered by tool plugins
//! or a text environment's replies, kept as one token [`transcript`] — and groups grown as a
//! [`tree`] of completions branching from each other, or an [`episode_tree`] of episodes
//! branching after tool calls.

pub mod episode_tree;
pub mod episodes;
pub mod source;
pub mod tool_calls;
pub mod transcript;
pub mod tree;
