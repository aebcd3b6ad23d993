"""Reward plugins: groups of completions in, one score (or ``None``) per completion out."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from . import _native

PluginRef = Union[str, "os.PathLike[str]"]

_BUILTIN_DIR = Path(__file__).with_name("plugins")


def builtin_plugins() -> list[str]:
    """The names of the plugins shipped in this package (``math-answer``, ``cartpole``, …)."""
    if not _BUILTIN_DIR.is_dir():
        return []
    return sorted(p.stem for p in _BUILTIN_DIR.glob("*.wasm"))


def plugin_path(plugin: PluginRef) -> str:
    """The ``.wasm`` file of ``plugin``: a path (anything ending in ``.wasm`` or holding a path
    separator) or the name of a built-in plugin."""
    if not isinstance(plugin, (str, os.PathLike)):
        raise TypeError(f"plugin must be a built-in plugin's name or the path of a .wasm file, got {_kind(plugin)}")
    text = os.fspath(plugin)
    if not isinstance(text, str):
        raise TypeError(f"plugin must be a text path, got {_kind(text)}")
    if text.endswith(".wasm") or os.sep in text or (os.altsep and os.altsep in text):
        if not os.path.isfile(text):
            raise FileNotFoundError(f"no plugin file {text!r}")
        return text
    path = _BUILTIN_DIR / f"{text}.wasm"
    if not path.is_file():
        names = ", ".join(builtin_plugins()) or "none"
        raise ValueError(f"no built-in plugin {text!r} (built in: {names}); or give the path of a .wasm file")
    return str(path)


def config_json(config: Union[None, str, Mapping[str, Any]]) -> str:
    """A plugin config as the JSON object text the sandbox passes to the plugin's ``init``."""
    if config is None:
        return "{}"
    if isinstance(config, str):
        return config
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict, the text of a JSON object, or None; got {_kind(config)}")
    try:
        return json.dumps(dict(config))
    except (TypeError, ValueError) as error:
        raise ValueError(f"config cannot be written as JSON: {error}") from None


def _kind(value: Any) -> str:
    """A value's type, for error messages."""
    return type(value).__name__


