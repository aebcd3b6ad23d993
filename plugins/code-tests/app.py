"""`code-tests`: the fraction of a dataset row's test asserts that the completion's code passes.

The code is the completion's last fenced block (```python … ```, ```py or a bare ```), or the
whole completion with `extract = "whole"`. The row's `setup` (metadata, optional) runs first, then
the code with `exec` in a namespace that starts as a copy of the setup's globals, then each test on
its own. The tests are the row's `tests` metadata (a list of code strings, as MBPP's `test_list`),
or, when there is none, the reference: a JSON list of strings, or one test per non-empty line.

    passed   the test ran to the end
    failed   it raised AssertionError (a strict-asserts check included)
    error    anything else: an exception (SystemExit, KeyboardInterrupt, os._exit included), no
             code block, output past `max_output` characters, the code itself raising before any
             test ran, or the code tampering with the interpreter (strict asserts)
    timeout  it used more than `max_steps` steps (see Containment)

The score is the passed fraction; the components are the four fractions (they sum to 1). A
completion can import the builtin modules and the standard library loaded when the plugin was
built (componentize-py's interpreter reads no files when it runs): those the plugin and
componentize-py use (re, json, typing, collections, functools, enum, random, …) and
SOLUTION_MODULES below (heapq, bisect, math, fractions, decimal, datetime, string, …).

Isolation. The unit is one completion: each starts from the same interpreter state (taken when
the plugin first scores, again whenever something else than a completion changed it, with the
completion's view below in place), and what it changed is put back, as the very objects, before
the next one runs:
  - `sys.modules` (modules it imported are dropped, entries it replaced or removed come back); the
    namespace of every module loaded before it (`builtins`, `json.dumps`, `sys.stdout`,
    `sys.path`, `sys.excepthook`, …), of `sys.monitoring`, and of every class (but builtin ones)
    and instance of a Python class those hold (`collections.Counter`, `os.environ`, `json`'s
    default encoder, enum members, …), and so on down; the contents of every list, dict and set
    all these hold (`sys.path`, `sys.meta_path`, `sys.path_hooks`, `sys.path_importer_cache`,
    `warnings.filters`, `copyreg.dispatch_table`, `gc.callbacks`, caches such as `re`'s);
  - settings: the recursion limit, int max str digits, the switch interval, async generator hooks,
    coroutine origin tracking, `gc` (enabled, thresholds, debug flags), `atexit` callbacks,
    `sys.monitoring` tool ids, `random`'s state;
  - what it left is freed under its guards and budget, and what its finalizers change is put back
    again (three rounds; objects whose finalizers still change something stay alive, unfinalized).
Telling what changed is one pass in C comparing every watched entry with its snapshot by `==`,
which only an object whose class defines `__eq__` can fool: when the completion left such a class
alive, or swapped a watched list, dict or set for another, every watched object is compared by
identity instead. Not noticed: a value swapped for an equal one of an immutable builtin type (`1`
for `True`), and a class attribute renamed in a way that keeps the class's values in order (its
last one, say).
The plugin depends on none of this state: its functions look builtin names up in a private copy
made at import, the `sys`, `gc` and `sys.monitoring` functions it calls are bound at import, and
its modules are out of `sys.modules` while a completion runs. (A fresh sub-interpreter per
completion would be a stronger unit, but componentize-py's CPython 3.14 has no `_interpreters`.)

Containment. One completion's misbehaviour costs only its own score, without the host's
`isolate`. While a completion runs (its code, its tests, its finalizers):
  - `os._exit`, `os.abort`, `os.kill`, `os.killpg` (and `posix`'s) raise SystemExit; SystemExit,
    KeyboardInterrupt and every other exception end only the piece (its code, or one test) that
    raised them;
  - steps: a `sys.monitoring` tool counts one per line started, and one per jump back within a
    line (as `sys.settrace` counts lines), in every Python function but the plugin's, and raises
    a BaseException on every step past the budget, so no `except` or `finally` keeps a loop going.
    Budget: `max_steps` for the code, `max_steps` for each test, `max_steps` for freeing what it
    left: at most max_steps × (tests + 2) steps a completion;
  - `time.sleep(s)` returns at once, after s × 10 000 steps (1 ms = 10 steps): `time.sleep(3600)`
    is a timeout of that piece, not of the host's call; spinning on a clock costs steps like any
    loop;
  - refused (RuntimeError; new audit hooks silently): `sys.settrace`, `sys.setprofile` and
    `sys.addaudithook` (their functions would run unmetered), `sys.monitoring`'s setters, frames
    (`sys._getframe`, `sys._current_frames`, `tb_frame`, `gi_frame`, `cr_frame`, `ag_frame`),
    `gc.get_objects`, `gc.get_referrers`, `gc.get_referents`, new code objects (`code.__new__`,
    `code.replace`) and setting a function's `__code__`; builtin modules cannot be created or
    re-created (ImportError: a fresh `posix` would bring `_exit` back; `_signal` and
    `faulthandler` end the process, `select` waits on the clock); a recursion limit it lowered is
    raised back before each piece.
What stays with the host's limits (its deadline and memory cap; `isolate = true` then scores the
others): a loop inside C code (`sum(range(10**13))`, a huge `str * n`, a backtracking regex), a
memory bomb, a native stack overflow (deeply nested data printed or compared), an interpreter
crash (bytecode crafted through `marshal`), and code written to dig into the plugin's own objects
(function `__globals__` / `__closure__`, `object.__subclasses__()`, objects in C-level caches such
as `functools.lru_cache` or the `abc` registries) to switch the guards off or to judge its own
tests. Nothing outside the sandbox is reachable either way (deny-all WASI: no files, sockets or
processes).

Strict asserts (`strict_asserts = true`, the default; false gives plain Python semantics, with
isolation and containment unchanged). What a completion returns cannot fake a pass:
  - in every `assert` statement of the row (its tests and its setup), each operand of a comparison
    (`==`, `!=`, `<`, `<=`, `>`, `>=`, `in`, `not in`; pure `is` / `is not` chains are left alone)
    and each value whose truth is taken (the assert's, `not x`, the operands of `and` / `or`, the
    condition of `x if c else y`, comprehensions' `if`s, the elements of `all(…)` / `any(…)` over
    a comprehension, `bool(x)`) must be plain, else the test fails;
  - plain: None, bool, int, float, complex, str, bytes, and list, tuple, dict, set and frozenset of
    plain values, recursively, each of exactly these types (no subclasses); or an instance of a
    class the row's setup defined (its `__module__` is the setup's), while that class and those
    it derives from hold what they held when the setup ran, whose `__dict__` values are plain in
    turn. The tests' own calls (`len(x)`, `math.isclose(x, y)`, `str(x)`) reach a value through
    its protocols, which the check does not look into. Checking costs a step per value it visits
    inside containers;
  - tests run in their own globals: the completion's names but those of builtins (in a test,
    `len` or `sorted` is always the builtin), under the setup's names (the setup's functions keep
    the setup's globals);
  - a completion that changes what tests rely on scores "error" on every test: adding, removing or
    rebinding anything in `builtins` or in the plugin's modules, rebinding a function, class or
    module held by a module loaded before it (`json.dumps = …`, `math.isclose = …`), adding or
    rebinding a method of a class such a module holds, or replacing a module in `sys.modules`.
    Data (`sys.stdout`, `sys.path`, …) and the settings above are only put back.

Build: componentize-py -d crates/rein-plugin/wit -w reward componentize app -o code-tests.wasm
"""

