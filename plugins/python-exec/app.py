"""`python-exec`: a tool that runs the Python code the model wrote (CPython inside the sandbox,
with `exec`) and returns what it printed, or the traceback when it raised.

The code runs in a fresh namespace on every call. What it prints (stdout and stderr) is capped
at `max_output` characters: past the cap the code is stopped and the output so far returned,
marked as cut. An exception (`SystemExit` included) is an error for the model with the
traceback's last lines. The sandbox does the rest: no files (`open('/etc/passwd')` fails), no
sockets, no processes (`os.system` does not exist), and an infinite loop, a memory bomb or a
runaway recursion ends at the call's limits, which the host reports to the model as a message
("execution timed out after 2000 ms").
"""

import io
import json
import traceback
from typing import Optional

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.tool_api import ToolError, ToolSpec
from wit_world.imports.types import ConfigKey, PluginError, PluginMetadata

NAME = "python-exec"
DESCRIPTION = "Runs Python code and returns what it printed (or the traceback)"
CONFIG_KEYS = [
    ("max_output", "Most characters of printed output returned", "4000"),
    ("traceback_lines", "Lines of a traceback returned (from its end)", "6"),
]
PARAMETERS = {
    "type": "object",
    "properties": {
        "code": {
            "type": "string",
            "description": "Python 3 code; use print() to show results",
        }
    },
    "required": ["code"],
}


class OutputLimit(Exception):
    """Raised into the running code when it has printed more than the cap."""


class CappedOutput(io.TextIOBase):
    """A text stream that keeps the first `cap` characters and then stops the writer."""

    def __init__(self, cap: int):
        self.parts, self.size, self.cap = [], 0, cap

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        room = self.cap - self.size
        if len(text) > room:
            self.parts.append(text[: max(room, 0)])
            self.size = self.cap
            raise OutputLimit()
        self.parts.append(text)
        self.size += len(text)
        return len(text)

    def value(self) -> str:
        return "".join(self.parts)


class Settings:
    def __init__(self, config: str):
        values = json.loads(config or "{}")
        if not isinstance(values, dict):
            raise ValueError("the config must be a JSON object")
        known = {name for name, _, _ in CONFIG_KEYS}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown config key `{unknown[0]}` (accepted: {', '.join(sorted(known))})")
        self.max_output = self.positive(values, "max_output", 4000)
        self.traceback_lines = self.positive(values, "traceback_lines", 6)

    @staticmethod
    def positive(values: dict, key: str, default: int) -> int:
        value = values.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"`{key}` must be a positive integer, not {value!r}")
        return value


def run(code: str, settings: Settings) -> str:
    """Runs `code`; returns its output, or raises `Err(ToolError)` with output and traceback."""
    import sys

    out = CappedOutput(settings.max_output)
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    try:
        exec(compile(code, "<code>", "exec"), {"__name__": "__main__"})
    except OutputLimit:
        return out.value() + f"\n[output cut at {settings.max_output} characters]"
    except BaseException:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are the model's too
        lines = traceback.format_exc().rstrip().splitlines()
        tail = "\n".join(lines[-settings.traceback_lines :])
        printed = out.value()
        raise Err(ToolError(f"{printed}{tail}" if printed else tail))
    finally:
        sys.stdout, sys.stderr = saved
    return out.value()


# componentize-py makes a new `ToolApi` for every call: the settings live in the module.
SETTINGS: Optional[Settings] = None


class ToolApi(exports.ToolApi):
    def metadata(self) -> PluginMetadata:
        return PluginMetadata(
            name=NAME,
            version="0.1.0",
            description=DESCRIPTION,
            config_keys=[ConfigKey(n, d, default) for n, d, default in CONFIG_KEYS],
        )

    def init(self, config: str) -> ToolSpec:
        global SETTINGS
        try:
            SETTINGS = Settings(config)
        except ValueError as e:
            raise Err(PluginError(str(e)))
        return ToolSpec(
            name="python",
            description="Run Python 3 code and see what it prints. Each call starts from a fresh namespace.",
            parameters=json.dumps(PARAMETERS),
        )

    def call(self, arguments: str) -> str:
        if SETTINGS is None:
            raise Err(ToolError("`call` called before `init`"))
        try:
            args = json.loads(arguments)
        except ValueError as e:
            raise Err(ToolError(f"the arguments are not valid JSON: {e}"))
        code = args.get("code") if isinstance(args, dict) else None
        if not isinstance(code, str):
            raise Err(ToolError('the arguments must be {"code": "..."}'))
        return run(code, SETTINGS)
