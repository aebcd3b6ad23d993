//! What a plugin says about itself.

use crate::__private::reward::rein::plugin::types as wit;

/// A config key the plugin accepts (declared in [`Metadata::config`]; the PDK rejects others).
#[derive(Debug, Clone, Copy)]
pub struct ConfigKey {
    /// The key.
    pub name: &'static str,
    /// What it does and which values it takes.
    pub description: &'static str,
    /// The default, written as JSON (e.g. `"\"auto\""`, `"0.5"`), if any.
    pub default: Option<&'static str>,
}

impl ConfigKey {
    /// A key without a default.
    pub const fn new(name: &'static str, description: &'static str) -> Self {
        Self {
            name,
            description,
            default: None,
        }
    }

    /// The same key with a default (JSON text).
    pub const fn default(self, json: &'static str) -> Self {
        Self {
            default: Some(json),
            ..self
        }
    }
}

/// The plugin's name, version, description and config keys.
#[derive(Debug, Clone, Copy)]
pub struct Metadata {
    /// Short kebab-case name, e.g. `math-answer`.
    pub name: &'static str,
    /// The plugin's version.
    pub version: &'static str,
    /// One sentence on what it does.
    pub description: &'static str,
    /// The config keys it accepts.
    pub config: &'static [ConfigKey],
}

impl Metadata {
    /// Metadata with version `0.1.0` and no config keys.
    pub const fn new(name: &'static str, description: &'static str) -> Self {
        Self {
            name,
            version: "0.1.0",
            description,
            config: &[],
        }
    }

    /// The same metadata with these config keys.
    pub const fn config(self, config: &'static [ConfigKey]) -> Self {
        Self { config, ..self }
    }

    /// The same metadata with this version.
    pub const fn version(self, version: &'static str) -> Self {
        Self { version, ..self }
    }

    pub(crate) fn to_wit(self) -> wit::PluginMetadata {
        wit::PluginMetadata {
            name: self.name.into(),
            version: self.version.into(),
            description: self.description.into(),
            config_keys: self
                .config
                .iter()
                .map(|k| wit::ConfigKey {
                    name: k.name.into(),
                    description: k.description.into(),
                    default_value: k.default.map(Into::into),
                })
                .collect(),
        }
    }
}