import ast
import atexit
import builtins
import gc
import io
import json
import random
import re
import sys
import types
import warnings
from gc import collect, freeze, get_objects, get_referents
from itertools import compress, repeat
from operator import is_
from os import _exit as hard_exit
from sys import getrecursionlimit, setrecursionlimit
from typing import Dict, List, Optional, Tuple

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.reward_api import CompletionScore
from wit_world.imports.types import Component, ConfigKey, PluginError, PluginMetadata

# The standard library a completion can import: componentize-py's interpreter reads no files when
# it runs, so only the modules loaded when the plugin was built exist (those the plugin and
# componentize-py use, and these, loaded for solutions).
SOLUTION_MODULES = (
    "array", "binascii", "bisect", "cmath", "collections", "copy", "dataclasses", "datetime", "decimal", "fractions",
    "functools", "heapq", "itertools", "math", "operator", "statistics", "string", "struct", "typing", "unicodedata",
    "warnings", "zlib",
)
list(map(__import__, SOLUTION_MODULES))

# The plugin's own functions look builtin names up in this private copy, taken at import: a
# completion that rebinds `builtins.len` or `builtins.AssertionError` changes what its own code
# sees, never what the plugin does. (The `sys`, `gc` and `os` functions it calls are bound above.)
__builtins__ = dict(builtins.__dict__)
BUILTIN_NAMES = frozenset(__builtins__)

NAME = "code-tests"
DESCRIPTION = "The fraction of the row's test asserts that the completion's code passes"
CONFIG_KEYS = [
    ("extract", "where the code is: last-block (the last ``` fence) or whole", '"last-block"'),
    ("max_steps", "steps (Python lines started) one test, or the code itself, may run", "100000"),
    ("max_output", "characters the code may print before it is stopped", "10000"),
    ("strict_asserts", "compared values must be plain Python values and the code must not patch "
     "the interpreter (false: plain Python semantics)", "true"),
]
OUTCOMES = ("passed", "failed", "error", "timeout")
FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL)
COMPLETION_FILE = "<completion>"
ROW_FILE = "<row>"
SLEEP_STEPS_PER_SECOND = 10_000


class Budget(BaseException):
    """Raised into the running code when it has used its steps (a BaseException, so that an
    `except Exception:` cannot swallow it; raised again on every later step, so that a bare
    `except:` cannot either)."""


class OutputLimit(BaseException):
    """Raised into the running code when it has printed more than `max_output` characters."""


class NotPlain(AssertionError):
    """A compared or truth-tested value in an assert is not a plain Python value (strict asserts)."""


class Denied(RuntimeError):
    """What the completion's code gets for an operation the guards refuse (a RuntimeError, so
    that `sys.addaudithook` refuses new hooks silently)."""


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
        self.strict_asserts = values.get("strict_asserts", True)
        if not isinstance(self.strict_asserts, bool):
            raise ValueError(f"`strict_asserts` must be true or false, not {self.strict_asserts!r}")

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


