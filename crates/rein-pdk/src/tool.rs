//! The tool world: the [`Tool`] trait and its export adapter.

use std::marker::PhantomData;

use crate::__private::reward::rein::plugin::types::{PluginError, PluginMetadata as WitMetadata};
use crate::__private::tool::exports::rein::plugin::tool_api as wit;
use crate::config::Config;
use crate::metadata::Metadata;

/// What the model is told about a tool (OpenAI function calling).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The name the model calls it by: letters, digits, `_` and `-`.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// A JSON schema of the arguments object.
    pub parameters: serde_json::Value,
}

/// What a call gives the model: text, and images where its `<image>` markers are (all at its
/// start when it has none). A `String` converts into one without images.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolOutput {
    /// The text.
    pub text: String,
    /// The images, in order.
    pub images: Vec<crate::Image>,
}

impl ToolOutput {
    /// `text` showing `images`.
    pub fn with_images(text: impl Into<String>, images: Vec<crate::Image>) -> Self {
        Self {
            text: text.into(),
            images,
        }
    }
}

impl From<String> for ToolOutput {
    fn from(text: String) -> Self {
        Self::with_images(text, Vec::new())
    }
}

impl From<&str> for ToolOutput {
    fn from(text: &str) -> Self {
        Self::with_images(text, Vec::new())
    }
}

/// A tool an agent calls with a JSON object of arguments.
///
/// An `Err` from [`Tool::call`] is shown to the model in place of the output (bad arguments,
/// an error in the code it asked to run); so is a trap or an exhausted limit, which the host
/// reports for you.
pub trait Tool: Sized + 'static {
    /// Name, version, description and accepted config keys.
    const METADATA: Metadata;

    /// Builds the tool from its config (unknown keys were already rejected).
    fn new(config: &Config) -> Result<Self, String>;

    /// What the model is told about the tool.
    fn spec(&self) -> ToolSpec;

    /// Runs the tool on its arguments (a JSON object): text (`Ok(text.into())`), or text with
    /// images ([`ToolOutput::with_images`]).
    fn call(&mut self, arguments: &serde_json::Map<String, serde_json::Value>) -> Result<ToolOutput, String>;
}

/// Adapts a [`Tool`] to the generated `tool-api` exports.
#[doc(hidden)]
pub struct ToolExport<T>(PhantomData<T>);

impl<T: Tool> wit::Guest for ToolExport<T> {
    fn metadata() -> WitMetadata {
        T::METADATA.to_wit()
    }

    fn init(config: String) -> Result<wit::ToolSpec, PluginError> {
        let error = |message| PluginError { message };
        let config = Config::parse(&config, &T::METADATA).map_err(error)?;
        let tool = T::new(&config).map_err(error)?;
        let spec = tool.spec();
        crate::instance::set(tool);
        Ok(wit::ToolSpec {
            name: spec.name,
            description: spec.description,
            parameters: spec.parameters.to_string(),
        })
    }

    fn call(arguments: String) -> Result<wit::ToolOutput, wit::ToolError> {
        let error = |message| wit::ToolError { message };
        let arguments = match serde_json::from_str(&arguments) {
            Ok(serde_json::Value::Object(map)) => map,
            Ok(_) => return Err(error("the arguments must be a JSON object".into())),
            Err(e) => return Err(error(format!("the arguments are not valid JSON: {e}"))),
        };
        crate::instance::with("call", |tool: &mut T| tool.call(&arguments))
            .and_then(|output| output)
            .map(|output| wit::ToolOutput {
                text: output.text,
                images: output.images.into_iter().map(Into::into).collect(),
            })
            .map_err(error)
    }
}
