//! A plugin's config: the recipe's table for it, as JSON, checked against its declared keys.

use serde_json::{Map, Value};

use crate::metadata::Metadata;

/// The config a plugin receives once, at construction.
///
/// Keys not declared in [`Metadata::config`] are rejected when the config is parsed, so a typo
/// in a recipe is an error, not a silently ignored setting. Getters return `Err` with a message
/// naming the key when the value has the wrong type.
#[derive(Debug, Clone, Default)]
pub struct Config {
    values: Map<String, Value>,
}

impl Config {
    /// Parses `text` (a JSON object; empty means `{}`) and checks its keys against `metadata`.
    pub fn parse(text: &str, metadata: &Metadata) -> Result<Self, String> {
        let values = if text.trim().is_empty() {
            Map::new()
        } else {
            match serde_json::from_str::<Value>(text) {
                Ok(Value::Object(map)) => map,
                Ok(other) => return Err(format!("config must be a JSON object, got {other}")),
                Err(e) => return Err(format!("config is not valid JSON: {e}")),
            }
        };
        for key in values.keys() {
            if !metadata.config.iter().any(|k| k.name == key) {
                let accepted: Vec<_> = metadata.config.iter().map(|k| k.name).collect();
                let accepted = if accepted.is_empty() {
                    "none".to_string()
                } else {
                    accepted.join(", ")
                };
                return Err(format!(
                    "unknown config key `{key}` for plugin `{}` (accepted: {accepted})",
                    metadata.name
                ));
            }
        }
        Ok(Self { values })
    }

    /// The raw value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.values.get(key)
    }

    /// A string value, or `default` when unset.
    pub fn str_or<'a>(&'a self, key: &str, default: &'a str) -> Result<&'a str, String> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::String(s)) => Ok(s),
            Some(other) => Err(wrong_type(key, "a string", other)),
        }
    }

    /// A number, or `default` when unset.
    pub fn f64_or(&self, key: &str, default: f64) -> Result<f64, String> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Number(n)) => n
                .as_f64()
                .ok_or_else(|| wrong_type(key, "a number", &Value::Number(n.clone()))),
            Some(other) => Err(wrong_type(key, "a number", other)),
        }
    }

    /// A number that must be set.
    pub fn required_f64(&self, key: &str) -> Result<f64, String> {
        match self.get(key) {
            None => Err(format!("config key `{key}` is required")),
            Some(_) => self.f64_or(key, 0.0),
        }
    }

    /// A non-negative integer, or `default` when unset.
    pub fn u64_or(&self, key: &str, default: u64) -> Result<u64, String> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64().unwrap_or_default()),
            Some(other) => Err(wrong_type(key, "a non-negative integer", other)),
        }
    }

    /// A boolean, or `default` when unset.
    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool, String> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(wrong_type(key, "true or false", other)),
        }
    }

    /// A list of strings, or `default` when unset.
    pub fn strings_or(&self, key: &str, default: &[&str]) -> Result<Vec<String>, String> {
        match self.get(key) {
            None => Ok(default.iter().map(|s| s.to_string()).collect()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(String::from)
                        .ok_or_else(|| wrong_type(key, "a list of strings", v))
                })
                .collect(),
            Some(other) => Err(wrong_type(key, "a list of strings", other)),
        }
    }

    /// A list of numbers, or `None` when unset.
    pub fn numbers(&self, key: &str) -> Result<Option<Vec<f64>>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_f64().ok_or_else(|| wrong_type(key, "a list of numbers", v)))
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(other) => Err(wrong_type(key, "a list of numbers", other)),
        }
    }
}

fn wrong_type(key: &str, expected: &str, got: &Value) -> String {
    format!("config key `{key}` must be {expected}, got {got}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::ConfigKey;

    const META: Metadata = Metadata::new("demo", "a demo").config(&[
        ConfigKey::new("extract", "how to find the answer").default("\"auto\""),
        ConfigKey::new("tolerance", "relative tolerance"),
        ConfigKey::new("strict", "no text outside tags"),
    ]);

    #[test]
    fn declared_keys_are_read_with_their_types() {
        let config = Config::parse(r#"{"extract": "boxed", "tolerance": 0.5, "strict": true}"#, &META).unwrap();
        assert_eq!(config.str_or("extract", "auto"), Ok("boxed"));
        assert_eq!(config.f64_or("tolerance", 0.0), Ok(0.5));
        assert_eq!(config.bool_or("strict", false), Ok(true));
        let empty = Config::parse("", &META).unwrap();
        assert_eq!(empty.str_or("extract", "auto"), Ok("auto"));
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_named() {
        let err = Config::parse(r#"{"extrct": "boxed"}"#, &META).unwrap_err();
        assert_eq!(
            err,
            "unknown config key `extrct` for plugin `demo` (accepted: extract, tolerance, strict)"
        );
        let config = Config::parse(r#"{"tolerance": "big"}"#, &META).unwrap();
        assert_eq!(
            config.f64_or("tolerance", 0.0).unwrap_err(),
            "config key `tolerance` must be a number, got \"big\""
        );
        assert!(Config::parse("[1]", &META).unwrap_err().contains("JSON object"));
        assert!(Config::parse("{", &META).unwrap_err().contains("not valid JSON"));
    }
}