# --- Strict asserts: every compared or truth-tested value in an assert goes through `plain` ---

CHECK = "\0rein: plain value check\0"  # a placeholder constant, swapped for `plain` once compiled
PLAIN_SCALARS = frozenset(map(id, (type(None), bool, int, float, complex, str, bytes)))
PLAIN_CONTAINERS = frozenset(map(id, (list, tuple, dict, set, frozenset)))


def checked(node: ast.expr) -> ast.expr:
    """`(CHECK,)[0](node)`: the compiler folds it to a call of the constant, and unlike
    `CHECK(node)` does not warn that a str is not callable."""
    check = ast.Subscript(ast.Tuple([ast.Constant(CHECK)], ast.Load()), ast.Constant(0), ast.Load())
    call = ast.Call(check, [node], [])
    call.is_check = True
    return call


def truth(node: ast.expr) -> ast.expr:
    """`node` where its truth is taken: checked, unless it already is a bool made of checked
    values (a comparison, `not …`, `and` / `or` of checked values) or checked itself."""
    if isinstance(node, (ast.Compare, ast.BoolOp)) or (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)):
        return node
    if getattr(node, "is_check", False):
        return node
    return checked(node)


class InAssert(ast.NodeTransformer):
    """Inside one assert: checks the operands of comparisons and the values tested for truth."""

    def visit_Compare(self, node: ast.Compare) -> ast.Compare:
        self.generic_visit(node)
        operands = [node.left, *node.comparators]
        compared = set()
        for i, op in enumerate(node.ops):
            if not isinstance(op, (ast.Is, ast.IsNot)):
                compared.update((i, i + 1))
        operands = [checked(o) if i in compared else o for i, o in enumerate(operands)]
        node.left, node.comparators = operands[0], operands[1:]
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.BoolOp:
        self.generic_visit(node)
        node.values = [truth(v) for v in node.values]
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.UnaryOp:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            node.operand = truth(node.operand)
        return node

    def visit_IfExp(self, node: ast.IfExp) -> ast.IfExp:
        self.generic_visit(node)
        node.test = truth(node.test)
        return node

    def visit_comprehension(self, node: ast.comprehension) -> ast.comprehension:
        self.generic_visit(node)
        node.ifs = [truth(t) for t in node.ifs]
        return node

    def visit_Call(self, node: ast.Call) -> ast.Call:
        self.generic_visit(node)
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name == "bool" and len(node.args) == 1 and not node.keywords:
            node.args[0] = truth(node.args[0])
        elif name in ("all", "any") and len(node.args) == 1:
            if isinstance(node.args[0], (ast.GeneratorExp, ast.ListComp, ast.SetComp)):
                node.args[0].elt = truth(node.args[0].elt)
        return node


class StrictAsserts(ast.NodeTransformer):
    def visit_Assert(self, node: ast.Assert) -> ast.Assert:
        node.test = truth(InAssert().visit(node.test))
        return node


def with_constant(const, placeholder: str, value: object):
    """`const` (a code object, and the code and tuples nested in it) with the constant
    `placeholder` replaced by `value`."""
    if type(const) is types.CodeType:
        return const.replace(co_consts=tuple(with_constant(c, placeholder, value) for c in const.co_consts))
    if type(const) is tuple:
        return tuple(with_constant(c, placeholder, value) for c in const)
    return value if type(const) is str and const == placeholder else const


def compile_row(source: str, strict: bool) -> types.CodeType:
    """The row's code (setup or one test), with its asserts checked when `strict`."""
    tree = ast.parse(source, ROW_FILE)
    if strict:
        tree = ast.fix_missing_locations(StrictAsserts().visit(tree))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # CPython < 3.14: "'str' is not callable"
        code = compile(tree, ROW_FILE, "exec", dont_inherit=True)
    return with_constant(code, CHECK, plain) if strict else code


def ids_of(mapping) -> List[int]:
    """The identities of a mapping's keys and values, in order: an equal list means the same."""
    return [*map(id, mapping), *map(id, mapping.values())]


class SetupClasses:
    """The classes the row's setup defined and, for each, the identities of what it and its bases
    held right after the setup ran: their instances count as plain while these stay the same."""

    def __init__(self, setup_globals: dict):
        module = setup_globals.get("__name__")
        self.state = {}
        for value in list(setup_globals.values()):
            if isinstance(value, type) and value.__dict__.get("__module__") == module:
                self.state[id(value)] = self.signature(value)

    @staticmethod
    def signature(cls: type) -> list:
        mro = type.__dict__["__mro__"].__get__(cls)
        return [list(map(id, mro)), *(ids_of(c.__dict__) for c in mro if c is not object)]

    def trusts(self, cls: type) -> bool:
        known = self.state.get(id(cls))
        return known is not None and known == self.signature(cls)


class Active:
    """What the guards need while a completion runs (one instance, mutated, never rebound)."""

    def __init__(self):
        self.guarded = False  # a completion runs: the audit hook refuses
        self.meter: Optional["Meter"] = None  # its line budget
        self.setup_classes: Optional[SetupClasses] = None
        self.view: Optional["View"] = None
        self.pristine: Optional["Pristine"] = None
        self.kept_alive: list = []  # what finalizers kept changing the state for: never finalized


