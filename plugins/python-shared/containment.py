"""Containment: foreign code (a completion's, a tool call's) run inside a Python plugin, whose
misbehaviour ends only the piece of code that misbehaved, never the plugin's call.

A plugin claims its own modules (`claim()` at the end of each; the shared modules and
componentize-py's are claimed already): they are out of `sys.modules` while foreign code runs,
and their lines cost no steps.
While foreign code runs (`ACTIVE.guarded`, set by `pristine.Unit`, which also restores what it
changed; see pristine.py):
  - its builtins are the `builtins` module's (put back after the unit, see pristine.py), never a
    plugin module's private copy;
  - `os._exit`, `os.abort`, `os.kill`, `os.killpg` (and `posix`'s) raise SystemExit; SystemExit,
    KeyboardInterrupt and every other exception end only the piece that raised them (`run` hands
    the exception to the plugin, which `traceback_lines` can write out without the plugin's
    frames);
  - steps: a `sys.monitoring` tool counts one per line started, and one per jump back within a
    line (as `sys.settrace` counts lines), in every Python function but the plugin's, and raises
    `Budget` (a BaseException) on every step past the piece's budget, so no `except` or `finally`
    keeps a loop going;
  - `time.sleep(s)` returns at once, after s × 10 000 steps (1 ms = 10 steps): `time.sleep(3600)`
    ends at the budget, not at the host's deadline; spinning on a clock costs steps like any loop;
  - refused (`Denied`, a RuntimeError; new audit hooks silently): `sys.settrace`, `sys.setprofile`
    and `sys.addaudithook` (their functions would run unmetered), `sys.monitoring`'s setters,
    frames (`sys._getframe`, `sys._current_frames`, `tb_frame`, `gi_frame`, `cr_frame`,
    `ag_frame`), `gc.get_objects`, `gc.get_referrers`, `gc.get_referents`, new code objects
    (`code.__new__`, `code.replace`) and setting a function's `__code__`; builtin modules cannot
    be created or re-created (ImportError: a fresh `posix` would bring `_exit` back; `_signal` and
    `faulthandler` end the process, `select` waits on the clock), so the modules foreign code can
    import are those loaded when the plugin was built (componentize-py's interpreter reads no
    files when it runs): those the plugin and componentize-py use (re, json, typing, collections,
    functools, enum, random, …) and IMPORTABLE below (heapq, bisect, math, fractions, decimal,
    datetime, string, …); a recursion limit it lowered is raised back before each piece;
  - what it prints goes to a `CappedOutput`, which stops it (`OutputLimit`, a BaseException) past
    its cap; its stdin is empty.
What stays with the host's limits (its deadline and memory cap): a loop inside C code
(`sum(range(10**13))`, a huge `str * n`, a backtracking regex), a memory bomb, a native stack
overflow (deeply nested data printed or compared), an interpreter crash (bytecode crafted through
`marshal`), and code written to dig into the plugin's own objects (function `__globals__` /
`__closure__`, `object.__subclasses__()`, objects in C-level caches such as
`functools.lru_cache` or the `abc` registries, the methods of the `sys.stdout` it is given) to
switch the guards off. Nothing outside the sandbox is reachable either way (deny-all WASI: no
files, sockets or processes).

The plugin's own functions look builtin names up in a private copy made at import, and the `sys`
and `sys.monitoring` functions they call are bound at import: foreign code that rebinds
`builtins.len` or `sys.setrecursionlimit` changes what it sees, never what the plugin does.
"""

import builtins
import io
import sys
import types
from io import StringIO
from sys import getrecursionlimit, setrecursionlimit
from typing import List, Optional, Tuple

# The standard library foreign code can import besides what the plugins and componentize-py load:
# componentize-py's interpreter reads no files when it runs, and builtin modules cannot be created
# while foreign code runs, so these are loaded now.
IMPORTABLE = (
    "array", "binascii", "bisect", "cmath", "collections", "copy", "dataclasses", "datetime", "decimal", "fractions",
    "functools", "heapq", "itertools", "math", "operator", "statistics", "string", "struct", "typing", "unicodedata",
    "warnings", "zlib",
)
list(map(__import__, IMPORTABLE))

# A private copy of the builtins, taken at import (see the module docstring).
__builtins__ = dict(builtins.__dict__)

SLEEP_STEPS_PER_SECOND = 10_000


