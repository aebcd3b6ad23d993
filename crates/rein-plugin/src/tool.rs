//! Tool plugins as [`Tool`]s: every failure inside the sandbox becomes a message for the model.

use rein_core::{
    FailureCounts, OutputError, PluginError, PluginErrorKind, Tool, ToolError, ToolErrorKind, ToolOutput, ToolSpec,
};

use crate::plugin::{Plugin, PluginKind, ToolInstance, Versioned};

/// A tool plugin with its config, owning one sandboxed instance.
///
/// The instance is created (and `init` called) on construction, and again after a trap
/// discarded it, so the model's infinite loop in one call costs that call only.
pub struct ToolPlugin {
    plugin: Plugin,
    config: String,
    spec: ToolSpec,
    instance: Option<ToolInstance>,
    failures: FailureCounts,
}

impl std::fmt::Debug for ToolPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolPlugin")
            .field("plugin", &self.plugin.name())
            .field("spec", &self.spec)
            .finish()
    }
}

impl Plugin {
    /// Instantiates this tool plugin with its config (a JSON object as text; `{}` for none). The
    /// plugin's `init` may reject the config; its spec must name the tool validly and give a
    /// JSON object schema.
    pub fn tool(&self, config: &str) -> Result<ToolPlugin, PluginError> {
        if self.kind() != PluginKind::Tool {
            return Err(self.wrong_kind(PluginKind::Tool));
        }
        let (instance, spec) = init(self, config)?;
        Ok(ToolPlugin {
            plugin: self.clone(),
            config: config.to_string(),
            spec,
            instance: Some(instance),
            failures: FailureCounts::default(),
        })
    }
}

/// A fresh instance with `init(config)` done, and the spec it returned, checked.
fn init(plugin: &Plugin, config: &str) -> Result<(ToolInstance, ToolSpec), PluginError> {
    let mut instance = plugin.instantiate_tool()?;
    let (name, limits) = (plugin.name(), plugin.limits());
    let spec = match &mut instance {
        Versioned::Current(instance) => instance
            .call(name, "init", limits, |store, b| {
                let result = b.rein_plugin_tool_api().call_init(store, config)?;
                Ok(result.map_err(|e| e.message))
            })
            .map(|spec| (spec.name, spec.description, spec.parameters)),
        Versioned::V0_4(instance) => instance
            .call(name, "init", limits, |store, b| {
                let result = b.rein_plugin_tool_api().call_init(store, config)?;
                Ok(result.map_err(|e| e.message))
            })
            .map(|spec| (spec.name, spec.description, spec.parameters)),
    }?;
    let spec = ToolSpec {
        name: spec.0,
        description: spec.1,
        parameters: spec.2,
    };
    let invalid = |reason: String| {
        let kind = PluginErrorKind::InvalidOutput(rein_core::OutputError::SpaceMismatch {
            what: "tool spec".into(),
            space: "a valid name and a JSON object schema".into(),
            reason,
        });
        PluginError::new(plugin.name(), Some("init"), kind)
    };
    ToolSpec::validate_name(&spec.name).map_err(invalid)?;
    match serde_json::from_str::<serde_json::Value>(&spec.parameters) {
        Ok(serde_json::Value::Object(_)) => {}
        Ok(_) => return Err(invalid("`parameters` is not a JSON object".into())),
        Err(e) => return Err(invalid(format!("`parameters` is not JSON: {e}"))),
    }
    Ok((instance, spec))
}