ACTIVE = Active()


def plain(value):
    """`value` when it is plain (see the module docstring); else raises NotPlain."""
    todo, seen = [value], set()
    while todo:
        ACTIVE.meter.charge(1)  # a value nested without end costs the test's budget, not the call's time
        item = todo.pop()
        kind = type(item)
        if id(kind) in PLAIN_SCALARS or id(item) in seen:
            continue
        seen.add(id(item))
        if id(kind) in PLAIN_CONTAINERS:
            members = [*item.keys(), *item.values()] if kind is dict else list(item)
            if not set(map(id, map(type, members))) <= PLAIN_SCALARS:
                todo.extend(members)
        elif ACTIVE.setup_classes is not None and ACTIVE.setup_classes.trusts(kind):
            fields = getattr(item, "__dict__", None)
            todo.extend(fields.values() if type(fields) is dict else ())
        else:
            raise NotPlain(f"strict_asserts: a compared value is a `{kind.__qualname__}`, not a plain Python value")
    return value


# --- Guards: what the completion's code may not do, and what it sees instead ---

DENIED_EVENTS = frozenset({
    "sys.addaudithook", "sys.settrace", "sys.setprofile", "sys.monitoring.register_callback",
    "sys._getframe", "sys._current_frames", "gc.get_objects", "gc.get_referrers",
    "gc.get_referents", "code.__new__",
})
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})


def audit(event: str, args: tuple) -> None:
    """The plugin's audit hook: refuses, while a completion runs, what would run its code
    unmetered (trace, profile and audit hooks run with monitoring off), reach the plugin's
    frames and objects, or craft bytecode."""
    if not ACTIVE.guarded:
        return
    if (
        event in DENIED_EVENTS
        or (event == "object.__getattr__" and args[1] in FRAME_ATTRIBUTES)
        or (event == "object.__setattr__" and args[1] == "__code__")
    ):
        raise Denied(f"`{event}` is not available to the completion's code")


sys.addaudithook(audit)

# The line budget is a `sys.monitoring` tool of its own: unlike a `sys.settrace` function, which
# CPython removes from the frame it raised into (so that a loop catching the exception ran on
# unmetered), a monitoring callback stays, and raises again on the loop's next line.
MONITORING = sys.monitoring
BUDGET_TOOL = next(t for t in (5, 4, 3, 2, 1, 0) if MONITORING.get_tool(t) is None)
MONITORING.use_tool_id(BUDGET_TOOL, "code-tests line budget")
LINE, JUMP, DISABLE = MONITORING.events.LINE, MONITORING.events.JUMP, MONITORING.DISABLE
register_callback, set_events = MONITORING.register_callback, MONITORING.set_events
get_tool, free_tool_id = MONITORING.get_tool, MONITORING.free_tool_id
clear_tool_id = getattr(MONITORING, "clear_tool_id", lambda tool: None)  # new in 3.14
PLUGIN_FILE = Settings.positive.__code__.co_filename


class Meter:
    """The step budget of the piece running now (the completion's code, one test, or the
    freeing of what it left), kept by a `sys.monitoring` tool's callbacks: a step per line
    started, and per jump back within a line (`while 1: pass`), as `sys.settrace` counts lines.
    The plugin's own lines cost nothing: their events are switched off where they fire."""

    def __init__(self, steps: int):
        self.steps = self.left = steps
        self.jumped = False

    def restart(self) -> None:
        self.left = self.steps

    def charge(self, steps: int) -> None:
        self.left -= steps
        if self.left < 0:
            raise Budget()

    def on_line(self, code, line):
        if code.co_filename == PLUGIN_FILE:
            return DISABLE
        if self.jumped:  # the jump that led here was the step
            self.jumped = False
            return None
        self.charge(1)

    def on_jump(self, code, source, target):
        if code.co_filename == PLUGIN_FILE:
            return DISABLE
        self.jumped = True
        self.charge(1)

    def start(self) -> None:
        register_callback(BUDGET_TOOL, LINE, self.on_line)
        register_callback(BUDGET_TOOL, JUMP, self.on_jump)
        set_events(BUDGET_TOOL, LINE | JUMP)

    @staticmethod
    def stop() -> None:
        set_events(BUDGET_TOOL, 0)
        register_callback(BUDGET_TOOL, LINE, None)
        register_callback(BUDGET_TOOL, JUMP, None)