class Budget(BaseException):
    """Raised into the running code when it has used its steps (a BaseException, so that an
    `except Exception:` cannot swallow it; raised again on every later step, so that a bare
    `except:` cannot either)."""


class OutputLimit(BaseException):
    """Raised into the running code when it has printed more than its output's cap."""


class Denied(RuntimeError):
    """What foreign code gets for an operation the guards refuse (a RuntimeError, so that
    `sys.addaudithook` refuses new hooks silently)."""


class CappedOutput(io.TextIOBase):
    """What foreign code prints: counted (and, with `keep`, kept: the first `cap` characters),
    and stopped with OutputLimit past `cap` characters. Only exact `str`s are kept, so nothing of
    the code's outlives the unit through it."""

    def __init__(self, cap: int, keep: bool = False):
        self.size, self.cap, self.keep, self.parts = 0, cap, keep, []

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not issubclass(type(text), str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        text = str.__str__(text)  # an exact str (a subclass's own methods are not called)
        room = self.cap - self.size
        self.size += len(text)
        if self.keep and room > 0:
            self.parts.append(text[:room])
        if self.size > self.cap:
            raise OutputLimit()
        return len(text)

    def cut(self) -> bool:
        """Whether the code printed more than `cap` characters."""
        return self.size > self.cap

    def value(self) -> str:
        """What it printed, up to `cap` characters (with `keep`)."""
        return "".join(self.parts)


class Own:
    """The plugin's own modules (by their top-level package) and source files: out of
    `sys.modules` while foreign code runs, watched strictly by `pristine`, their instances the
    plugin's state (not restored), their lines unmetered."""

    def __init__(self):
        self.packages = {"wit_world", "componentize_py_types", "componentize_py_runtime",
                         "componentize_py_async_support"}
        self.files = set()


OWN = Own()


def claim() -> None:
    """Marks the module that calls it (at its top level, when it is imported) as the plugin's
    own."""
    caller = sys._getframe(1)
    OWN.packages.add(caller.f_globals["__name__"].split(".")[0])
    OWN.files.add(caller.f_code.co_filename)


def in_plugin(name: str) -> bool:
    """Whether `name` (a module's, or a dotted path from one) is in the plugin's own modules."""
    return name.split(".")[0] in OWN.packages


class Active:
    """What the guards need while foreign code runs (one instance, mutated, never rebound)."""

    def __init__(self):
        self.guarded = False  # foreign code runs: the audit hook refuses
        self.meter: Optional["Meter"] = None  # its step budget
        self.view: Optional["View"] = None
        self.recursion_limit = getrecursionlimit()  # raised back to before each piece


ACTIVE = Active()


# --- Guards: what foreign code may not do, and what it sees instead ---

DENIED_EVENTS = frozenset({
    "sys.addaudithook", "sys.settrace", "sys.setprofile", "sys.monitoring.register_callback",
    "sys._getframe", "sys._current_frames", "gc.get_objects", "gc.get_referrers",
    "gc.get_referents", "code.__new__",
})
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})


def audit(event: str, args: tuple) -> None:
    """The plugin's audit hook: refuses, while foreign code runs, what would run its code
    unmetered (trace, profile and audit hooks run with monitoring off), reach the plugin's frames
    and objects, or craft bytecode."""
    if not ACTIVE.guarded:
        return
    if (
        event in DENIED_EVENTS
        or (event == "object.__getattr__" and args[1] in FRAME_ATTRIBUTES)
        or (event == "object.__setattr__" and args[1] == "__code__")
    ):
        raise Denied(f"`{event}` is not available in this sandbox")


sys.addaudithook(audit)

# The step budget is a `sys.monitoring` tool of its own: unlike a `sys.settrace` function, which
# CPython removes from the frame it raised into (so that a loop catching the exception ran on
# unmetered), a monitoring callback stays, and raises again on the loop's next line.
MONITORING = sys.monitoring
BUDGET_TOOL = next(t for t in (5, 4, 3, 2, 1, 0) if MONITORING.get_tool(t) is None)
MONITORING.use_tool_id(BUDGET_TOOL, "rein step budget")
LINE, JUMP, DISABLE = MONITORING.events.LINE, MONITORING.events.JUMP, MONITORING.DISABLE
register_callback, set_events = MONITORING.register_callback, MONITORING.set_events


