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
`containment.IMPORTABLE` (heapq, bisect, math, fractions, decimal, datetime, string, …).

Isolation (plugins/python-shared/pristine.py has every rule). The unit is one completion: each
starts from the same interpreter state (`sys.modules`, the namespace of every loaded module, class
and instance they hold, the contents of their lists, dicts and sets, the interpreter's settings,
`random`'s state), taken when the plugin first scores, again whenever something else than a
completion changed it; what the completion changed is put back, as the very objects, before the
next one runs, and what it left is freed under its guards and budget.

Containment (plugins/python-shared/containment.py has every rule). One completion's misbehaviour
costs only its own score, without the host's `isolate`. While a completion runs (its code, its
tests, its finalizers), its builtins are the `builtins` module's (never the plugin's private
copy); `os._exit`, `os.abort`, `os.kill` raise SystemExit, which like every other
exception ends only the piece (its code, or one test) that raised it; a `sys.monitoring` meter
counts steps (a line started, a jump back within a line) in every Python function but the
plugin's and stops the piece past its budget, whatever it catches: `max_steps` for the code,
`max_steps` for each test, `max_steps` for freeing what it left, so at most
max_steps × (tests + 2) steps a completion; `time.sleep(s)` costs s × 10 000 steps; trace and
profile functions, audit hooks, frames, `gc`'s object lists, new code objects and new builtin
modules are refused. What stays with the host's limits (its deadline and memory cap;
`isolate = true` then scores the others): a loop inside C code, a memory bomb, a native stack
overflow, an interpreter crash (crafted bytecode), and code written to dig into the plugin's own
objects to switch the guards off or to judge its own tests.

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
  - a completion that changes what tests rely on (`pristine.Unit.tampering`) scores "error" on
    every test: adding, removing or rebinding anything in `builtins` or in the plugin's modules,
    rebinding a function, class or module held by a module loaded before it (`json.dumps = …`,
    `math.isclose = …`), adding or rebinding a method of a class such a module holds, or
    replacing a module in `sys.modules`. Data (`sys.stdout`, `sys.path`, …) and the settings are
    only put back.

Build: `cargo xtask build-plugins`, which runs, from this directory, componentize-py -d
crates/rein-plugin/wit -w reward componentize app -p . -p ../python-shared -o code-tests.wasm
"""

import ast
import builtins
import json
import re
import types
import warnings
from typing import List, Optional, Tuple

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.reward_api import CompletionScore, RewardInputs
from wit_world.imports.types import Component, ConfigKey, PluginError, PluginMetadata

import containment
from containment import ACTIVE, Budget, CappedOutput, claim
from pristine import Unit, prepare, str_entries

# The plugin's own functions look builtin names up in this private copy, taken at import: a
# completion that rebinds `builtins.len` or `builtins.AssertionError` changes what its own code
# sees, never what the plugin does.
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


class NotPlain(AssertionError):
    """A compared or truth-tested value in an assert is not a plain Python value (strict asserts)."""




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


class Checks:
    """What `plain` needs while a completion's tests run (one instance, mutated, never rebound)."""

    def __init__(self):
        self.setup_classes: Optional[SetupClasses] = None


CHECKS = Checks()


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
        elif CHECKS.setup_classes is not None and CHECKS.setup_classes.trusts(kind):
            fields = getattr(item, "__dict__", None)
            todo.extend(fields.values() if type(fields) is dict else ())
        else:
            raise NotPlain(f"strict_asserts: a compared value is a `{kind.__qualname__}`, not a plain Python value")
    return value



# --- Running a completion ---

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
    """Runs completions one by one, each a `pristine.Unit`: from the pristine state, put back
    after each."""

    def __init__(self, settings: Settings):
        self.settings = settings
        prepare()

    def outcomes(self, code: Optional[str], row: Row) -> List[str]:
        """Each test's outcome for one completion's code."""
        if code is None:
            return ["error"] * len(row.tests)
        setup_globals, namespace = {"__name__": "__main__"}, {}
        unit = Unit(self.settings.max_steps, self.settings.max_output, [setup_globals, namespace])
        try:
            with unit:
                outcomes = self.run_all(code, row, setup_globals, namespace)
        finally:
            CHECKS.setup_classes = None
        if unit.tampering and row.strict:
            return ["error"] * len(row.tests)
        return outcomes

    def run_all(self, code: str, row: Row, setup_globals: dict, namespace: dict) -> List[str]:
        """Runs the setup, the code (in `namespace`, a copy of the setup's globals), then each
        test; returns the tests' outcomes."""
        if row.setup is not None:
            prelude = self.run(row.setup, setup_globals)
            if prelude != "passed":
                raise ValueError(f"the row's setup code does not run ({prelude})")
        if row.strict:
            CHECKS.setup_classes = SetupClasses(setup_globals)
        namespace.update(setup_globals)
        try:
            compiled = compile(code, COMPLETION_FILE, "exec", dont_inherit=True)
        except BaseException:  # noqa: BLE001 - SyntaxError, MemoryError, RecursionError
            return ["error"] * len(row.tests)
        loaded = self.run(compiled, namespace)
        if loaded != "passed":
            return ["timeout" if loaded == "timeout" else "error"] * len(row.tests)
        test_globals = self.test_globals(namespace, setup_globals) if row.strict else namespace
        return [self.run(test, test_globals) if test is not None else "error" for test in row.tests]

    @staticmethod
    def test_globals(namespace: dict, setup_globals: dict) -> dict:
        """The completion's names but those of builtins, under the setup's names."""
        own, _ = str_entries(namespace)
        own = {k: v for k, v in own.items() if k not in BUILTIN_NAMES}
        return {**own, **setup_globals, "__builtins__": builtins}

    def run(self, code: types.CodeType, namespace: dict) -> str:
        """Runs one piece in `namespace` on a fresh budget; returns its outcome."""
        output = CappedOutput(self.settings.max_output)
        return containment.run(code, namespace, output, outcome_of) or "passed"


def outcome_of(error: BaseException) -> str:
    """The outcome of a piece that raised `error` (as `except` clauses match, by the class's MRO:
    none of the completion's code runs)."""
    if issubclass(type(error), Budget):
        return "timeout"
    if issubclass(type(error), AssertionError):
        return "failed"
    return "error"  # SystemExit, OutputLimit and RecursionError too


def score(outcome: List[str]) -> CompletionScore:
    n = len(outcome)
    shares = [Component(kind, outcome.count(kind) / n) for kind in OUTCOMES]
    return CompletionScore(outcome.count("passed") / n, shares, [])


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

    def inputs(self) -> RewardInputs:
        return RewardInputs(0)  # the text only, not the tokens

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


claim()