# What the completion finds in place of what would end or stall the whole call. Their code is
# compiled apart, with globals of its own: nothing in them leads into the plugin, and their lines
# are metered like the completion's (a sleep costs SLEEP_STEPS_PER_SECOND steps a second, spent
# in a loop: nothing to switch off).
STAND_INS_SOURCE = """
def exit_instead(*args, **kwargs):
    raise SystemExit("the process cannot be ended from the completion's code")

def monitoring_refused(*args, **kwargs):
    raise RuntimeError("sys.monitoring cannot be changed by the completion's code")

def import_refused(spec_or_module, *args):
    raise ImportError("builtin modules cannot be created or re-created by the completion's code")

def sleep_instead(seconds):
    seconds = float(seconds)
    if not seconds >= 0:
        raise ValueError("sleep length must be non-negative")
    for _ in range(int(min(seconds, 1e9) * STEPS_PER_SECOND)):
        pass
"""
STAND_IN_BUILTINS = (ImportError, RuntimeError, SystemExit, ValueError, float, int, min, range)
STAND_IN_SCOPE = {
    "__builtins__": {f.__name__: f for f in STAND_IN_BUILTINS},
    "STEPS_PER_SECOND": SLEEP_STEPS_PER_SECOND,
}
exec(compile(STAND_INS_SOURCE, "<stand-in>", "exec"), STAND_IN_SCOPE)
EXITS = ("_exit", "abort", "kill", "killpg")
MONITORING_SETTERS = ("use_tool_id", "clear_tool_id", "free_tool_id", "register_callback", "set_events",
                      "set_local_events", "restart_events")
STAND_INS = {
    "os": dict.fromkeys(EXITS, STAND_IN_SCOPE["exit_instead"]),
    "posix": dict.fromkeys(EXITS, STAND_IN_SCOPE["exit_instead"]),
    "time": {"sleep": STAND_IN_SCOPE["sleep_instead"]},
    # The builtin modules it may use are loaded already (SOLUTION_MODULES); a fresh `posix` would
    # bring `_exit` back, `_signal` and `faulthandler` end the process, `select` waits on the clock.
    "_imp": dict.fromkeys(("create_builtin", "exec_builtin"), STAND_IN_SCOPE["import_refused"]),
    "sys.monitoring": dict.fromkeys(MONITORING_SETTERS, STAND_IN_SCOPE["monitoring_refused"]),
}
PLUGIN_PACKAGES = (__name__, "wit_world", "componentize_py_types", "componentize_py_runtime",
                   "componentize_py_async_support")


def module_dict(name: str) -> dict:
    """The `__dict__` of a loaded module (or of `sys.monitoring`), or {} when there is none."""
    module = sys.monitoring if name == "sys.monitoring" else sys.modules.get(name)
    return vars(module) if module is not None else {}


class View:
    """What the completion sees instead of the plugin's interpreter: the stand-ins in place of
    what would end or stall the whole call, and the plugin's modules out of `sys.modules`."""

    def __init__(self):
        self.originals = {
            (module, name): module_dict(module)[name]
            for module, stand_ins in STAND_INS.items() for name in stand_ins if name in module_dict(module)
        }
        self.plugin_modules = {name: m for name, m in sys.modules.items() if in_plugin(name)}

    def install(self) -> None:
        for module, name in self.originals:
            module_dict(module)[name] = STAND_INS[module][name]
        for name in self.plugin_modules:
            sys.modules.pop(name, None)

    def uninstall(self) -> None:
        for (module, name), original in self.originals.items():
            module_dict(module)[name] = original
        sys.modules.update(self.plugin_modules)


# --- The pristine state, put back after every completion ---

MISSING = object()
IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: builtin classes nobody can change
HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: classes made by `class` statements


def in_plugin(name: str) -> bool:
    """Whether `name` (a module's, or a dotted path from one) is in the plugin's own modules (whose
    instances, ACTIVE and SETTINGS, are the plugin's state, which it changes between completions)."""
    return name.split(".")[0] in PLUGIN_PACKAGES


def instance_dict(value):
    """The `__dict__` of a pristine instance, or None."""
    try:
        return object.__getattribute__(value, "__dict__")
    except Exception:  # noqa: BLE001 - no `__dict__`, or a class that refuses it
        return None


def is_code(value) -> bool:
    """Functions, classes, modules and method descriptors: rebinding these changes behaviour."""
    return callable(value) or issubclass(type(value), (types.ModuleType, classmethod, staticmethod, property))


def str_entries(mapping) -> Tuple[dict, int]:
    """The entries of `mapping` with `str` keys (built without running any of its keys' code),
    and how many other keys it has."""
    keys, values = list(mapping), list(mapping.values())
    entries = {k: v for k, v in zip(keys, values) if type(k) is str}
    return entries, len(keys) - len(entries)


def same_items(live, snapshot) -> bool:
    """Whether two lists, sets or dicts hold the very same objects (no object's code runs)."""
    if len(live) != len(snapshot):
        return False
    if type(live) is set:
        return set(map(id, live)) == set(map(id, snapshot))
    if type(live) is dict and not all(map(is_, live.values(), snapshot.values())):
        return False
    return all(map(is_, live, snapshot))


def defines_equality(cls: type) -> bool:
    """Whether `cls` or a class it derives from (but `object`) defines `__eq__` (read without
    running any code of `cls` or of its metaclass)."""
    mro = type.__dict__["__mro__"].__get__(cls)
    return any("__eq__" in type.__dict__["__dict__"].__get__(c) for c in mro if c is not object)


