//! How an algorithm lists the keys it reads: each algorithm's file names its sections with
//! [`Keys`], and `uses.rs` holds every recipe to those lists.

/// The keys of a section an algorithm reads.
#[derive(Clone, Copy)]
pub(crate) enum Keys {
    /// Every key of the section.
    All,
    /// Only these.
    Only(&'static [&'static str]),
}

/// The language-model keys of `[model]`.
pub(crate) const LM_MODEL: Keys = Keys::Only(&[
    "path",
    "architecture",
    "init_std",
    "tokenizer",
    "chat_template",
    "dtype",
    "vision",
    "train_vision_encoder",
]);
/// The keys of `[train]` a language-model run reads.
pub(crate) const LM_TRAIN: Keys = Keys::Only(&[
    "runs_dir",
    "checkpoint_every",
    "stall_timeout_s",
    "devices",
    "log",
    "precision",
]);
