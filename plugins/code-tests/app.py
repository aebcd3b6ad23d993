"""`code-tests`: the fraction of a dataset row's test asserts that the completion's code passes.

The code is the completion's last fenced block (```python … ```, ```py or a bare ```), or the
whole completion with `extract = "whole"`. It runs with `exec` in a fresh namespace (after the
row's `setup`, if any); then each test runs on its own in that namespace:

    passed   the test ran to the end
    failed   it raised AssertionError
    error    anything else: an exception (SystemExit included), no code block, output past
             `max_output` characters, the code itself raising before any test ran
    timeout  it ran more than `max_steps` Python line events (counted with `sys.settrace`)

The score is the passed fraction; the components are the four fractions (they sum to 1). The
tests are the row's `tests` metadata (a list of code strings, as MBPP's `test_list`), or, when
there is none, the reference: a JSON list of strings, or one test per non-empty line.

Hostile code gets nothing from the sandbox (deny-all WASI: no files, no sockets, no processes)
and is stopped here when it loops in Python; a loop inside C code, a memory bomb or a native
stack overflow ends at the host's limits instead, and the host (`isolate = true` in the recipe's
`[[reward]]`) then scores that completion alone, 0 with the reason, and the others as usual.

Build: componentize-py -d crates/rein-plugin/wit -w reward componentize app -o code-tests.wasm
"""

import io
import json
import re
import sys
from typing import List, Optional, Tuple

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.reward_api import CompletionScore
from wit_world.imports.types import Component, ConfigKey, PluginError, PluginMetadata

NAME = "code-tests"
DESCRIPTION = "The fraction of the row's test asserts that the completion's code passes"
CONFIG_KEYS = [
    ("extract", "where the code is: last-block (the last ``` fence) or whole", '"last-block"'),
    ("max_steps", "Python line events one test (or the code itself) may run", "100000"),
    ("max_output", "characters the code may print before it is stopped", "10000"),
]
OUTCOMES = ("passed", "failed", "error", "timeout")
FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL)


class Budget(BaseException):
    """Raised into the running code when it has used its line events (a BaseException, so an
    `except Exception:` in the code cannot swallow it; it is raised again on every later line,
    so a bare `except:` cannot either)."""


class OutputLimit(BaseException):
    """Raised into the running code when it has printed more than `max_output` characters."""


class CappedOutput(io.TextIOBase):
    """Swallows what the code prints, stopping it past `cap` characters."""

    def __init__(self, cap: int):
        self.size, self.cap = 0, cap

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.size += len(text)
        if self.size > self.cap:
            raise OutputLimit()
        return len(text)


class Settings:
    def __init__(self, config: str):
        values = json.loads(config or "{}")
        if not isinstance(values, dict):
            raise ValueError("the config must be a JSON object")
        known = {name for name, _, _ in CONFIG_KEYS}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown config key `{unknown[0]}` (accepted: {', '.join(sorted(known))})")
        self.extract = values.get("extract", "last-block")
        if self.extract not in ("last-block", "whole"):
            raise ValueError(f"`extract` must be \"last-block\" or \"whole\", not {self.extract!r}")
        self.max_steps = self.positive(values, "max_steps", 100_000)
        self.max_output = self.positive(values, "max_output", 10_000)

    @staticmethod
    def positive(values: dict, key: str, default: int) -> int:
        value = values.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"`{key}` must be a positive integer, not {value!r}")
        return value


def code_of(completion: str, extract: str) -> Optional[str]:
    """The code to run: the last fenced block (None when there is none), or everything."""
    if extract == "whole":
        return completion
    blocks = FENCE.findall(completion)
    return blocks[-1] if blocks else None


def tests_of(reference: Optional[str], metadata: str) -> Tuple[Optional[str], List[str]]:
    """The row's setup code and tests; raises ValueError when the row has no tests."""
    try:
        meta = json.loads(metadata) if metadata else {}
    except json.JSONDecodeError:
        meta = {}
    meta = meta if isinstance(meta, dict) else {}
    setup = meta.get("setup")
    tests = meta.get("tests")
    if tests is None and reference is not None:
        try:
            tests = json.loads(reference)
        except json.JSONDecodeError:
            tests = [line for line in reference.splitlines() if line.strip()]
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        raise ValueError("the row has no tests (metadata `tests`: a list of code strings, or the reference)")
    if setup is not None and not isinstance(setup, str):
        raise ValueError("the row's `setup` must be code (a string)")
    return setup, tests


def run(source: str, namespace: dict, settings: Settings) -> str:
    """Runs `source` in `namespace` under the step budget; returns its outcome."""
    steps = 0

    def count(frame, event, arg):
        nonlocal steps
        steps += 1
        if steps > settings.max_steps:
            raise Budget()
        return count

    out = CappedOutput(settings.max_output)
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    try:
        code = compile(source, "<code>", "exec")
        sys.settrace(count)
        try:
            exec(code, namespace)
        finally:
            sys.settrace(None)
    except Budget:
        return "timeout"
    except AssertionError:
        return "failed"
    except BaseException:  # noqa: BLE001 - SystemExit, OutputLimit and RecursionError too
        return "error"
    finally:
        sys.stdout, sys.stderr = saved
    return "passed"


def outcomes(code: Optional[str], setup: Optional[str], tests: List[str], settings: Settings) -> List[str]:
    """Each test's outcome for `code` (every test an error when there is no code, or when the
    code itself does not run; every test a timeout when the code itself loops)."""
    if code is None:
        return ["error"] * len(tests)
    namespace = {"__name__": "__main__"}
    prelude = run(setup, namespace, settings) if setup else "passed"
    if prelude != "passed":
        raise ValueError(f"the row's setup code does not run ({prelude})")
    loaded = run(code, namespace, settings)
    if loaded != "passed":
        return ["timeout" if loaded == "timeout" else "error"] * len(tests)
    return [run(test, namespace, settings) for test in tests]


def score(outcome: List[str]) -> CompletionScore:
    n = len(outcome)
    shares = [Component(kind, outcome.count(kind) / n) for kind in OUTCOMES]
    return CompletionScore(outcome.count("passed") / n, shares)


# componentize-py makes a new `RewardApi` for every call: the settings live in the module.
SETTINGS: Optional[Settings] = None


class RewardApi(exports.RewardApi):
    def metadata(self) -> PluginMetadata:
        return PluginMetadata(
            name=NAME,
            version="0.1.0",
            description=DESCRIPTION,
            config_keys=[ConfigKey(n, d, default) for n, d, default in CONFIG_KEYS],
        )

    def init(self, config: str) -> None:
        global SETTINGS
        try:
            SETTINGS = Settings(config)
        except ValueError as e:
            raise Err(PluginError(str(e)))

    def score(self, groups) -> list:
        if SETTINGS is None:
            raise Err(PluginError("`score` called before `init`"))
        scored = []
        for group in groups:
            try:
                setup, tests = tests_of(group.reference, group.metadata)
                scored.append(
                    [score(outcomes(code_of(c, SETTINGS.extract), setup, tests, SETTINGS)) for c in group.completions]
                )
            except ValueError as e:
                raise Err(PluginError(f"prompt {group.prompt[:60]!r}: {e}"))
        return scored