class Place:
    """A dict whose entries are put back: a module's namespace, a class's (put back through the
    class, so that its caches follow), or a dict a module or a class holds."""

    def __init__(self, name: str, entries: dict, owner=None, strict: bool = False):
        self.name, self.entries, self.owner, self.strict = name, entries, owner, strict
        self.snapshot = dict(entries)

    def changed(self, by_identity: bool) -> bool:
        return not same_items(self.entries, self.snapshot) if by_identity else self.entries != self.snapshot

    def put_back(self, doomed: list) -> List[str]:
        """Restores the entries, keeping what it displaced in `doomed`; returns the tampering."""
        current, odd_keys = str_entries(self.entries)
        doomed.append(dict(self.entries))
        tampering = self.tampering(current, odd_keys)
        if isinstance(self.owner, type):
            for key in current.keys() - self.snapshot.keys():
                type.__delattr__(self.owner, key)
            for key, value in self.snapshot.items():
                if current.get(key, MISSING) is not value:
                    type.__setattr__(self.owner, key, value)
            self.snapshot = dict(self.entries)  # the same entries, perhaps in another order
        else:
            self.entries.clear()
            self.entries.update(self.snapshot)
        return tampering

    def tampering(self, current: dict, odd_keys: int) -> List[str]:
        """What changed that tests rely on (see the module docstring), given the entries with
        `str` keys and how many others there are."""
        if self.owner is None and self.name != "sys.modules":
            return []  # the contents of a dict are only put back
        found = [f"{self.name}[a non-str key]"] * odd_keys
        for key in current.keys() | self.snapshot.keys():
            before, now = self.snapshot.get(key, MISSING), current.get(key, MISSING)
            if before is now:
                continue
            if self.name == "sys.modules":
                tampered = before is not MISSING and now is not MISSING  # a module replaced
            elif self.strict:
                tampered = key != "__warningregistry__"  # the builtins, the plugin's modules
            elif before is not MISSING:
                tampered = is_code(before) and now is not MISSING  # a function or class rebound
            else:
                tampered = type(self.owner) is not types.ModuleType and is_code(now)  # a method added
            if tampered:
                found.append(f"{self.name}.{key}")
        return found


class Sequence:
    """A list or a set a module or a class holds: its contents are put back."""

    def __init__(self, name: str, container):
        self.name, self.container = name, container
        self.snapshot = type(container)(container)

    def changed(self, by_identity: bool) -> bool:
        return not same_items(self.container, self.snapshot) if by_identity else self.container != self.snapshot

    def put_back(self, doomed: list) -> List[str]:
        doomed.append(type(self.container)(self.container))
        self.container.clear()
        (self.container.extend if type(self.container) is list else self.container.update)(self.snapshot)
        return []


class InterpreterSettings:
    """The settings kept outside Python objects: put back after every completion."""

    SETTERS = [
        (sys.getrecursionlimit, sys.setrecursionlimit),
        (sys.get_int_max_str_digits, sys.set_int_max_str_digits),
        (sys.getswitchinterval, sys.setswitchinterval),
        (sys.get_asyncgen_hooks, lambda hooks: sys.set_asyncgen_hooks(*hooks)),
        (sys.get_coroutine_origin_tracking_depth, sys.set_coroutine_origin_tracking_depth),
        (gc.isenabled, lambda on: gc.enable() if on else gc.disable()),
        (gc.get_threshold, lambda threshold: gc.set_threshold(*threshold)),
        (gc.get_debug, gc.set_debug),
    ]

    def __init__(self):
        self.values = [(set_, get()) for get, set_ in self.SETTERS]
        self.recursion_limit = getrecursionlimit()
        self.atexit_callbacks = atexit._ncallbacks()
        self.tools = [get_tool(i) for i in range(6)]
        self.random_state = random.getstate()

    def restore(self) -> None:
        for set_, value in self.values:
            set_(value)
        if self.atexit_callbacks == 0 and atexit._ncallbacks():
            atexit._clear()
        for tool, name in enumerate(self.tools):
            if name is None and get_tool(tool) is not None:
                clear_tool_id(tool)
                free_tool_id(tool)
        random.setstate(self.random_state)


