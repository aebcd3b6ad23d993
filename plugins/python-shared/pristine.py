"""Isolation: each unit of foreign code (a completion's, a tool call's) run inside a Python
plugin starts from the same interpreter state, whatever the units before it did.

The state (`Pristine`) is taken by `prepare()`, when there is none yet and whenever something
else than a unit changed it, with the foreign code's view (containment.py) in place; what a
`Unit` changed is put back, as the very objects, when it ends:
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
  - what it left (the `leftovers` given to the unit, what restoring displaced) is freed under its
    guards and on a budget of its own, and what its finalizers change is put back again (three
    rounds; objects whose finalizers still change something stay alive, unfinalized).
Telling what changed is one pass in C comparing every watched entry with its snapshot by `==`,
which only an object whose class defines `__eq__` can fool: when the unit left such a class
alive, or swapped a watched list, dict or set for another, every watched object is compared by
identity instead. Not noticed: a value swapped for an equal one of an immutable builtin type (`1`
for `True`), and a class attribute renamed in a way that keeps the class's values in order (its
last one, say).
`Unit.tampering` names what changed that code relies on: anything added, removed or rebound in
`builtins` or in the plugin's own modules, a function, class or module held by a module loaded
before it rebound (`json.dumps = …`, `math.isclose = …`), a method added to or rebound in a class
such a module holds, a module replaced in `sys.modules`. Data (`sys.stdout`, `sys.path`, …) and
the settings are only put back.
The plugin depends on none of this state: its functions look builtin names up in a private copy
made at import, the `sys`, `gc` and `sys.monitoring` functions it calls are bound at import, and
its modules are out of `sys.modules` while a unit runs. (A fresh sub-interpreter per unit would
be a stronger unit, but componentize-py's CPython 3.14 has no `_interpreters`.)
"""

import atexit
import builtins
import gc
import random
import sys
import types
from gc import collect, freeze, get_objects, get_referents
from itertools import compress, repeat
from operator import is_
from os import _exit as hard_exit
from sys import getrecursionlimit
from typing import Dict, List, Optional, Tuple

from containment import ACTIVE, CappedOutput, Meter, View, claim, in_plugin

# A private copy of the builtins, taken at import (see containment.py).
__builtins__ = dict(builtins.__dict__)

MONITORING = sys.monitoring
get_tool, free_tool_id = MONITORING.get_tool, MONITORING.free_tool_id
clear_tool_id = getattr(MONITORING, "clear_tool_id", lambda tool: None)  # new in 3.14

