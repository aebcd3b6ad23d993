"""A rein reward plugin as a TRL reward function.

>>> from rein_sandbox.trl import reward_fn
>>> trainer = GRPOTrainer(..., reward_funcs=[reward_fn("math-answer", timeout_ms=2000)])

The function has TRL's signature, ``f(prompts, completions, completion_ids, **kwargs)``, where
``kwargs`` holds the dataset's other columns; it returns one ``float | None`` per completion.
Completions of the same prompt (TRL lays out each prompt's ``num_generations`` completions one
after another) are scored as one group, so group rewards such as majority vote see them
together. A plugin failure (a trap, a deadline, a memory bomb, an invalid result) never raises:
the failing group's scores are ``None`` (TRL then ignores that reward for those completions) and
a warning names the plugin and the limit.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from ._native import PluginError
from .reward import LazyReward, Limits, PluginRef

logger = logging.getLogger("rein_sandbox")

#: Dataset columns tried, in order, as the reference answer when ``reference_column`` is unset.
REFERENCE_COLUMNS = ("reference", "answer", "solution", "ground_truth")


def _text(item: Any, role: Optional[str]) -> str:
    """A completion or prompt as text: plain text as is; a conversation (a list of
    ``{"role", "content"}`` messages) as its last message of ``role`` (any role when ``None``)."""
    if isinstance(item, str):
        return item
    messages = [m for m in item if role is None or m.get("role") == role] or list(item)
    if not messages:
        return ""
    content = messages[-1].get("content", "")
    if isinstance(content, list):  # multimodal content parts: keep the text ones
        return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    return str(content)


def _completion_text(item: Any) -> str:
    if isinstance(item, str):
        return item
    return "".join(_text([m], None) for m in item if m.get("role", "assistant") == "assistant")


def _metadata(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, default=str)


class RewardFunction:
    """A picklable TRL reward function backed by a sandboxed plugin (see :func:`reward_fn`)."""

    def __init__(
        self,
        plugin: PluginRef,
        config: Union[None, str, Mapping[str, Any]],
        limits: Limits,
        name: Optional[str],
        reference_column: Optional[str],
        metadata_column: Optional[str],
    ) -> None:
        self._reward = LazyReward(plugin, config, limits)
        self.__name__ = name or Path(self._reward.path).stem.replace("-", "_")
        self.__qualname__ = self.__name__
        self.reference_column = reference_column
        self.metadata_column = metadata_column

    def _references(self, n: int, kwargs: Mapping[str, Any]) -> list[Optional[str]]:
        columns = [self.reference_column] if self.reference_column else REFERENCE_COLUMNS
        for column in columns:
            values = kwargs.get(column)
            if values is not None:
                return [None if v is None else str(v) for v in values]
        if self.reference_column:
            raise KeyError(f"{self.__name__}: the batch has no column {self.reference_column!r} (columns: {sorted(kwargs)})")
        return [None] * n

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Optional[Sequence[Any]] = None,
        **kwargs: Any,
    ) -> list[Optional[float]]:
        n = len(completions)
        prompts_text = [_text(p, "user") for p in prompts] if prompts is not None else [""] * n
        texts = [_completion_text(c) for c in completions]
        references = self._references(n, kwargs)
        metadata_values = kwargs.get(self.metadata_column) if self.metadata_column else None
        metadata = [_metadata(v) for v in metadata_values] if metadata_values is not None else [""] * n
        # Runs of the same (prompt, reference, metadata) are one group.
        groups: list[dict[str, Any]] = []
        last_key = None
        for prompt, text, reference, meta in zip(prompts_text, texts, references, metadata):
            key = (prompt, reference, meta)
            if key != last_key:
                groups.append({"prompt": prompt, "completions": [], "reference": reference, "metadata": meta})
                last_key = key
            groups[-1]["completions"].append(text)
        return [score for group in self._score(groups) for score in group]

    def _score(self, groups: list[dict[str, Any]]) -> list[list[Optional[float]]]:
        try:
            reward = self._reward.get()
        except (PluginError, OSError, ValueError) as error:
            logger.warning("%s: cannot load the plugin, every score is None: %s", self.__name__, error)
            return [[None] * len(g["completions"]) for g in groups]
        try:
            return reward.score(groups)
        except PluginError as error:
            if len(groups) == 1:
                logger.warning("%s: the plugin failed, its scores are None: %s", self.__name__, error)
                return [[None] * len(groups[0]["completions"])]
        # Group by group, so one hostile completion costs only its own group's scores.
        scores = []
        for group in groups:
            try:
                scores.extend(reward.score([group]))
            except PluginError as error:
                logger.warning("%s: the plugin failed on a group, its scores are None: %s", self.__name__, error)
                scores.append([None] * len(group["completions"]))
        return scores

    def __repr__(self) -> str:
        return f"<rein reward function {self.__name__} ({self._reward.path})>"


def reward_fn(
    plugin: PluginRef,
    config: Union[None, str, Mapping[str, Any]] = None,
    *,
    name: Optional[str] = None,
    reference_column: Optional[str] = None,
    metadata_column: Optional[str] = "metadata",
    timeout_ms: Optional[int] = None,
    memory_mib: Optional[int] = None,
    fuel: Optional[int] = None,
    stack_kib: Optional[int] = None,
) -> RewardFunction:
    """A TRL reward function running ``plugin`` (a ``.wasm`` path or a built-in name) in the
    sandbox with ``config`` and the given limits.

    ``name`` is its ``__name__`` (TRL logs ``rewards/<name>/mean``; default: the plugin file's
    stem). The reference answer is the dataset column ``reference_column``, or the first of
    ``reference``, ``answer``, ``solution``, ``ground_truth`` present; ``metadata_column`` (a
    dict or JSON text per row) becomes the group's metadata. The plugin is loaded on first call.
    """
    limits = Limits(timeout_ms, memory_mib, fuel, stack_kib)
    return RewardFunction(plugin, config, limits, name, reference_column, metadata_column)