class Limits:
    """Sandbox limits for one plugin; ``None`` keeps rein's default (2 s per call, 256 MiB)."""

    __slots__ = ("timeout_ms", "memory_mib", "fuel", "stack_kib")

    def __init__(
        self,
        timeout_ms: Optional[int] = None,
        memory_mib: Optional[int] = None,
        fuel: Optional[int] = None,
        stack_kib: Optional[int] = None,
    ) -> None:
        for name, value in (("timeout_ms", timeout_ms), ("memory_mib", memory_mib), ("fuel", fuel), ("stack_kib", stack_kib)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be a whole number or None, got {_kind(value)}")
            if not 0 <= value < 2**64:
                raise ValueError(f"{name} must be in 0..2**64, got {value}")
        self.timeout_ms = timeout_ms
        self.memory_mib = memory_mib
        self.fuel = fuel
        self.stack_kib = stack_kib

    def kwargs(self) -> dict[str, Optional[int]]:
        return {k: getattr(self, k) for k in self.__slots__}

    def __getstate__(self) -> dict[str, Optional[int]]:
        return self.kwargs()

    def __setstate__(self, state: dict[str, Optional[int]]) -> None:
        for key, value in state.items():
            setattr(self, key, value)


def _groups(groups: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Groups as the sandbox takes them, every value's type checked."""
    if isinstance(groups, (str, bytes, Mapping)) or not isinstance(groups, Sequence):
        raise TypeError(
            f"groups must be a list of dicts like {{'prompt': str, 'completions': [str, ...]}}, got {_kind(groups)}"
        )
    return [_group(group, i) for i, group in enumerate(groups)]


def _group(group: Mapping[str, Any], i: int) -> dict[str, Any]:
    where = f"groups[{i}]"
    if not isinstance(group, Mapping):
        raise TypeError(f"{where} must be a dict with 'completions' (and 'prompt', 'reference', 'metadata'), got {_kind(group)}")
    unknown = set(group) - {"prompt", "completions", "reference", "metadata"}
    if unknown:
        raise ValueError(f"{where} has unknown keys {sorted(unknown)}: expected prompt, completions, reference, metadata")
    if "completions" not in group:
        raise ValueError(f"{where} has no 'completions'")
    completions = group["completions"]
    if isinstance(completions, (str, bytes, Mapping)) or not isinstance(completions, Sequence):
        raise TypeError(f"{where}['completions'] must be a list of strings, got {_kind(completions)}")
    for j, completion in enumerate(completions):
        if not isinstance(completion, str):
            raise TypeError(f"{where}['completions'][{j}] must be a string, got {_kind(completion)}")
    prompt = group.get("prompt", "")
    if not isinstance(prompt, str):
        raise TypeError(f"{where}['prompt'] must be a string, got {_kind(prompt)}")
    reference = group.get("reference")
    # A number is a fine reference (a dataset's answer column); it is passed as its text.
    if reference is not None and (isinstance(reference, bool) or not isinstance(reference, (str, int, float))):
        raise TypeError(f"{where}['reference'] must be a string, a number or None, got {_kind(reference)}")
    metadata = group.get("metadata", "")
    if metadata is None:
        metadata = ""
    elif not isinstance(metadata, str):
        try:
            metadata = json.dumps(metadata)
        except (TypeError, ValueError) as error:
            raise TypeError(f"{where}['metadata'] must be a string or JSON-serialisable: {error}") from None
    return {
        "prompt": prompt,
        "completions": list(completions),
        "reference": None if reference is None else str(reference),
        "metadata": metadata,
    }


class Reward:
    """A reward plugin with its config, loaded into the sandbox.

    ``plugin`` is a ``.wasm`` path or a built-in name; ``config`` a dict (or JSON text) for the
    plugin's ``init``; the limits apply to every call. Scoring releases the GIL. One instance
    scores one batch at a time (calls from several threads queue); a trap, a deadline or a
    memory bomb fails that call with :class:`PluginError` and the next call starts afresh.
    Instances pickle as their recipe (plugin, config, limits) and load again when unpickled.
    """

    def __init__(
        self,
        plugin: PluginRef,
        config: Union[None, str, Mapping[str, Any]] = None,
        *,
        timeout_ms: Optional[int] = None,
        memory_mib: Optional[int] = None,
        fuel: Optional[int] = None,
        stack_kib: Optional[int] = None,
    ) -> None:
        self.path = plugin_path(plugin)
        self.config = config_json(config)
        self.limits = Limits(timeout_ms, memory_mib, fuel, stack_kib)
        self._native = _native.Reward(self.path, self.config, **self.limits.kwargs())

    @property
    def name(self) -> str:
        """The plugin's own name (from its metadata)."""
        return self._native.name

    def score_detailed(self, groups: Sequence[Mapping[str, Any]]) -> list[list[dict[str, Any]]]:
        """Scores groups (``{"prompt", "completions", "reference"?, "metadata"?}``): per group,
        per completion, ``{"score": float | None, "components": {name: value}}``."""
        payload = json.dumps(_groups(groups))
        scored = json.loads(self._native.score_json(payload))
        return [
            [{"score": s["score"], "components": dict(s.get("components", []))} for s in group]
            for group in scored
        ]

    def score(self, groups: Sequence[Mapping[str, Any]]) -> list[list[Optional[float]]]:
        """Scores groups: per group, one score per completion (``None`` where the reward does
        not apply). Raises :class:`PluginError` when the plugin fails."""
        return [[s["score"] for s in group] for group in self.score_detailed(groups)]

    def stdout(self) -> str:
        """The tail of what the plugin printed (for debugging plugins)."""
        return self._native.stdout()

    def __repr__(self) -> str:
        return f"Reward({self.name!r}, path={self.path!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "config": self.config, "limits": self.limits}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self.config = state["config"]
        self.limits = state["limits"]
        self._native = _native.Reward(self.path, self.config, **self.limits.kwargs())


class LazyReward:
    """A :class:`Reward` loaded on first use, in the process that uses it: what the adapters hold,
    so a function made in one process can be pickled to another (TRL's async GRPO, Ray in verl)."""

    def __init__(self, plugin: PluginRef, config: Union[None, str, Mapping[str, Any]], limits: Limits) -> None:
        self.path = plugin_path(plugin)
        self.config = config_json(config)
        self.limits = limits
        self._reward: Optional[Reward] = None
        self._lock = threading.Lock()

    def get(self) -> Reward:
        with self._lock:
            if self._reward is None:
                self._reward = Reward(self.path, self.config, **self.limits.kwargs())
            return self._reward

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "config": self.config, "limits": self.limits}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reward = None
        self._lock = threading.Lock()