class Pristine:
    """The interpreter's state as a completion starts (see the module docstring), and putting it
    back. Whether anything changed is one pass in C comparing every watched entry with its
    snapshot by `==`, which only an object whose class defines `__eq__` can fool: when the
    completion left such a class alive (or swapped a mutable value for an equal one), each
    watched object is compared by identity instead."""

    def __init__(self, plugin_modules: Dict[str, types.ModuleType]):
        self.places: List[Place] = []
        self.sequences: List[Sequence] = []
        self.mutables: List[Tuple[dict, str, object]] = []  # the watched containers, by identity
        self.seen = set()
        modules = [*sys.modules.items(), *plugin_modules.items()]
        for name, module in modules:
            entries = getattr(module, "__dict__", None)
            if type(entries) is dict and id(entries) not in self.seen:
                strict = name == "builtins" or name in plugin_modules
                self.watch(Place(name, entries, module, strict))
        self.watch_members()
        self.settings = InterpreterSettings()
        self.take_snapshot_lists()

    def watch(self, watched):
        if isinstance(watched, Place):
            self.places.append(watched)
            self.seen.update({id(watched.entries), id(watched.owner)} - {id(None)})
        else:
            self.sequences.append(watched)
            self.seen.add(id(watched.container))
        return watched

    def watch_members(self) -> None:
        """Watches the dicts, lists, sets, classes (not builtin ones), unlisted modules (as
        `sys.monitoring`) and instances of Python classes (`os.environ`, …) that the watched
        modules hold, and what those hold in turn."""
        todo = list(self.places)
        while todo:
            place = todo.pop()
            for key, value in list(place.entries.items()):
                kind, name = type(value), f"{place.name}.{key}"
                if kind in (dict, list, set):
                    self.mutables.append((place.entries, key, value))
                if id(value) in self.seen:
                    continue
                if kind is dict:
                    self.watch(Place(name, value))
                elif kind in (list, set):
                    self.watch(Sequence(name, value))
                elif kind is types.ModuleType or (isinstance(value, type) and not value.__flags__ & IMMUTABLE_TYPE):
                    entries = vars(value) if kind is types.ModuleType else get_referents(value.__dict__)[0]
                    todo.append(self.watch(Place(name, entries, value, place.strict)))
                elif kind.__flags__ & HEAP_TYPE and type(instance_dict(value)) is dict and not in_plugin(name):
                    todo.append(self.watch(Place(name, instance_dict(value), value, place.strict)))

    def take_snapshot_lists(self) -> None:
        self.containers = [*(p.entries for p in self.places), *(s.container for s in self.sequences)]
        self.dicts = [p.entries for p in self.places if not isinstance(p.owner, type)]
        self.lengths, self.last_keys, self.referents = self.measure()
        owners, keys, values = zip(*self.mutables) if self.mutables else ((), (), ())
        self.mutable_owners, self.mutable_keys, self.mutable_values = list(owners), list(keys), list(values)

    def measure(self) -> tuple:
        """Every watched container's length, the last key of every dict but classes' (a key
        renamed moves to the end), and everything they hold (the values of dicts, and their keys
        but `str` ones) in order, all read in C."""
        guarded, ACTIVE.guarded = ACTIVE.guarded, False  # refused to the completion; no code of its runs in it
        try:
            referents = get_referents(*self.containers)
        finally:
            ACTIVE.guarded = guarded
        last_keys = list(map(next, map(reversed, self.dicts), repeat(None)))
        return list(map(len, self.containers)), last_keys, referents

    def equal(self) -> bool:
        """Whether every watched container holds what it held, as far as `==` can tell."""
        return self.measure() == (self.lengths, self.last_keys, self.referents)

    def mutables_in_place(self) -> bool:
        """Whether the modules and classes still hold the very lists, dicts and sets watched (an
        equal copy would pass `==`)."""
        return all(map(is_, map(dict.get, self.mutable_owners, self.mutable_keys), self.mutable_values))

    @staticmethod
    def impostors_possible() -> bool:
        """Whether a class the completion made (still alive) defines `__eq__`: an instance could
        pass for a watched value by `==`."""
        guarded, ACTIVE.guarded = ACTIVE.guarded, False  # refused to the completion; none of its code runs in it
        try:
            young = get_objects()
        finally:
            ACTIVE.guarded = guarded
        classes = compress(young, map(issubclass, map(type, young), repeat(type)))  # in C
        return any(map(defines_equality, classes))

    def changed(self) -> list:
        """The watched places and sequences that changed."""
        watched = (*self.places, *self.sequences)
        if not self.impostors_possible() and self.mutables_in_place():
            try:
                return [] if self.equal() else [w for w in watched if w.changed(by_identity=False)]
            except Exception:  # noqa: BLE001 - a standard library value's `__eq__` raised
                pass
        return [w for w in watched if w.changed(by_identity=True)]

    def restore(self, doomed: list) -> List[str]:
        """Puts everything back, keeping what it displaced in `doomed` (freed later, under the
        guards); returns the tampering it found. Traps if it cannot (the host then replaces the
        instance): a half-restored interpreter must not score anything."""
        tampering = []
        try:
            changed = self.changed()
            for watched in changed:
                tampering += watched.put_back(doomed)
            if changed:
                self.take_snapshot_lists()
            self.settings.restore()
        except BaseException:  # noqa: BLE001
            hard_exit(70)
        return tampering


# --- Running a completion ---

FREEING_ROUNDS = 3
UNMETERED = 1 << 62


class Row:
    """One group's setup and tests, compiled once for all its completions."""

    def __init__(self, setup: Optional[str], tests: List[str], strict: bool):
        self.strict = strict
        try:
            self.setup = compile_row(setup, strict) if setup else None
        except SyntaxError as e:
            raise ValueError(f"the row's setup code does not compile ({e})")
        self.tests = []
        for test in tests:
            try:
                self.tests.append(compile_row(test, strict))
            except SyntaxError:
                self.tests.append(None)  # an error, whatever the completion