MISSING = object()
IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: builtin classes nobody can change
HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: classes made by `class` statements


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
        """What changed that code relies on (see the module docstring), given the entries with
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
    """The settings kept outside Python objects: put back after every unit."""

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
    """The interpreter's state as a unit starts (see the module docstring), and putting it back.
    Whether anything changed is one pass in C comparing every watched entry with its snapshot by
    `==`, which only an object whose class defines `__eq__` can fool: when the unit left such a
    class alive (or swapped a mutable value for an equal one), each watched object is compared by
    identity instead."""

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
        self.lengths, self.last_keys, self.referents = self.measure(self.containers, self.dicts)
        own = [p for p in self.places if p.strict or p.name == "sys.modules"]
        self.own_containers = [*(p.entries for p in own), *(s.container for s in self.sequences if in_plugin(s.name))]
        self.own_dicts = [p.entries for p in own if not isinstance(p.owner, type)]
        self.own_measures = self.measure(self.own_containers, self.own_dicts)
        owners, keys, values = zip(*self.mutables) if self.mutables else ((), (), ())
        self.mutable_owners, self.mutable_keys, self.mutable_values = list(owners), list(keys), list(values)

    @staticmethod
    def measure(containers: list, dicts: list) -> tuple:
        """Every container's length, the last key of every dict in `dicts` (a key renamed moves to
        the end), and everything they hold (the values of dicts, and their keys but `str` ones)
        in order, all read in C."""
        guarded, ACTIVE.guarded = ACTIVE.guarded, False  # refused to foreign code; none of it runs in it
        try:
            referents = get_referents(*containers)
        finally:
            ACTIVE.guarded = guarded
        last_keys = list(map(next, map(reversed, dicts), repeat(None)))
        return list(map(len, containers)), last_keys, referents

    def equal(self) -> bool:
        """Whether every watched container holds what it held, as far as `==` can tell."""
        return self.measure(self.containers, self.dicts) == (self.lengths, self.last_keys, self.referents)

    def own_equal(self) -> bool:
        """Whether `builtins`, `sys.modules` and the plugin's own modules (their namespaces,
        classes, and the dicts, lists and sets they hold) hold what they held, as far as `==` can
        tell: a fraction of `equal`'s work."""
        return self.measure(self.own_containers, self.own_dicts) == self.own_measures

    def mutables_in_place(self) -> bool:
        """Whether the modules and classes still hold the very lists, dicts and sets watched (an
        equal copy would pass `==`)."""
        return all(map(is_, map(dict.get, self.mutable_owners, self.mutable_keys), self.mutable_values))

    @staticmethod
    def impostors_possible() -> bool:
        """Whether a class the unit made (still alive) defines `__eq__`: an instance could
        pass for a watched value by `==`."""
        guarded, ACTIVE.guarded = ACTIVE.guarded, False  # refused to foreign code; none of it runs in it
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
        instance): a half-restored interpreter must run nothing more."""
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




# --- Units ---

FREEING_ROUNDS = 3
UNMETERED = 1 << 62


class State:
    """The pristine state and what outlived it (one instance, mutated, never rebound)."""

    def __init__(self):
        self.pristine: Optional[Pristine] = None
        self.kept_alive: list = []  # what finalizers kept changing the state for: never finalized


STATE = State()


def prepare(thorough: bool = True) -> None:
    """Takes the pristine state, unless the one taken is still current (nothing but units changed
    the interpreter since). Call it before a batch of units, after the plugin's own work that
    changes the interpreter (what the units start from). `thorough = False` compares only
    `builtins`, `sys.modules` and the plugin's own modules with the state taken (`own_equal`), for
    a plugin whose own work between units (reading its arguments, componentize-py's glue) changes
    nothing else: anything else it changed would be put back after the next unit."""
    if ACTIVE.view is None:
        ACTIVE.view = View()
    ACTIVE.view.install()
    pristine = STATE.pristine
    if pristine is None or not (
        pristine.mutables_in_place() and pristine.equal() if thorough else pristine.own_equal()
    ):
        collect()
        STATE.pristine = Pristine(ACTIVE.view.plugin_modules)
        ACTIVE.recursion_limit = STATE.pristine.settings.recursion_limit
    ACTIVE.view.uninstall()
    collect()
    freeze()  # what exists now is never collected again: freeing a unit's objects is cheap


class Unit:
    """One unit of foreign code (`with Unit(…):`, after `prepare()`): the guards up, the foreign
    code's view in place and its step meter running (each piece of it runs with
    `containment.run` or `containment.call`); on exit, what it left (`leftovers`: its globals, a
    list of dicts and lists, cleared then) is freed under its guards, on a budget of `max_steps`,
    printing to a sink of `max_output` characters, and the pristine state is put back.
    `tampering` then names what it had changed that code relies on."""

    def __init__(self, max_steps: int, max_output: int, leftovers: list):
        self.meter = Meter(max_steps)
        self.max_output = max_output
        self.leftovers = leftovers
        self.tampering: List[str] = []

    def __enter__(self) -> "Unit":
        ACTIVE.meter = self.meter
        freeze()  # the plugin's objects so far: what `gc` finds young afterwards is the unit's
        ACTIVE.view.install()
        self.meter.start()
        ACTIVE.guarded = True
        return self

    def __exit__(self, *exc_info) -> bool:
        try:
            self.tampering = self.put_back()
        finally:
            ACTIVE.guarded = False
            self.meter.stop()
            ACTIVE.view.uninstall()
        return False

    def put_back(self) -> List[str]:
        """Frees what the unit left (its finalizers run under its guards, on a fresh budget),
        restores the pristine state, and again while restoring displaced anything (whose
        finalizers may change the state again); returns the tampering."""
        doomed, tampering = self.leftovers, []
        self.leftovers = []
        for _ in range(FREEING_ROUNDS):
            self.meter.restart()
            self.free(doomed)
            self.meter.left = UNMETERED  # restoring runs some of the standard library's Python code
            tampering += STATE.pristine.restore(doomed)
            if not doomed:
                return tampering
        STATE.kept_alive.append(doomed)  # finalizers that keep changing the state run no more
        return tampering

    def free(self, doomed: list) -> None:
        """Drops `doomed` and collects cycles: the unit's finalizers run here."""
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = CappedOutput(self.max_output)
        try:
            for item in doomed:
                item.clear()  # breaks the cycles through the unit's globals
            doomed.clear()
            collect()
        except BaseException:  # noqa: BLE001 - a finalizer's Budget or exit
            pass
        finally:
            sys.stdout, sys.stderr = saved


claim()
