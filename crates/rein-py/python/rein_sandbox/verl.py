"""A rein reward plugin as verl's ``compute_score``.

In a file named by verl's ``custom_reward_function.path``::

    from rein_sandbox.verl import compute_score_fn
    compute_score = compute_score_fn("math-answer", timeout_ms=2000)

The function takes verl's arguments, ``(data_source, solution_str, ground_truth, extra_info)``,
and returns a float; given lists (verl's batch reward manager) it returns a list. A plugin that
fails never raises: it scores ``failure_score`` (default 0.0; verl needs a number) and a warning
names the plugin and the limit.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from ._native import PluginError
from .reward import LazyReward, Limits, PluginRef

logger = logging.getLogger("rein_sandbox")


def _prompt(extra_info: Any) -> str:
    if isinstance(extra_info, Mapping):
        for key in ("question", "prompt", "problem"):
            if isinstance(extra_info.get(key), str):
                return extra_info[key]
    return ""


class ComputeScore:
    """A picklable verl ``compute_score`` backed by a sandboxed plugin (see :func:`compute_score_fn`)."""

    def __init__(
        self,
        plugin: PluginRef,
        config: Union[None, str, Mapping[str, Any]],
        limits: Limits,
        failure_score: float,
    ) -> None:
        self._reward = LazyReward(plugin, config, limits)
        self.__name__ = Path(self._reward.path).stem.replace("-", "_")
        self.failure_score = failure_score

    def _one(self, solution: Any, ground_truth: Any, extra_info: Any) -> float:
        group = {
            "prompt": _prompt(extra_info),
            "completions": [str(solution)],
            "reference": None if ground_truth is None else str(ground_truth),
        }
        try:
            score = self._reward.get().score([group])[0][0]
        except (PluginError, OSError, ValueError) as error:
            logger.warning("%s: the plugin failed, scoring %s: %s", self.__name__, self.failure_score, error)
            return self.failure_score
        return self.failure_score if score is None else float(score)

    def __call__(
        self,
        data_source: Any,
        solution_str: Any,
        ground_truth: Any,
        extra_info: Any = None,
        **kwargs: Any,
    ) -> Union[float, list[float]]:
        if isinstance(solution_str, (list, tuple)):
            n = len(solution_str)
            truths = ground_truth if isinstance(ground_truth, (list, tuple)) else [ground_truth] * n
            infos = extra_info if isinstance(extra_info, (list, tuple)) else [extra_info] * n
            return [self._one(s, t, e) for s, t, e in zip(solution_str, truths, infos)]
        return self._one(solution_str, ground_truth, extra_info)


def compute_score_fn(
    plugin: PluginRef,
    config: Union[None, str, Mapping[str, Any]] = None,
    *,
    failure_score: float = 0.0,
    timeout_ms: Optional[int] = None,
    memory_mib: Optional[int] = None,
    fuel: Optional[int] = None,
    stack_kib: Optional[int] = None,
) -> ComputeScore:
    """verl's ``compute_score`` running ``plugin`` (a ``.wasm`` path or a built-in name)."""
    return ComputeScore(plugin, config, Limits(timeout_ms, memory_mib, fuel, stack_kib), failure_score)
