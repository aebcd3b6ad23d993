//! `length-penalty`: DAPO's soft overlong punishment (Yu et al. 2025, eq. 13).
//!
//! ```text
//!              ⎧ 0                              |y| ≤ L_max − L_cache
//! R_length(y) = ⎨ ((L_max − L_cache) − |y|) / L_cache    L_max − L_cache < |y| ≤ L_max
//!              ⎩ −1                             L_max < |y|
//! ```
//!
//! `|y|` is measured in `unit`: `chars` (default), `bytes`, `words`, or `tokens` — the last
//! read from the group metadata's `completion_tokens` list, which rein's GRPO trainer fills in.

use rein_pdk::{Config, ConfigKey, Group, Metadata, Reward, Score};

/// How a completion's length is counted.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Unit {
    Chars,
    Bytes,
    Words,
    Tokens,
}

/// The reward.
pub struct LengthPenalty {
    max_length: f64,
    cache_length: f64,
    unit: Unit,
}

impl LengthPenalty {
    /// The penalty for a completion of `length` units.
    pub fn penalty(&self, length: f64) -> f64 {
        let soft_start = self.max_length - self.cache_length;
        if length <= soft_start {
            0.0
        } else if length <= self.max_length {
            (soft_start - length) / self.cache_length
        } else {
            -1.0
        }
    }

    fn lengths(&self, group: &Group) -> Result<Vec<f64>, String> {
        let count = |c: &String| match self.unit {
            Unit::Chars => c.chars().count() as f64,
            Unit::Bytes => c.len() as f64,
            Unit::Words => c.split_whitespace().count() as f64,
            Unit::Tokens => 0.0,
        };
        if self.unit != Unit::Tokens {
            return Ok(group.completions.iter().map(count).collect());
        }
        let metadata = group.metadata_json()?;
        let tokens = metadata
            .get("completion_tokens")
            .and_then(|v| v.as_array())
            .ok_or("unit `tokens` needs a `completion_tokens` list in the group metadata")?;
        if tokens.len() != group.completions.len() {
            return Err(format!(
                "`completion_tokens` has {} entries for {} completions",
                tokens.len(),
                group.completions.len()
            ));
        }
        tokens
            .iter()
            .map(|t| {
                t.as_f64()
                    .ok_or_else(|| format!("`completion_tokens` entry {t} is not a number"))
            })
            .collect()
    }
}

impl Reward for LengthPenalty {
    const METADATA: Metadata = Metadata::new(
        "length-penalty",
        "DAPO soft overlong punishment: 0 up to max_length - cache_length, then linearly down to -1 at max_length",
    )
    .config(&[
        ConfigKey::new("max_length", "L_max: lengths above it get -1"),
        ConfigKey::new("cache_length", "L_cache: the width of the linear ramp before L_max"),
        ConfigKey::new("unit", "how length is counted: chars, bytes, words or tokens").default("\"chars\""),
    ]);

    fn new(config: &Config) -> Result<Self, String> {
        let max_length = config.required_f64("max_length")?;
        let cache_length = config.required_f64("cache_length")?;
        if cache_length <= 0.0 || cache_length > max_length {
            return Err(format!(
                "config keys need 0 < cache_length ≤ max_length, got {cache_length} and {max_length}"
            ));
        }
        let unit = match config.str_or("unit", "chars")? {
            "chars" => Unit::Chars,
            "bytes" => Unit::Bytes,
            "words" => Unit::Words,
            "tokens" => Unit::Tokens,
            other => {
                return Err(format!(
                    "config key `unit` must be chars, bytes, words or tokens, got `{other}`"
                ));
            }
        };
        Ok(Self {
            max_length,
            cache_length,
            unit,
        })
    }

    fn score(&mut self, group: &Group) -> Result<Vec<Score>, String> {
        Ok(self
            .lengths(group)?
            .into_iter()
            .map(|len| Score::new(self.penalty(len)).with("length", len))
            .collect())
    }
}

rein_pdk::export_reward!(LengthPenalty);

#[cfg(test)]
mod tests {
    use super::*;

    fn reward(config: &str) -> LengthPenalty {
        LengthPenalty::new(&Config::parse(config, &LengthPenalty::METADATA).unwrap()).unwrap()
    }

    #[test]
    fn follows_the_dapo_ramp() {
        let r = reward(r#"{"max_length": 20, "cache_length": 4}"#);
        assert_eq!(r.penalty(10.0), 0.0);
        assert_eq!(r.penalty(16.0), 0.0);
        assert_eq!(r.penalty(18.0), -0.5);
        assert_eq!(r.penalty(20.0), -1.0);
        assert_eq!(r.penalty(21.0), -1.0);
    }

    #[test]
    fn token_lengths_come_from_metadata() {
        let mut r = reward(r#"{"max_length": 20, "cache_length": 4, "unit": "tokens"}"#);
        let group = Group {
            completions: vec!["a".into(), "b".into()],
            metadata: r#"{"completion_tokens": [3, 19]}"#.into(),
            ..Group::default()
        };
        let scores: Vec<_> = r.score(&group).unwrap().into_iter().map(|s| s.value).collect();
        assert_eq!(scores, vec![Some(0.0), Some(-0.75)]);
        let missing = Group {
            completions: vec!["a".into()],
            ..Group::default()
        };
        assert!(r.score(&missing).is_err());
    }

    #[test]
    fn missing_or_inconsistent_lengths_are_rejected() {
        for config in [
            "{}",
            r#"{"max_length": 4, "cache_length": 8}"#,
            r#"{"max_length": 8, "cache_length": 2, "unit": "lines"}"#,
        ] {
            let parsed = Config::parse(config, &LengthPenalty::METADATA).unwrap();
            assert!(LengthPenalty::new(&parsed).is_err(), "{config}");
        }
    }
}
