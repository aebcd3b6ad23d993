//! Typed failures of plugins and of the values they return.

use std::time::Duration;

/// A failure of a sandboxed plugin, naming the plugin, the call and what went wrong.
///
/// Traps (`Timeout`, `OutOfFuel`, `MemoryLimit`, `StackOverflow`, `Trap`) poison the plugin's
/// instance; the host discards it and the next call starts from a fresh instance. A
/// [`PluginErrorKind::Guest`] error is the plugin's own `plugin-error` result: the instance
/// stays usable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("plugin `{plugin}`{}: {kind}", call.map(|c| format!(" ({c})")).unwrap_or_default())]
pub struct PluginError {
    /// The plugin's name (from its metadata, or its file name before that is known).
    pub plugin: String,
    /// The exported function being called, if the failure happened inside a call.
    pub call: Option<&'static str>,
    /// What went wrong.
    pub kind: PluginErrorKind,
}

impl PluginError {
    /// A failure of `plugin` during `call`.
    pub fn new(plugin: impl Into<String>, call: Option<&'static str>, kind: PluginErrorKind) -> Self {
        Self {
            plugin: plugin.into(),
            call,
            kind,
        }
    }

    /// Whether this failure destroyed the plugin's instance (a trap or exhausted limit), as
    /// opposed to an error the plugin returned or a problem found on the host side.
    pub fn is_trap(&self) -> bool {
        matches!(
            self.kind,
            PluginErrorKind::Timeout { .. }
                | PluginErrorKind::OutOfFuel { .. }
                | PluginErrorKind::MemoryLimit { .. }
                | PluginErrorKind::StackOverflow { .. }
                | PluginErrorKind::Trap { .. }
        )
    }
}

/// How many of a plugin's calls failed, by kind, since it was opened: what training logs as
/// `plugins/<name>/timeouts`, `…/traps` and `…/errors`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailureCounts {
    /// Calls stopped at their deadline ([`PluginErrorKind::Timeout`]).
    pub timeouts: u64,
    /// Other traps: fuel, memory, stack, a panic or other abort.
    pub traps: u64,
    /// Everything else: the plugin's own errors, invalid results, host-side failures.
    pub errors: u64,
}

impl FailureCounts {
    /// Counts one failure.
    pub fn record(&mut self, error: &PluginError) {
        match error.kind {
            PluginErrorKind::Timeout { .. } => self.timeouts += 1,
            _ if error.is_trap() => self.traps += 1,
            _ => self.errors += 1,
        }
    }

    /// Counts `result`'s failure, if it is one, and passes it on.
    pub fn count<T>(&mut self, result: Result<T, PluginError>) -> Result<T, PluginError> {
        if let Err(error) = &result {
            self.record(error);
        }
        result
    }

    /// The sum of two counts.
    pub fn plus(self, other: FailureCounts) -> FailureCounts {
        FailureCounts {
            timeouts: self.timeouts + other.timeouts,
            traps: self.traps + other.traps,
            errors: self.errors + other.errors,
        }
    }
}