impl ToolPlugin {
    /// The plugin this tool runs.
    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    fn try_call(&mut self, arguments: &str) -> Result<Result<ToolOutput, String>, PluginError> {
        if self.instance.is_none() {
            let (instance, _) = init(&self.plugin, &self.config)?;
            self.instance = Some(instance);
        }
        let (plugin, limits) = (self.plugin.name(), self.plugin.limits());
        let result = match self.instance.as_mut().expect("set above") {
            Versioned::Current(instance) => instance.call(plugin, "call", limits, |store, b| {
                let result = b.rein_plugin_tool_api().call_call(store, arguments)?;
                Ok(Ok(result.map_err(|e| e.message)))
            }),
            Versioned::V0_4(instance) => instance.call(plugin, "call", limits, |store, b| {
                let result = b.rein_plugin_tool_api().call_call(store, arguments)?;
                Ok(Ok(result
                    .map(
                        |text| crate::bindings::tool::exports::rein::plugin::tool_api::ToolOutput {
                            text,
                            images: Vec::new(),
                        },
                    )
                    .map_err(|e| e.message)))
            }),
        };
        if result.as_ref().is_err_and(PluginError::is_trap) {
            self.instance = None;
        }
        let output = match result? {
            Ok(output) => output,
            Err(message) => return Ok(Err(message)),
        };
        let limit = limits.max_output_bytes();
        let size = output.text.len() + output.images.iter().map(|i| i.data.len()).sum::<usize>();
        let invalid = |reason| PluginError::new(plugin, Some("call"), PluginErrorKind::InvalidOutput(reason));
        if size > limit {
            let what = "output (text and images)".into();
            return Err(invalid(OutputError::TooLarge {
                what,
                bytes: size,
                limit,
            }));
        }
        let images = (output.images.into_iter().enumerate())
            .map(|(i, image)| {
                rein_core::Image::with_media_type(&image.media_type, image.data).map_err(|reason| {
                    invalid(OutputError::BadImage {
                        what: format!("image {i} of the output"),
                        reason,
                    })
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Ok(ToolOutput {
            text: output.text,
            images,
        }))
    }
}

impl Tool for ToolPlugin {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call(&mut self, arguments: &str) -> Result<ToolOutput, ToolError> {
        let result = self.try_call(arguments);
        match self.failures.count(result) {
            Ok(Ok(output)) => Ok(output),
            Ok(Err(message)) => Err(ToolError::new(ToolErrorKind::Tool, message)),
            Err(error) => Err(message_for_the_model(&error)),
        }
    }

    fn failures(&self) -> FailureCounts {
        self.failures
    }
}

/// What the model reads when the sandbox stopped its call: the limit, in words it can act on.
fn message_for_the_model(error: &PluginError) -> ToolError {
    use PluginErrorKind as K;
    let (kind, message) = match &error.kind {
        K::Timeout { limit } => (
            ToolErrorKind::Timeout,
            format!("execution timed out after {} ms", limit.as_millis()),
        ),
        K::OutOfFuel { limit } => (
            ToolErrorKind::Limit,
            format!("execution ran out of its budget of {limit} instructions"),
        ),
        K::MemoryLimit { limit_bytes } => (
            ToolErrorKind::Limit,
            format!("execution exceeded the memory limit of {} MiB", limit_bytes >> 20),
        ),
        K::StackOverflow { limit_bytes } => (
            ToolErrorKind::Limit,
            format!(
                "execution overflowed the stack ({} KiB): too deep a recursion",
                limit_bytes >> 10
            ),
        ),
        K::Trap { message, stderr } => {
            // The last line a crash printed (a Rust panic's message, a Python exception), past
            // Rust's hint about backtraces.
            let last = (stderr.lines().rev())
                .find(|l| !l.trim().is_empty() && !l.starts_with("note: run with `RUST_BACKTRACE"));
            let detail = last.map(|l| format!(": {}", l.trim())).unwrap_or_default();
            (ToolErrorKind::Crash, format!("the tool crashed ({message}){detail}"))
        }
        other => (ToolErrorKind::Host, format!("the tool failed: {other}")),
    };
    ToolError::new(kind, message)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn error(kind: PluginErrorKind) -> ToolError {
        message_for_the_model(&PluginError::new("python-exec", Some("call"), kind))
    }

    #[test]
    fn limits_become_messages_the_model_can_act_on() {
        let timeout = error(PluginErrorKind::Timeout {
            limit: Duration::from_millis(2000),
        });
        assert_eq!(timeout.kind, ToolErrorKind::Timeout);
        assert_eq!(timeout.message, "execution timed out after 2000 ms");
        let memory = error(PluginErrorKind::MemoryLimit { limit_bytes: 64 << 20 });
        assert_eq!(memory.kind, ToolErrorKind::Limit);
        assert!(memory.message.contains("64 MiB"), "{}", memory.message);
        let crash = error(PluginErrorKind::Trap {
            message: "wasm `unreachable` instruction executed".into(),
            stderr: "thread panicked at src/lib.rs:3:5:\nboom\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n".into(),
        });
        assert_eq!(crash.kind, ToolErrorKind::Crash);
        assert!(crash.message.ends_with(": boom"), "{}", crash.message);
    }
}
