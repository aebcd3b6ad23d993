"""`{{name}}`: 1 when a completion contains the reference answer, else 0.

A rein reward plugin in Python. `cargo xtask build-plugins` compiles it with componentize-py
into target/plugins/{{name}}.wasm, a component for rein's `reward` world that runs in the same
sandbox as Rust plugins (no files, no network, memory and time limits per call). The standard
library is available. Its test cases are in cases.jsonl:

    cargo rein plugin test target/plugins/{{name}}.wasm --cases plugins/{{name}}/cases.jsonl
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.reward_api import CompletionScore, RewardInputs
from wit_world.imports.types import ConfigKey, PluginError, PluginMetadata

NAME = "{{name}}"
DESCRIPTION = "1 when the completion contains the reference answer, else 0"
CONFIG_KEYS = [ConfigKey("ignore_case", "compare without regard to case", "false")]

# componentize-py creates a new `RewardApi` for every call: what `init` sets lives here.
IGNORE_CASE = False


def parse_config(text):
    """The config as a dict; raises ValueError naming an unknown key or a wrong type."""
    values = json.loads(text) if text.strip() else {}
    if not isinstance(values, dict):
        raise ValueError(f"config must be a JSON object, got {text}")
    accepted = [key.name for key in CONFIG_KEYS]
    for key in sorted(values):
        if key not in accepted:
            raise ValueError(f"unknown config key `{key}` for plugin `{NAME}` (accepted: {', '.join(accepted)})")
    if not isinstance(values.get("ignore_case", False), bool):
        raise ValueError(f"config key `ignore_case` must be a boolean, got {json.dumps(values['ignore_case'])}")
    return values


def score_group(group):
    """One score per completion; none (not applicable) when there is no reference."""
    if group.reference is None:
        return [CompletionScore(None, [], []) for _ in group.completions]
    fold = str.lower if IGNORE_CASE else str
    reference = fold(group.reference)
    return [CompletionScore(1.0 if reference in fold(c) else 0.0, [], []) for c in group.completions]


class RewardApi(exports.RewardApi):
    def metadata(self):
        return PluginMetadata(NAME, "0.1.0", DESCRIPTION, CONFIG_KEYS)

    def inputs(self):
        return RewardInputs(0)  # the text only, not the tokens

    def init(self, config):
        global IGNORE_CASE
        try:
            IGNORE_CASE = parse_config(config).get("ignore_case", False)
        except ValueError as e:  # json.JSONDecodeError is one too
            raise Err(PluginError(str(e)))

    def score(self, groups):
        return [score_group(group) for group in groups]
