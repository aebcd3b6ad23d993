//! Which instruction set the kernels run on: the widest the CPU has, or a narrower one forced
//! with the `REIN_CPU` environment variable.
//!
//! The choice changes speed only. Every kernel computes each output with the same operations in
//! the same order whatever the vector width, so results are bit-identical on every level (see the
//! crate docs); `REIN_CPU=avx2` on an AVX-512 machine runs the AVX2 code, which CI uses to test
//! both paths on one machine.

use std::sync::atomic::{AtomicU8, Ordering};

/// The environment variable that caps the instruction set.
pub const ENV_VAR: &str = "REIN_CPU";

/// An instruction-set level, from the narrowest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Plain scalar code that runs on any CPU (fused multiply-adds in software where the CPU
    /// has none).
    Scalar,
    /// AVX2 with FMA (x86-64-v3): 8 floats per vector.
    Avx2,
    /// AVX-512F with FMA: 16 floats per vector.
    Avx512,
}

/// A `REIN_CPU` value that cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IsaError {
    /// Not one of the known names.
    #[error("{ENV_VAR}={value:?} is not an instruction set: expected one of native, avx512, avx2, scalar")]
    Unknown {
        /// The value given.
        value: String,
    },
    /// A level this CPU lacks.
    #[error("{ENV_VAR}={value} asks for {isa}, which this CPU does not have (it has {detected})")]
    Unavailable {
        /// The value given.
        value: String,
        /// What it asks for.
        isa: Isa,
        /// The widest level this CPU has.
        detected: Isa,
    },
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Isa {
    /// Every level, narrowest first.
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512];

    /// Its `REIN_CPU` name.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run it.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("fma"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The widest level this CPU has.
    pub fn detected() -> Isa {
        Isa::ALL
            .into_iter()
            .rev()
            .find(|isa| isa.is_available())
            .unwrap_or(Isa::Scalar)
    }

    /// The levels this CPU can run, narrowest first.
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|isa| isa.is_available()).collect()
    }

    /// The level the kernels use: `REIN_CPU`'s, or the widest the CPU has. Read once per process;
    /// a value that cannot be honoured is ignored here (front ends report it with [`from_env`]
    /// before any kernel runs).
    pub fn active() -> Isa {
        static ACTIVE: AtomicU8 = AtomicU8::new(u8::MAX);
        match ACTIVE.load(Ordering::Relaxed) {
            u8::MAX => {
                let isa = from_env().ok().flatten().unwrap_or_else(Isa::detected);
                ACTIVE.store(isa as u8, Ordering::Relaxed);
                isa
            }
            level => Isa::ALL[level as usize],
        }
    }
}

/// The level `REIN_CPU` asks for: `None` when unset or `native`; an error naming the variable
/// for an unknown name or a level this CPU lacks.
pub fn from_env() -> Result<Option<Isa>, IsaError> {
    match std::env::var(ENV_VAR) {
        Ok(value) => parse(&value),
        Err(_) => Ok(None),
    }
}

fn parse(value: &str) -> Result<Option<Isa>, IsaError> {
    let isa = match value.trim().to_ascii_lowercase().as_str() {
        "" | "native" => return Ok(None),
        "scalar" | "portable" => Isa::Scalar,
        "avx2" => Isa::Avx2,
        "avx512" => Isa::Avx512,
        _ => return Err(IsaError::Unknown { value: value.into() }),
    };
    if !isa.is_available() {
        return Err(IsaError::Unavailable {
            value: value.into(),
            isa,
            detected: Isa::detected(),
        });
    }
    Ok(Some(isa))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_bad_ones_are_named_in_the_error() {
        assert_eq!(parse("native"), Ok(None));
        assert_eq!(parse(""), Ok(None));
        assert_eq!(parse("scalar"), Ok(Some(Isa::Scalar)));
        assert_eq!(parse("Portable"), Ok(Some(Isa::Scalar)));
        let err = parse("avx9").unwrap_err();
        assert!(err.to_string().starts_with("REIN_CPU=\"avx9\" is not"), "{err}");
        for isa in Isa::ALL {
            match parse(isa.name()) {
                Ok(found) => assert_eq!(found, Some(isa)),
                Err(err) => {
                    assert!(!isa.is_available());
                    assert!(err.to_string().contains("which this CPU does not have"), "{err}");
                }
            }
        }
    }

    #[test]
    fn the_detected_level_is_available_and_the_widest() {
        let detected = Isa::detected();
        assert!(detected.is_available());
        assert_eq!(Isa::available().last(), Some(&detected));
        assert!(Isa::active() <= detected);
    }
}
