//! A loaded plugin: compiled, checked, linked and ready to instantiate.

use std::sync::Arc;

use rein_core::{PluginError, PluginErrorKind};
use serde::Serialize;
use wasmtime::Engine;
use wasmtime::component::{Component, HasSelf, InstancePre, Linker};

use crate::INTERFACE_VERSION;
use crate::bindings::{self, environment, reward, reward_v0_3, reward_v0_4, text_env, text_env_v0_4, tool, tool_v0_4};
use crate::imports::{Access, Import};
use crate::sandbox::{HostState, Instance, clock_view, new_store};
use rein_core::SandboxLimits;

const REWARD_EXPORT: &str = "rein:plugin/reward-api";
const ENVIRONMENT_EXPORT: &str = "rein:plugin/environment-api";
const TOOL_EXPORT: &str = "rein:plugin/tool-api";
const TEXT_ENV_EXPORT: &str = "rein:plugin/text-env-api";

/// Which world a plugin implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PluginKind {
    /// Exports `rein:plugin/reward-api`.
    Reward,
    /// Exports `rein:plugin/environment-api`.
    Environment,
    /// Exports `rein:plugin/tool-api`.
    Tool,
    /// Exports `rein:plugin/text-env-api`.
    TextEnv,
}

impl PluginKind {
    /// `reward`, `environment`, `tool` or `text-env`.
    pub fn as_str(self) -> &'static str {
        match self {
            PluginKind::Reward => "reward",
            PluginKind::Environment => "environment",
            PluginKind::Tool => "tool",
            PluginKind::TextEnv => "text-env",
        }
    }
}

/// One configuration key a plugin accepts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfigKey {
    /// The key.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Its default as JSON, if any.
    pub default_value: Option<String>,
}

/// What a plugin says about itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PluginMetadata {
    /// Its name, e.g. `math-answer`.
    pub name: String,
    /// Its own version.
    pub version: String,
    /// What it does.
    pub description: String,
    /// The config keys it accepts.
    pub config_keys: Vec<ConfigKey>,
}

impl From<bindings::Metadata> for PluginMetadata {
    fn from(m: bindings::Metadata) -> Self {
        let config_keys = m
            .config_keys
            .into_iter()
            .map(|k| ConfigKey {
                name: k.name,
                description: k.description,
                default_value: k.default_value,
            })
            .collect();
        Self {
            name: m.name,
            version: m.version,
            description: m.description,
            config_keys,
        }
    }
}

/// Everything `rein plugin inspect` shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PluginInfo {
    /// Reward, environment, tool or text environment.
    pub kind: PluginKind,
    /// The `rein:plugin` version it was built against.
    pub interface_version: String,
    /// Its metadata.
    #[serde(flatten)]
    pub metadata: PluginMetadata,
    /// A reward that asks for each completion's tokens (`inputs`).
    pub reads_tokens: bool,
    /// A reward that asks for the prompt's images (`inputs`).
    pub reads_images: bool,
    /// The interfaces it imports, and what the sandbox gives each.
    pub imports: Vec<Import>,
    /// The interfaces it exports.
    pub exports: Vec<String>,
}

pub(crate) enum Pre {
    Reward(reward::RewardPre<HostState>),
    RewardV0_4(reward_v0_4::RewardPre<HostState>),
    RewardV0_3(reward_v0_3::RewardPre<HostState>),
    Environment(environment::EnvironmentPre<HostState>),
    Tool(tool::ToolPre<HostState>),
    ToolV0_4(tool_v0_4::ToolPre<HostState>),
    TextEnv(text_env::TextEnvPre<HostState>),
    TextEnvV0_4(text_env_v0_4::TextEnvPre<HostState>),
}

/// A reward instance: of the current interface, or of 0.4.0 or 0.3.0 ([`crate::previous`]).
pub(crate) enum RewardInstance {
    Current(Instance<reward::Reward>),
    V0_4(Instance<reward_v0_4::Reward>),
    V0_3(Instance<reward_v0_3::Reward>),
}

impl RewardInstance {
    pub(crate) fn store(&mut self) -> &mut wasmtime::Store<crate::sandbox::HostState> {
        match self {
            RewardInstance::Current(instance) => &mut instance.store,
            RewardInstance::V0_4(instance) => &mut instance.store,
            RewardInstance::V0_3(instance) => &mut instance.store,
        }
    }

