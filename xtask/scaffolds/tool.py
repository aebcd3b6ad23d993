"""`{{name}}`: a tool that counts the words and characters of a text.

A rein tool plugin in Python. `cargo xtask build-plugins` compiles it with componentize-py into
target/plugins/{{name}}.wasm; it runs in the sandbox (no files, no network, a deadline and a
memory cap per call). Whatever goes wrong in a call reaches the model as a message.
"""

import json
from typing import Optional

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.tool_api import ToolError, ToolOutput, ToolSpec
from wit_world.imports.types import ConfigKey, PluginError, PluginMetadata

NAME = "{{name}}"
PARAMETERS = {
    "type": "object",
    "properties": {"text": {"type": "string", "description": "The text to count"}},
    "required": ["text"],
}

# componentize-py makes a new `ToolApi` for every call: the config lives in the module.
MAX_CHARS: Optional[int] = None


class ToolApi(exports.ToolApi):
    def metadata(self) -> PluginMetadata:
        return PluginMetadata(
            name=NAME,
            version="0.1.0",
            description="Counts the words and characters of a text",
            config_keys=[ConfigKey("max_chars", "longest text accepted", "10000")],
        )

    def init(self, config: str) -> ToolSpec:
        global MAX_CHARS
        values = json.loads(config or "{}")
        unknown = sorted(set(values) - {"max_chars"})
        if unknown:
            raise Err(PluginError(f"unknown config key `{unknown[0]}` (accepted: max_chars)"))
        MAX_CHARS = values.get("max_chars", 10000)
        return ToolSpec(name=NAME, description="Count the words and characters of a text.",
                        parameters=json.dumps(PARAMETERS))

    # The output's text, and the images it shows (`Image("image/png", data)`, one per `<image>`
    # marker in the text; none here).
    def call(self, arguments: str) -> ToolOutput:
        text = json.loads(arguments).get("text")
        if not isinstance(text, str):
            raise Err(ToolError("`text` must be a string"))
        if MAX_CHARS is not None and len(text) > MAX_CHARS:
            raise Err(ToolError(f"the text is longer than {MAX_CHARS} characters"))
        return ToolOutput(f"{len(text.split())} words, {len(text)} characters", [])