/// The kinds of [`PluginError`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PluginErrorKind {
    /// The file could not be read.
    #[error("cannot read {path}: {reason}")]
    Io {
        /// The file.
        path: String,
        /// The operating system's reason.
        reason: String,
    },
    /// The `.wasm` file is larger than the configured cap.
    #[error("module is {size} bytes, over the limit of {limit} bytes (`max_module_bytes`)")]
    ModuleTooLarge {
        /// Size of the file in bytes.
        size: u64,
        /// The cap in bytes.
        limit: u64,
    },
    /// The bytes are not a valid WebAssembly component.
    #[error("not a valid WebAssembly component: {reason}")]
    InvalidComponent {
        /// The compiler's reason.
        reason: String,
    },
    /// The component exports neither the reward nor the environment interface of this version.
    #[error(
        "exports no rein plugin interface of version {expected} (found: {found}); rebuild it against rein-pdk {expected}"
    )]
    InterfaceVersion {
        /// The interface version the host speaks.
        expected: String,
        /// The rein interfaces the component exports, or `none`.
        found: String,
    },
    /// The component imports something the host does not provide.
    #[error("imports `{import}`, which the rein sandbox does not provide")]
    MissingImport {
        /// The import's name.
        import: String,
    },
    /// The component imports a capability the run does not grant it.
    #[error("imports `{import}`, which this run does not grant it: {how}")]
    NotGranted {
        /// The import's name.
        import: String,
        /// How a recipe grants it.
        how: &'static str,
    },
    /// The run grants a capability the component does not import.
    #[error("is granted `{import}` but does not import it: {how}")]
    UnusedGrant {
        /// The capability's interface.
        import: String,
        /// How to build a plugin that uses it.
        how: &'static str,
    },
    /// The plugin is of the other kind (an environment loaded as a reward, or vice versa).
    #[error("is a {found} plugin, not a {expected} plugin")]
    WrongKind {
        /// The kind the caller asked for.
        expected: &'static str,
        /// The kind the component is.
        found: &'static str,
    },
    /// A call ran past its wall-clock deadline (epoch interruption).
    #[error("exceeded its time limit of {} ms per call (`timeout_ms`)", limit.as_millis())]
    Timeout {
        /// The deadline.
        limit: Duration,
    },
    /// A call consumed all of its fuel.
    #[error("ran out of fuel: {limit} units per call (`fuel`)")]
    OutOfFuel {
        /// The fuel given to each call.
        limit: u64,
    },
    /// The plugin tried to grow its memory past the limit.
    #[error("exceeded its memory limit of {} MiB (`memory_mib`)", limit_bytes >> 20)]
    MemoryLimit {
        /// The limit in bytes.
        limit_bytes: u64,
    },
    /// The plugin's call stack overflowed.
    #[error("overflowed its stack of {} KiB (`stack_kib`)", limit_bytes >> 10)]
    StackOverflow {
        /// The stack limit in bytes.
        limit_bytes: u64,
    },
    /// Any other trap: a panic, `unreachable`, an out-of-bounds access.
    #[error("trapped: {message}{}", if stderr.is_empty() { String::new() } else { format!("\n  plugin stderr: {stderr}") })]
    Trap {
        /// The trap's description.
        message: String,
        /// The tail of what the plugin wrote to stderr (a Rust panic message lands here).
        stderr: String,
    },
    /// The plugin returned its own error (`result::err`); the instance remains usable.
    #[error("returned an error: {message}")]
    Guest {
        /// The plugin's message.
        message: String,
    },
    /// The plugin returned a value the host rejects.
    #[error(transparent)]
    InvalidOutput(#[from] OutputError),
    /// A host-side failure around the plugin (linking, instantiation, cache).
    #[error("{reason}")]
    Host {
        /// What failed.
        reason: String,
    },
}

/// A plugin's (or any reward's or environment's) result that breaks the contract.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    /// A list has the wrong number of entries.
    #[error("returned {got} {what}, expected {expected}")]
    WrongLength {
        /// What the list holds (e.g. `groups`, `scores in group 3`).
        what: String,
        /// Entries expected.
        expected: usize,
        /// Entries returned.
        got: usize,
    },
    /// A score, reward or observation is NaN or infinite.
    #[error("returned a non-finite {what}: {value}")]
    NonFinite {
        /// Which value (e.g. `score of group 0, completion 2`).
        what: String,
        /// The value.
        value: f64,
    },
    /// A result is larger than the host accepts.
    #[error("returned {bytes} bytes of {what}, over the limit of {limit} bytes (`max_output_mib`)")]
    TooLarge {
        /// What was too large.
        what: String,
        /// Its size.
        bytes: usize,
        /// The cap.
        limit: usize,
    },
    /// A step score that is not finite, not a span of its completion, or overlaps another.
    #[error("returned a bad {what}: {reason}")]
    BadStep {
        /// Which step (e.g. `step 2 of group 0, completion 3`).
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An image that is not of a media type rein carries, or not of the one it claims.
    #[error("returned a bad image ({what}): {reason}")]
    BadImage {
        /// Which image (e.g. `image 0 of the output`).
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An observation or action does not fit its space.
    #[error("{what} does not match the space {space}: {reason}")]
    SpaceMismatch {
        /// What was checked (e.g. `observation of env 3`).
        what: String,
        /// The space, displayed.
        space: String,
        /// Why it does not fit.
        reason: String,
    },
}