    pub(crate) fn stdout(&self) -> String {
        match self {
            RewardInstance::Current(instance) => instance.stdout(),
            RewardInstance::V0_4(instance) => instance.stdout(),
            RewardInstance::V0_3(instance) => instance.stdout(),
        }
    }
}

/// An instance of the current interface, or of 0.4.0 (for tools and text environments, whose
/// 0.3.0 interfaces are 0.4.0's; [`crate::previous`]).
pub(crate) enum Versioned<Current, V0_4> {
    Current(Instance<Current>),
    V0_4(Instance<V0_4>),
}

/// A tool instance.
pub(crate) type ToolInstance = Versioned<tool::Tool, tool_v0_4::Tool>;

/// A text-environment instance.
pub(crate) type TextEnvInstance = Versioned<text_env::TextEnv, text_env_v0_4::TextEnv>;

pub(crate) struct Inner {
    pub(crate) engine: Engine,
    pub(crate) pre: Pre,
    pub(crate) limits: SandboxLimits,
    pub(crate) info: PluginInfo,
}

/// A plugin ready to be instantiated: cheap to clone and to share across threads. Each
/// [`crate::RewardPlugin`], [`crate::EnvPlugin`] or [`crate::VecEnvPlugin`] made from it owns
/// its own sandboxed instance.
#[derive(Clone)]
pub struct Plugin {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("info", &self.inner.info)
            .field("limits", &self.inner.limits)
            .finish()
    }
}

impl Plugin {
    /// `previous`: the earlier version the component was built against, whose names were
    /// adopted ([`crate::previous`]).
    pub(crate) fn new(
        file_name: &str,
        engine: Engine,
        component: Component,
        limits: SandboxLimits,
        previous: Option<&'static str>,
    ) -> Result<Self, PluginError> {
        let fail = |kind| PluginError::new(file_name, None, kind);
        let ty = component.component_type();
        let imports: Vec<String> = ty.imports(&engine).map(|(name, _)| name.to_string()).collect();
        let exports: Vec<String> = ty.exports(&engine).map(|(name, _)| name.to_string()).collect();
        let (kind, version) = interface_kind(&exports).map_err(fail)?;

        let imports: Vec<Import> = imports.iter().map(|name| Import::of(name)).collect();

        let mut linker = Linker::<HostState>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .and_then(|()| crate::clocks::add_to_linker(&mut linker, clock_view))
            .and_then(|()| {
                bindings::judge::rein::plugin::judge::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            })
            .map_err(|e| {
                fail(PluginErrorKind::Host {
                    reason: format!("linking WASI: {e:#}"),
                })
            })?;
        let instance_pre: InstancePre<HostState> = linker
            .instantiate_pre(&component)
            .map_err(|e| fail(missing_import(&imports, &e)))?;
        let link_error = |e: wasmtime::Error| {
            fail(PluginErrorKind::Host {
                reason: format!("{e:#}"),
            })
        };
        let pre = match (kind, version) {
            (PluginKind::Reward, "0.3.0") => {
                Pre::RewardV0_3(reward_v0_3::RewardPre::new(instance_pre).map_err(link_error)?)
            }
            (PluginKind::Reward, "0.4.0") => {
                Pre::RewardV0_4(reward_v0_4::RewardPre::new(instance_pre).map_err(link_error)?)
            }
            (PluginKind::Reward, _) => Pre::Reward(reward::RewardPre::new(instance_pre).map_err(link_error)?),
            (PluginKind::Environment, _) => {
                Pre::Environment(environment::EnvironmentPre::new(instance_pre).map_err(link_error)?)
            }
            (PluginKind::Tool, "0.4.0") => Pre::ToolV0_4(tool_v0_4::ToolPre::new(instance_pre).map_err(link_error)?),
            (PluginKind::Tool, _) => Pre::Tool(tool::ToolPre::new(instance_pre).map_err(link_error)?),
            (PluginKind::TextEnv, "0.4.0") => {
                Pre::TextEnvV0_4(text_env_v0_4::TextEnvPre::new(instance_pre).map_err(link_error)?)
            }
            (PluginKind::TextEnv, _) => Pre::TextEnv(text_env::TextEnvPre::new(instance_pre).map_err(link_error)?),
        };
        let metadata = PluginMetadata {
            name: file_name.to_string(),
            version: String::new(),
            description: String::new(),
            config_keys: Vec::new(),
        };
        let info = PluginInfo {
            kind,
            interface_version: previous.unwrap_or(version).into(),
            metadata,
            reads_tokens: false,
            reads_images: false,
            imports,
            exports,
        };
        let mut plugin = Plugin {
            inner: Arc::new(Inner {
                engine,
                pre,
                limits,
                info,
            }),
        };
        let (metadata, inputs) = plugin.read_metadata()?;
        let info = &mut Arc::get_mut(&mut plugin.inner)
            .expect("the plugin is not shared yet")
            .info;
        info.metadata = metadata;
        info.reads_tokens = inputs.contains(reward::RewardInputs::TOKENS);
        info.reads_images = inputs.contains(reward::RewardInputs::IMAGES);
        Ok(plugin)
    }

