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
    text = os.fspath(plugin)
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
    return json.dumps(dict(config))


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


def _group(group: Mapping[str, Any]) -> dict[str, Any]:
    metadata = group.get("metadata", "")
    if metadata is None:
        metadata = ""
    elif not isinstance(metadata, str):
        metadata = json.dumps(metadata)
    reference = group.get("reference")
    unknown = set(group) - {"prompt", "completions", "reference", "metadata"}
    if unknown:
        raise ValueError(f"a group has unknown keys {sorted(unknown)}: expected prompt, completions, reference, metadata")
    return {
        "prompt": str(group.get("prompt", "")),
        "completions": [str(c) for c in group["completions"]],
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
        payload = json.dumps([_group(g) for g in groups])
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