class Judge:
    """Runs completions one by one, each from the pristine state, and puts it back after each."""

    def __init__(self, settings: Settings):
        self.settings = settings
        if ACTIVE.view is None:
            ACTIVE.view = View()
        ACTIVE.view.install()
        if ACTIVE.pristine is None or not (ACTIVE.pristine.mutables_in_place() and ACTIVE.pristine.equal()):
            collect()
            ACTIVE.pristine = Pristine(ACTIVE.view.plugin_modules)
        ACTIVE.view.uninstall()
        collect()
        freeze()  # what exists now is never collected again: freeing a completion's objects is cheap

    def outcomes(self, code: Optional[str], row: Row) -> List[str]:
        """Each test's outcome for one completion's code."""
        if code is None:
            return ["error"] * len(row.tests)
        meter = ACTIVE.meter = Meter(self.settings.max_steps)
        setup_globals, namespace = {"__name__": "__main__"}, {}
        freeze()  # the plugin's objects so far: what `gc` finds young afterwards is the completion's
        ACTIVE.view.install()
        meter.start()
        ACTIVE.guarded = True
        try:
            outcomes = self.run_all(code, row, setup_globals, namespace, meter)
        finally:
            tampering = self.put_back([setup_globals, namespace], meter)
            ACTIVE.guarded = False
            ACTIVE.setup_classes = None
            meter.stop()
            ACTIVE.view.uninstall()
        if tampering and row.strict:
            return ["error"] * len(row.tests)
        return outcomes

    def run_all(self, code: str, row: Row, setup_globals: dict, namespace: dict, meter: Meter) -> List[str]:
        """Runs the setup, the code (in `namespace`, a copy of the setup's globals), then each
        test; returns the tests' outcomes."""
        if row.setup is not None:
            prelude = self.run(row.setup, setup_globals, meter)
            if prelude != "passed":
                raise ValueError(f"the row's setup code does not run ({prelude})")
        if row.strict:
            ACTIVE.setup_classes = SetupClasses(setup_globals)
        namespace.update(setup_globals)
        try:
            compiled = compile(code, COMPLETION_FILE, "exec", dont_inherit=True)
        except BaseException:  # noqa: BLE001 - SyntaxError, MemoryError, RecursionError
            return ["error"] * len(row.tests)
        loaded = self.run(compiled, namespace, meter)
        if loaded != "passed":
            return ["timeout" if loaded == "timeout" else "error"] * len(row.tests)
        test_globals = self.test_globals(namespace, setup_globals) if row.strict else namespace
        return [self.run(test, test_globals, meter) if test is not None else "error" for test in row.tests]

    @staticmethod
    def test_globals(namespace: dict, setup_globals: dict) -> dict:
        """The completion's names but those of builtins, under the setup's names."""
        own, _ = str_entries(namespace)
        own = {k: v for k, v in own.items() if k not in BUILTIN_NAMES}
        return {**own, **setup_globals, "__builtins__": builtins}

    def run(self, code: types.CodeType, namespace: dict, meter: Meter) -> str:
        """Runs one piece in `namespace` on a fresh budget; returns its outcome."""
        meter.restart()
        if getrecursionlimit() < ACTIVE.pristine.settings.recursion_limit:
            setrecursionlimit(ACTIVE.pristine.settings.recursion_limit)
        saved = sys.stdout, sys.stderr, sys.stdin
        sys.stdout = sys.stderr = CappedOutput(self.settings.max_output)
        sys.stdin = io.StringIO()
        try:
            exec(code, namespace)
        except Budget:
            return "timeout"
        except AssertionError:
            return "failed"
        except BaseException:  # noqa: BLE001 - SystemExit, OutputLimit and RecursionError too
            return "error"
        finally:
            sys.stdout, sys.stderr, sys.stdin = saved
        return "passed"

    def put_back(self, doomed: list, meter: Meter) -> List[str]:
        """Frees what the completion left (`doomed`: its globals; its finalizers run under its
        guards, on a fresh budget), restores the pristine state, and again while restoring
        displaced anything (whose finalizers may change the state again); returns the tampering."""
        tampering: List[str] = []
        for _ in range(FREEING_ROUNDS):
            meter.restart()
            self.free(doomed)
            meter.left = UNMETERED  # restoring runs some of the standard library's Python code
            tampering += ACTIVE.pristine.restore(doomed)
            if not doomed:
                return tampering
        ACTIVE.kept_alive.append(doomed)  # finalizers that keep changing the state run no more
        return tampering

    def free(self, doomed: list) -> None:
        """Drops `doomed` and collects cycles: the completion's finalizers run here."""
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = CappedOutput(self.settings.max_output)
        try:
            for item in doomed:
                item.clear()  # breaks the cycles through the completion's globals
            doomed.clear()
            collect()
        except BaseException:  # noqa: BLE001 - a finalizer's Budget or exit
            pass
        finally:
            sys.stdout, sys.stderr = saved


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
            version="0.2.0",
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
        rows = []
        for group in groups:
            try:
                rows.append(Row(*tests_of(group.reference, group.metadata), SETTINGS.strict_asserts))
            except ValueError as e:
                raise Err(PluginError(f"prompt {group.prompt[:60]!r}: {e}"))
        judge = Judge(SETTINGS)  # the pristine state: after the rows are compiled
        scored = []
        for group, row in zip(groups, rows):
            try:
                scored.append([score(judge.outcomes(code_of(c, SETTINGS.extract), row)) for c in group.completions])
            except ValueError as e:
                raise Err(PluginError(f"prompt {group.prompt[:60]!r}: {e}"))
        return scored