    /// Its metadata, and what a reward reads besides the text (its `inputs`, read from the
    /// same instance; 0.3.0 rewards cannot ask, 0.4.0 ones only for tokens).
    fn read_metadata(&self) -> Result<(PluginMetadata, reward::RewardInputs), PluginError> {
        let name = self.name();
        let limits = &self.inner.limits;
        let mut inputs = reward::RewardInputs::empty();
        let metadata = match &self.inner.pre {
            Pre::Reward(_) | Pre::RewardV0_4(_) | Pre::RewardV0_3(_) => match self.instantiate_reward()? {
                RewardInstance::Current(mut instance) => {
                    let metadata = instance.call(name, "metadata", limits, |store, b| {
                        b.rein_plugin_reward_api().call_metadata(store).map(Ok)
                    })?;
                    inputs = instance.call(name, "inputs", limits, |store, b| {
                        b.rein_plugin_reward_api().call_inputs(store).map(Ok)
                    })?;
                    metadata
                }
                RewardInstance::V0_4(mut instance) => {
                    let metadata = instance.call(name, "metadata", limits, |store, b| {
                        b.rein_plugin_reward_api().call_metadata(store).map(Ok)
                    })?;
                    let asked = instance.call(name, "inputs", limits, |store, b| {
                        b.rein_plugin_reward_api().call_inputs(store).map(Ok)
                    })?;
                    if asked.contains(reward_v0_4::RewardInputs::TOKENS) {
                        inputs = reward::RewardInputs::TOKENS;
                    }
                    metadata
                }
                RewardInstance::V0_3(mut instance) => instance.call(name, "metadata", limits, |store, b| {
                    b.rein_plugin_reward_api().call_metadata(store).map(Ok)
                })?,
            },
            Pre::Environment(_) => {
                let mut instance = self.instantiate_environment()?;
                instance.call(name, "metadata", limits, |store, b| {
                    b.rein_plugin_environment_api().call_metadata(store).map(Ok)
                })?
            }
            Pre::Tool(_) | Pre::ToolV0_4(_) => match self.instantiate_tool()? {
                Versioned::Current(mut instance) => instance.call(name, "metadata", limits, |store, b| {
                    b.rein_plugin_tool_api().call_metadata(store).map(Ok)
                })?,
                Versioned::V0_4(mut instance) => instance.call(name, "metadata", limits, |store, b| {
                    b.rein_plugin_tool_api().call_metadata(store).map(Ok)
                })?,
            },
            Pre::TextEnv(_) | Pre::TextEnvV0_4(_) => match self.instantiate_text_env()? {
                Versioned::Current(mut instance) => instance.call(name, "metadata", limits, |store, b| {
                    b.rein_plugin_text_env_api().call_metadata(store).map(Ok)
                })?,
                Versioned::V0_4(mut instance) => instance.call(name, "metadata", limits, |store, b| {
                    b.rein_plugin_text_env_api().call_metadata(store).map(Ok)
                })?,
            },
        };
        let metadata = PluginMetadata::from(metadata);
        if metadata.name.is_empty() {
            let reason = rein_core::OutputError::WrongLength {
                what: "characters of name".into(),
                expected: 1,
                got: 0,
            };
            return Err(PluginError::new(
                name,
                Some("metadata"),
                PluginErrorKind::InvalidOutput(reason),
            ));
        }
        Ok((metadata, inputs))
    }

