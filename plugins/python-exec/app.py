"""`python-exec`: a tool that runs the Python code the model wrote (CPython inside the sandbox,
with `exec`) and returns what it printed, or the traceback when it raised.

The code runs in a fresh namespace on every call. What it prints (stdout and stderr) is capped
at `max_output` characters: past the cap the code is stopped and the output so far returned,
marked as cut. An exception (`SystemExit` included) is an error for the model with the
traceback's last `traceback_lines` lines (the code's frames, with their source lines).

Isolation (plugins/python-shared/pristine.py has every rule). The unit is one call: the trainer
loads one instance of the tool for the whole run, shared by every episode, and each call starts
from the same interpreter state whatever earlier calls, of this episode or any other, did. What a
call changed (`builtins.print = …`, `json.dumps = …`, `sys.setrecursionlimit(50)`, a module put
in `sys.modules`, `random.seed(…)`, an `atexit` callback, …) is put back, as the very objects,
before it returns; what it left is freed then, its finalizers included.

Containment (plugins/python-shared/containment.py has every rule). A call's misbehaviour ends
that call with an error for the model, never the instance: `sys.exit`, `os._exit`, `os.abort`,
`os.kill` are a SystemExit; a Python loop, however it catches exceptions, stops after `max_steps`
steps (a line started, a jump back within a line) with "execution stopped after N steps
(`max_steps`)", and `time.sleep(s)` costs s × 10 000 steps (`time.sleep(3600)` stops there too);
`sys.settrace`, `sys.setprofile`, audit hooks, frames, `gc`'s object lists, new code objects and
new builtin modules are refused (RuntimeError, ImportError). Its steps: `max_steps` for the code,
as many for the messages of its exceptions (their `__str__`), as many for its finalizers.

What stays with the host's limits, which the host reports to the model as a message ("execution
timed out after 2000 ms") before it starts a fresh instance: a loop inside C code
(`sum(range(10**13))`, a huge `str * n`, a backtracking regex), a memory bomb, a native stack
overflow (deeply nested data printed or compared), an interpreter crash (bytecode crafted through
`marshal`), and code written to dig into the plugin's own objects (function `__globals__`,
`object.__subclasses__()`, …) to switch the guards off. The sandbox does the rest: no files
(`open('/etc/passwd')` fails), no sockets, no processes (`os.system` does not exist).

The code can import the standard library modules loaded when the plugin was built
(`containment.IMPORTABLE`: math, heapq, bisect, collections, itertools, functools, fractions,
decimal, datetime, statistics, string, re, json, random, …): componentize-py's interpreter reads
no files when it runs.

Build: `cargo xtask build-plugins`, which runs, from this directory, componentize-py -d
crates/rein-plugin/wit -w tool componentize app -p . -p ../python-shared -o python-exec.wasm
"""

import builtins
import json
import traceback
from typing import Optional

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.tool_api import ToolError, ToolOutput, ToolSpec
from wit_world.imports.types import ConfigKey, PluginError, PluginMetadata

import containment
from containment import Budget, CappedOutput, OutputLimit, claim
from pristine import Unit, prepare

# A private copy of the builtins, taken at import: the code's `builtins.len = …` never reaches the
# plugin's own functions.
__builtins__ = dict(builtins.__dict__)

NAME = "python-exec"
DESCRIPTION = "Runs Python code and returns what it printed (or the traceback)"
CONFIG_KEYS = [
    ("max_output", "Most characters of printed output returned", "4000"),
    ("traceback_lines", "Lines of a traceback returned (from its end)", "6"),
    ("max_steps", "Steps (Python lines started, jumps back within a line) a call may run; "
     "time.sleep(s) costs s × 10000", "1000000"),
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
CODE_FILE = "<code>"


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
        self.max_steps = self.positive(values, "max_steps", 1_000_000)

    @staticmethod
    def positive(values: dict, key: str, default: int) -> int:
        value = values.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"`{key}` must be a positive integer, not {value!r}")
        return value


def run(source: str, settings: Settings) -> str:
    """Runs `source` as one unit; returns its output, or raises `Err(ToolError)` with output and
    traceback."""
    try:
        code = compile(source, CODE_FILE, "exec", dont_inherit=True)
    except BaseException as error:  # noqa: BLE001 - SyntaxError, and MemoryError or RecursionError
        # A compiler's exception: no code of the model's has run, nothing to take down.
        raise Err(ToolError(tail(traceback.format_exception_only(error), settings)))
    prepare(thorough=False)  # between calls only this module and componentize-py's glue ran
    output = CappedOutput(settings.max_output, keep=True)
    namespace = {"__name__": "__main__"}
    with Unit(settings.max_steps, settings.max_output, [namespace]):
        failure = containment.run(code, namespace, output, lambda error: describe(error, source, settings))
    printed = output.value()
    if failure is not None:
        raise Err(ToolError(f"{printed}{failure}" if printed else failure))
    if output.cut():
        return printed + f"\n[output cut at {settings.max_output} characters]"
    return printed


def describe(error: BaseException, source: str, settings: Settings) -> Optional[str]:
    """The end of the traceback of what ended the code (None: it printed past the cap, which is
    no error), read inside the unit (its messages are the code's own)."""
    if issubclass(type(error), OutputLimit):
        return None
    messages = CappedOutput(settings.max_output)  # what the messages' own code prints is dropped
    lines = containment.traceback_lines(error, {CODE_FILE: source.splitlines()}, messages)
    if issubclass(type(error), Budget):
        lines[-1] = f"execution stopped after {settings.max_steps} steps (`max_steps`)"
    return tail(lines, settings)


def tail(lines: list, settings: Settings) -> str:
    """The last `traceback_lines` lines of a traceback (`lines` may hold several lines each)."""
    lines = "".join(line if line.endswith("\n") else line + "\n" for line in lines).rstrip().splitlines()
    return "\n".join(lines[-settings.traceback_lines :])


# componentize-py makes a new `ToolApi` for every call: the settings live in the module.
SETTINGS: Optional[Settings] = None


class ToolApi(exports.ToolApi):
    def metadata(self) -> PluginMetadata:
        return PluginMetadata(
            name=NAME,
            version="0.2.0",
            description=DESCRIPTION,
            config_keys=[ConfigKey(n, d, default) for n, d, default in CONFIG_KEYS],
        )

    def init(self, config: str) -> ToolSpec:
        global SETTINGS
        try:
            SETTINGS = Settings(config)
        except ValueError as e:
            raise Err(PluginError(str(e)))
        prepare()  # the pristine state, taken now rather than in the first call
        return ToolSpec(
            name="python",
            description="Run Python 3 code and see what it prints. Each call starts from a fresh interpreter.",
            parameters=json.dumps(PARAMETERS),
        )

    def call(self, arguments: str) -> ToolOutput:
        if SETTINGS is None:
            raise Err(ToolError("`call` called before `init`"))
        try:
            args = json.loads(arguments)
        except ValueError as e:
            raise Err(ToolError(f"the arguments are not valid JSON: {e}"))
        code = args.get("code") if isinstance(args, dict) else None
        if not isinstance(code, str):
            raise Err(ToolError('the arguments must be {"code": "..."}'))
        return ToolOutput(run(code, SETTINGS), [])


claim()