class Meter:
    """The step budget of the piece running now, kept by a `sys.monitoring` tool's callbacks: a
    step per line started, and per jump back within a line (`while 1: pass`), as `sys.settrace`
    counts lines. The plugin's own lines cost nothing: their events are switched off where they
    fire."""

    def __init__(self, steps: int):
        self.steps = self.left = steps
        self.jumped = False
        self.own_files = OWN.files

    def restart(self) -> None:
        self.left = self.steps

    def charge(self, steps: int) -> None:
        self.left -= steps
        if self.left < 0:
            raise Budget()

    def on_line(self, code, line):
        if code.co_filename in self.own_files:
            return DISABLE
        if self.jumped:  # the jump that led here was the step
            self.jumped = False
            return None
        self.charge(1)

    def on_jump(self, code, source, target):
        if code.co_filename in self.own_files:
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


# What foreign code finds in place of what would end or stall the whole call. Their code is
# compiled apart, with globals of its own: nothing in them leads into the plugin, and their lines
# are metered like the foreign code's (a sleep costs SLEEP_STEPS_PER_SECOND steps a second, spent
# in a loop: nothing to switch off).
STAND_INS_SOURCE = """
def exit_instead(*args, **kwargs):
    raise SystemExit("os._exit, os.abort and os.kill cannot end the process here")

def monitoring_refused(*args, **kwargs):
    raise RuntimeError("sys.monitoring cannot be changed here")

def import_refused(spec_or_module, *args):
    raise ImportError("builtin modules cannot be created or re-created here")

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
    # The builtin modules it may use are loaded already (IMPORTABLE); a fresh `posix` would bring
    # `_exit` back, `_signal` and `faulthandler` end the process, `select` waits on the clock.
    "_imp": dict.fromkeys(("create_builtin", "exec_builtin"), STAND_IN_SCOPE["import_refused"]),
    "sys.monitoring": dict.fromkeys(MONITORING_SETTERS, STAND_IN_SCOPE["monitoring_refused"]),
}


def module_dict(name: str) -> dict:
    """The `__dict__` of a loaded module (or of `sys.monitoring`), or {} when there is none."""
    module = sys.monitoring if name == "sys.monitoring" else sys.modules.get(name)
    return vars(module) if module is not None else {}


class View:
    """What foreign code sees instead of the plugin's interpreter: the stand-ins in place of what
    would end or stall the whole call, and the plugin's modules out of `sys.modules`."""

    def __init__(self):
        self.places = [  # (a module's namespace, a name in it, its stand-in, the original)
            (module_dict(module), name, stand_in, module_dict(module)[name])
            for module, stand_ins in STAND_INS.items() for name, stand_in in stand_ins.items()
            if name in module_dict(module)
        ]
        self.plugin_modules = {name: m for name, m in sys.modules.items() if in_plugin(name)}

    def install(self) -> None:
        for entries, name, stand_in, _ in self.places:
            entries[name] = stand_in
        for name in self.plugin_modules:
            sys.modules.pop(name, None)

    def uninstall(self) -> None:
        for entries, name, _, original in self.places:
            entries[name] = original
        sys.modules.update(self.plugin_modules)


# --- Running a piece of foreign code ---

def call(function, args: tuple, output: CappedOutput, ended=None, fresh_budget: bool = True):
    """`function(*args)` as one piece of foreign code, under the guards (`pristine.Unit`), on a
    fresh budget (or the rest of the last one), printing to `output` with an empty stdin. Returns
    its result, or, when it raised, `ended(the exception)` (None without `ended`): `ended` runs
    before the piece's output is taken down, and the exception is dropped right after it."""
    if fresh_budget:
        ACTIVE.meter.restart()
    if getrecursionlimit() < ACTIVE.recursion_limit:
        setrecursionlimit(ACTIVE.recursion_limit)
    saved = sys.stdout, sys.stderr, sys.stdin
    sys.stdout = sys.stderr = output
    sys.stdin = StringIO()
    try:
        return function(*args)
    except BaseException as error:  # noqa: BLE001 - SystemExit, Budget, OutputLimit: the piece's end
        return None if ended is None else ended(error)
    finally:
        sys.stdout, sys.stderr, sys.stdin = saved