    /// The plugin's name (from its metadata).
    pub fn name(&self) -> &str {
        &self.inner.info.metadata.name
    }

    /// Reward, environment, tool or text environment.
    pub fn kind(&self) -> PluginKind {
        self.inner.info.kind
    }

    /// Metadata, interface version, imports and exports.
    pub fn info(&self) -> &PluginInfo {
        &self.inner.info
    }

    /// Whether it imports the judge (`rein:plugin/judge`), which a recipe must grant.
    pub fn imports_judge(&self) -> bool {
        let judge =
            |i: &Import| i.name.split_once('@').map_or(i.name.as_str(), |(name, _)| name) == crate::JUDGE_IMPORT;
        self.inner.info.imports.iter().any(judge)
    }

    /// The limits it runs under.
    pub fn limits(&self) -> &SandboxLimits {
        &self.inner.limits
    }

    pub(crate) fn wrong_kind(&self, expected: PluginKind) -> PluginError {
        let kind = PluginErrorKind::WrongKind {
            expected: expected.as_str(),
            found: self.kind().as_str(),
        };
        PluginError::new(self.name(), None, kind)
    }

    fn instantiate_failed(&self, error: wasmtime::Error) -> PluginError {
        let reason = format!("instantiation failed: {error:#}");
        PluginError::new(self.name(), Some("instantiate"), PluginErrorKind::Host { reason })
    }

    /// A fresh instance (a new store) from `instantiate`, one of the worlds' `…Pre::instantiate`.
    fn instantiate<B>(
        &self,
        instantiate: impl FnOnce(&mut wasmtime::Store<HostState>) -> wasmtime::Result<B>,
    ) -> Result<Instance<B>, PluginError> {
        let mut store = new_store(&self.inner.engine, &self.inner.limits);
        crate::sandbox::prepare_call(&mut store, &self.inner.limits);
        let bindings = instantiate(&mut store).map_err(|e| self.instantiate_failed(e))?;
        Ok(Instance { store, bindings })
    }

    /// A fresh reward instance (a new store from the shared `InstancePre`).
    pub(crate) fn instantiate_reward(&self) -> Result<RewardInstance, PluginError> {
        match &self.inner.pre {
            Pre::Reward(pre) => self
                .instantiate(|store| pre.instantiate(store))
                .map(RewardInstance::Current),
            Pre::RewardV0_4(pre) => self
                .instantiate(|store| pre.instantiate(store))
                .map(RewardInstance::V0_4),
            Pre::RewardV0_3(pre) => self
                .instantiate(|store| pre.instantiate(store))
                .map(RewardInstance::V0_3),
            _ => Err(self.wrong_kind(PluginKind::Reward)),
        }
    }

    /// A fresh environment instance.
    pub(crate) fn instantiate_environment(&self) -> Result<Instance<environment::Environment>, PluginError> {
        let Pre::Environment(pre) = &self.inner.pre else {
            return Err(self.wrong_kind(PluginKind::Environment));
        };
        self.instantiate(|store| pre.instantiate(store))
    }

    /// A fresh tool instance.
    pub(crate) fn instantiate_tool(&self) -> Result<ToolInstance, PluginError> {
        match &self.inner.pre {
            Pre::Tool(pre) => self.instantiate(|store| pre.instantiate(store)).map(Versioned::Current),
            Pre::ToolV0_4(pre) => self.instantiate(|store| pre.instantiate(store)).map(Versioned::V0_4),
            _ => Err(self.wrong_kind(PluginKind::Tool)),
        }
    }

    /// A fresh text-environment instance.
    pub(crate) fn instantiate_text_env(&self) -> Result<TextEnvInstance, PluginError> {
        match &self.inner.pre {
            Pre::TextEnv(pre) => self.instantiate(|store| pre.instantiate(store)).map(Versioned::Current),
            Pre::TextEnvV0_4(pre) => self.instantiate(|store| pre.instantiate(store)).map(Versioned::V0_4),
            _ => Err(self.wrong_kind(PluginKind::TextEnv)),
        }
    }
}

