//! Per-plugin sandbox limits: what `rein-plugin` enforces and recipes set (`[env.limits]`,
//! `[reward.limits]`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A limit with a value that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{key}` {reason}")]
pub struct InvalidLimit {
    /// The key, e.g. `memory_mib`.
    pub key: &'static str,
    /// What is wrong with its value.
    pub reason: String,
}

/// The limits one plugin runs under. Recipes set them per plugin (`[reward.limits]`,
/// `[env.limits]`); unset keys keep these defaults.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxLimits {
    /// Total linear memory one instance may use, in MiB (default 256).
    pub memory_mib: u64,
    /// Wall-clock deadline for one call, in milliseconds (default 2000).
    pub timeout_ms: u64,
    /// Fuel per call (≈ one unit per wasm instruction); `None` (default) disables fuel metering.
    pub fuel: Option<u64>,
    /// Maximum wasm stack, in KiB (default 512).
    pub stack_kib: u64,
    /// Largest `.wasm` file accepted, in MiB (default 64; Python and JS guests are 12–18 MiB).
    pub max_module_mib: u64,
    /// Largest result accepted from one call, in MiB (default 64).
    pub max_output_mib: u64,
    /// How much of stdout and of stderr is kept (the last bytes written), in KiB (default 64).
    pub stdio_kib: u64,
    /// Canonicalise NaN bit patterns after every float operation (default off).
    ///
    /// WebAssembly float arithmetic is already bit-for-bit deterministic except for the payload
    /// bits of NaNs, and the host rejects every NaN a plugin returns, so this only matters to a
    /// plugin that inspects NaN bits internally. It costs ~3× on float-heavy code (CartPole:
    /// 17.7M → 6.4M env-steps/s), hence opt-in.
    pub canonicalize_nans: bool,
    /// Let the plugin read the host's real clocks (default off: virtual clocks, see
    /// `rein_plugin::clocks`). Its results may then differ between runs of the same seed, and a
    /// run using it is marked not reproducible.
    pub real_clock: bool,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        Self {
            memory_mib: 256,
            timeout_ms: 2000,
            fuel: None,
            stack_kib: 512,
            max_module_mib: 64,
            max_output_mib: 64,
            stdio_kib: 64,
            canonicalize_nans: false,
            real_clock: false,
        }
    }
}

impl SandboxLimits {
    /// The memory limit in bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib << 20
    }

    /// The per-call deadline.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// The stack limit in bytes.
    pub fn stack_bytes(&self) -> u64 {
        self.stack_kib << 10
    }

    /// The largest accepted result, in bytes.
    pub fn max_output_bytes(&self) -> usize {
        (self.max_output_mib << 20) as usize
    }

    /// Checks the limits make sense, naming the offending key.
    pub fn validate(&self) -> Result<(), InvalidLimit> {
        let invalid = |key, reason: String| Err(InvalidLimit { key, reason });
        let positive = [
            ("memory_mib", self.memory_mib),
            ("timeout_ms", self.timeout_ms),
            ("stack_kib", self.stack_kib),
            ("max_module_mib", self.max_module_mib),
            ("max_output_mib", self.max_output_mib),
        ];
        if let Some((key, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return invalid(key, "must be greater than 0".into());
        }
        if self.memory_mib > 4096 {
            return invalid(
                "memory_mib",
                format!(
                    "is {}, above the 4096 MiB a 32-bit wasm memory can address",
                    self.memory_mib
                ),
            );
        }
        if self.stack_kib > 64 << 10 {
            return invalid(
                "stack_kib",
                format!("is {}, above the 65536 KiB maximum", self.stack_kib),
            );
        }
        if self.fuel == Some(0) {
            return invalid("fuel", "must be greater than 0 (omit it to disable fuel)".into());
        }
        Ok(())
    }
}