def run(code: types.CodeType, namespace: dict, output: CappedOutput, ended=None):
    """Runs `code` in `namespace` as one piece (see `call`): None, or `ended(the exception that
    ended it)`. Its builtins are the `builtins` module's (watched, put back), never a plugin
    module's private copy, which `exec` would otherwise hand it (the caller's builtins)."""
    if "__builtins__" not in namespace:
        namespace["__builtins__"] = builtins
    return call(exec, (code, namespace), output, ended)


# --- Telling foreign code what ended it ---

CAUSE = BaseException.__dict__["__cause__"]
CONTEXT = BaseException.__dict__["__context__"]
SUPPRESS_CONTEXT = BaseException.__dict__["__suppress_context__"]
TRACEBACK = BaseException.__dict__["__traceback__"]
QUALNAME, MODULE = type.__dict__["__qualname__"], type.__dict__["__module__"]
CAUSED = "The above exception was the direct cause of the following exception:"
DURING = "During handling of the above exception, another exception occurred:"
MOST_CHAINED = 16
RECURSIVE_CUTOFF = 3  # as the traceback module: a frame repeated more times is summarized


def traceback_lines(error: BaseException, sources: dict, output: CappedOutput) -> List[str]:
    """`error`'s traceback as the `traceback` module writes it (its chained exceptions first),
    without the plugin's frames, with the source line of frames in `sources` (file name → its
    lines). Read without giving foreign code the frames or time unmetered: the frames are read
    by the plugin alone; the messages (`str(exception)`, the foreign code's own) run under the
    guards (call it inside a `pristine.Unit`), on one fresh budget for them all, printing to
    `output`."""
    ACTIVE.meter.restart()
    chain, seen, current, header = [], set(), error, None
    while current is not None and id(current) not in seen and len(chain) < MOST_CHAINED:
        seen.add(id(current))
        chain.append((current, header))
        cause, context = CAUSE.__get__(current), CONTEXT.__get__(current)
        if cause is not None:
            current, header = cause, CAUSED
        elif context is not None and not SUPPRESS_CONTEXT.__get__(current):
            current, header = context, DURING
        else:
            current = None
    lines: List[str] = []
    for exception, header in reversed(chain):
        frames = frames_of(TRACEBACK.__get__(exception))
        if frames:
            lines.append("Traceback (most recent call last):")
            lines += frame_lines(frames, sources)
        lines.append(exception_line(exception, output))
        if header is not None:
            lines += ["", header, ""]
    return lines


def frames_of(tb) -> List[Tuple[str, object, str]]:
    """(file, line, function) of each frame a traceback went through, but the plugin's: read
    with the guards down, and no foreign code runs here (exact types, C-level attributes)."""
    frames = []
    guarded, ACTIVE.guarded = ACTIVE.guarded, False
    try:
        while type(tb) is types.TracebackType and len(frames) < 100_000:
            code = tb.tb_frame.f_code
            if code.co_filename not in OWN.files:
                frames.append((code.co_filename, tb.tb_lineno, code.co_name))
            tb = tb.tb_next
    finally:
        ACTIVE.guarded = guarded
    return frames


def frame_lines(frames: list, sources: dict) -> List[str]:
    lines, last, repeated = [], None, 0

    def summarize():
        if repeated > RECURSIVE_CUTOFF:
            more = repeated - RECURSIVE_CUTOFF
            lines.append(f"  [Previous line repeated {more} more time{'s' if more > 1 else ''}]")

    for frame in frames:
        if frame == last:
            repeated += 1
            if repeated > RECURSIVE_CUTOFF:
                continue
        else:
            summarize()
            last, repeated = frame, 1
        file, line, function = frame
        lines.append(f'  File "{file}", line {line}, in {function}')
        source = sources.get(file)
        if source is not None and type(line) is int and 0 < line <= len(source) and source[line - 1].strip():
            lines.append(f"    {source[line - 1].strip()}")
    summarize()
    return lines


def exception_line(exception: BaseException, output: CappedOutput) -> str:
    """`Type: message`, as the traceback module writes it; the message (`str(exception)`) is the
    foreign code's, run as a piece of its own."""
    kind = type(exception)
    name, module = QUALNAME.__get__(kind), MODULE.__get__(kind)
    if type(module) is str and module not in ("__main__", "builtins") and not in_plugin(module):
        name = f"{module}.{name}"
    message = call(str, (exception,), output, fresh_budget=False)
    message = str.__str__(message) if issubclass(type(message), str) else "<exception str() failed>"
    return f"{name}: {message}" if message else name


claim()