/// Which rein interface the component exports, and the version whose bindings run it:
/// [`INTERFACE_VERSION`], or an earlier one the host keeps bindings of (a 0.3.0 or 0.4.0 reward,
/// a 0.4.0 tool or text environment; the other interfaces of earlier components were renamed
/// to the current version when they were compiled, [`crate::previous`]).
fn interface_kind(exports: &[String]) -> Result<(PluginKind, &'static str), PluginErrorKind> {
    let mut found = Vec::new();
    for export in exports {
        let (interface, version) = export.split_once('@').unwrap_or((export, ""));
        let kind = match interface {
            REWARD_EXPORT => PluginKind::Reward,
            ENVIRONMENT_EXPORT => PluginKind::Environment,
            TOOL_EXPORT => PluginKind::Tool,
            TEXT_ENV_EXPORT => PluginKind::TextEnv,
            _ if interface.starts_with("rein:") => {
                found.push(export.clone());
                continue;
            }
            _ => continue,
        };
        if version == INTERFACE_VERSION {
            return Ok((kind, INTERFACE_VERSION));
        }
        let frozen = match kind {
            PluginKind::Reward => ["0.4.0", "0.3.0"].as_slice(),
            PluginKind::Tool | PluginKind::TextEnv => ["0.4.0"].as_slice(),
            PluginKind::Environment => [].as_slice(),
        };
        if let Some(version) = frozen.iter().find(|v| **v == version) {
            return Ok((kind, version));
        }
        found.push(export.clone());
    }
    let found = if found.is_empty() {
        "none".to_string()
    } else {
        found.join(", ")
    };
    Err(PluginErrorKind::InterfaceVersion {
        expected: INTERFACE_VERSION.into(),
        found,
    })
}

/// Names the import the linker could not satisfy.
fn missing_import(imports: &[Import], error: &wasmtime::Error) -> PluginErrorKind {
    let message = format!("{error:#}");
    let import = imports
        .iter()
        .find(|import| message.contains(import.name.as_str()))
        .or_else(|| imports.iter().find(|import| import.access == Access::Missing))
        .map(|import| import.name.clone());
    match import {
        Some(import) => PluginErrorKind::MissingImport { import },
        None => PluginErrorKind::Host {
            reason: format!("linking failed: {message}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_interface_and_its_version_select_the_kind() {
        let reward = names(&["rein:plugin/reward-api@0.5.0"]);
        assert_eq!(interface_kind(&reward), Ok((PluginKind::Reward, "0.5.0")));
        let env = names(&["wasi:cli/run@0.3.0", "rein:plugin/environment-api@0.5.0"]);
        assert_eq!(interface_kind(&env), Ok((PluginKind::Environment, "0.5.0")));
        let tool = names(&["rein:plugin/tool-api@0.5.0"]);
        assert_eq!(interface_kind(&tool), Ok((PluginKind::Tool, "0.5.0")));
        let text_env = names(&["rein:plugin/text-env-api@0.5.0"]);
        assert_eq!(interface_kind(&text_env), Ok((PluginKind::TextEnv, "0.5.0")));
    }

    #[test]
    fn earlier_versions_run_through_their_frozen_bindings() {
        for version in ["0.4.0", "0.3.0"] {
            let reward = names(&[&format!("rein:plugin/reward-api@{version}")]);
            assert_eq!(interface_kind(&reward), Ok((PluginKind::Reward, version)));
        }
        let tool = names(&["rein:plugin/tool-api@0.4.0"]);
        assert_eq!(interface_kind(&tool), Ok((PluginKind::Tool, "0.4.0")));
        let text_env = names(&["rein:plugin/text-env-api@0.4.0"]);
        assert_eq!(interface_kind(&text_env), Ok((PluginKind::TextEnv, "0.4.0")));
        // Exports left unrenamed that no frozen bindings run: a component the renaming could
        // not read.
        assert!(interface_kind(&names(&["rein:plugin/tool-api@0.3.0"])).is_err());
        assert!(interface_kind(&names(&["rein:plugin/environment-api@0.4.0"])).is_err());
    }

    #[test]
    fn another_version_is_named_in_the_error() {
        let err = interface_kind(&names(&["rein:plugin/reward-api@0.1.0"])).unwrap_err();
        assert_eq!(
            err,
            PluginErrorKind::InterfaceVersion {
                expected: INTERFACE_VERSION.into(),
                found: "rein:plugin/reward-api@0.1.0".into()
            }
        );
        let none = interface_kind(&names(&["wasi:cli/run@0.3.0"])).unwrap_err();
        assert!(none.to_string().contains("found: none"), "{none}");
    }
}
