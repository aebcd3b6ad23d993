//! Recipe errors: each names the file, the key path and, where it helps, what to write instead.

use std::path::PathBuf;

/// Why a recipe cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RecipeError {
    /// A recipe or fragment file cannot be read.
    #[error("{}: cannot read recipe{}: {reason}", file.display(), from.as_ref().map(|f| format!(" (extended from {})", f.display())).unwrap_or_default())]
    Missing {
        /// The file.
        file: PathBuf,
        /// The recipe whose `extends` named it.
        from: Option<PathBuf>,
        /// The operating system's reason.
        reason: String,
    },
    /// TOML syntax error.
    #[error("{}:{line}:{column}: TOML syntax error: {message}", file.display())]
    Syntax {
        /// The file.
        file: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// `extends` leads back to a file already being loaded.
    #[error("{}: `extends` cycle: {}", chain[0].display(), chain.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" → "))]
    Cycle {
        /// The files in the cycle, first repeated at the end.
        chain: Vec<PathBuf>,
    },
    /// A key the schema does not have.
    #[error("{}: unknown key `{path}`{}", file.display(), suggestion.as_ref().map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default())]
    UnknownKey {
        /// The file that set it (or `--set`).
        file: PathBuf,
        /// Dotted key path.
        path: String,
        /// The nearest valid key.
        suggestion: Option<String>,
    },
    /// A value of the wrong type, or an invalid value.
    #[error("{}: key `{path}`: {message}", file.display())]
    Invalid {
        /// The file that set it (or `--set`).
        file: PathBuf,
        /// Dotted key path.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A plugin name that is not built.
    #[error("{}: key `{path}`: unknown plugin `{name}` (available in {}: {})", file.display(), dir.display(), if available.is_empty() { "none; run `cargo xtask build-plugins`".to_string() } else { available.join(", ") })]
    UnknownPlugin {
        /// The file that named it.
        file: PathBuf,
        /// Dotted key path.
        path: String,
        /// The plugin name.
        name: String,
        /// Where plugins were looked for.
        dir: PathBuf,
        /// The plugins that exist there.
        available: Vec<String>,
    },
    /// A malformed `--set key=value`.
    #[error("--set {arg}: {message}")]
    Override {
        /// The argument.
        arg: String,
        /// What is wrong.
        message: String,
    },
}

/// A rule a recipe breaks: the dotted key and why.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Broken {
    pub key: String,
    pub message: String,
}

pub(crate) fn broken(key: &str, message: impl Into<String>) -> Broken {
    Broken {
        key: key.into(),
        message: message.into(),
    }
}
