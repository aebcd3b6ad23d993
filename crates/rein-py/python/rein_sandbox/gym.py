"""Environment plugins as Gymnasium environments.

>>> import rein_sandbox.gym
>>> env = rein_sandbox.gym.make("cartpole")              # a gymnasium.Env
>>> envs = rein_sandbox.gym.make_vec("pendulum", num_envs=8)  # a gymnasium.vector.VectorEnv

Observations are ``float32`` arrays in the plugin's ``Box`` space (a ``Discrete`` observation
is an ``int``); actions are an index (``Discrete``) or a ``float32`` array (``Box``). The
vector environment resets an environment within the step its episode ends (Gymnasium's
``AutoresetMode.SAME_STEP``, as Stable-Baselines3): the ended episode's last observation is in
``infos["final_obs"]`` where ``infos["_final_obs"]`` is true.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Union

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from . import _native
from .reward import Limits, PluginRef, config_json, plugin_path


def _space(parts: tuple[str, int, list[float], list[float]]) -> gymnasium.Space:
    kind, n, low, high = parts
    if kind == "discrete":
        return gymnasium.spaces.Discrete(n)
    if kind == "box":
        return gymnasium.spaces.Box(np.array(low, np.float32), np.array(high, np.float32), dtype=np.float32)
    raise ValueError(f"a {kind} space is not a Gymnasium space: text environments run in rein recipes")


def _observation(space: gymnasium.Space, values: Sequence[float]) -> Any:
    if isinstance(space, gymnasium.spaces.Discrete):
        return int(values[0])
    return np.asarray(values, dtype=np.float32)


class SandboxEnv(gymnasium.Env):
    """One environment plugin in the sandbox, as a ``gymnasium.Env`` (see :func:`make`)."""

    metadata = {"render_modes": []}

    def __init__(
        self,
        plugin: PluginRef,
        config: Union[None, str, Mapping[str, Any]] = None,
        limits: Optional[Limits] = None,
    ) -> None:
        self.plugin = plugin_path(plugin)
        self._native = _native.Env(self.plugin, config_json(config), **(limits or Limits()).kwargs())
        self.observation_space = _space(self._native.observation_space())
        self.action_space = _space(self._native.action_space())
        self._discrete = isinstance(self.action_space, gymnasium.spaces.Discrete)

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict[str, Any]] = None):
        super().reset(seed=seed)
        return _observation(self.observation_space, self._native.reset(seed)), {}

    def step(self, action: Any):
        if self._discrete:
            values, reward, terminated, truncated = self._native.step_discrete(int(action))
        else:
            flat = np.asarray(action, dtype=np.float32).reshape(-1).tolist()
            values, reward, terminated, truncated = self._native.step_continuous(flat)
        return _observation(self.observation_space, values), float(reward), terminated, truncated, {}


class SandboxVectorEnv(gymnasium.vector.VectorEnv):
    """``num_envs`` copies of an environment plugin stepped in one call (see :func:`make_vec`)."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(
        self,
        plugin: PluginRef,
        num_envs: int,
        config: Union[None, str, Mapping[str, Any]] = None,
        limits: Optional[Limits] = None,
    ) -> None:
        self.plugin = plugin_path(plugin)
        self._native = _native.VectorEnv(self.plugin, num_envs, config_json(config), **(limits or Limits()).kwargs())
        self.num_envs = num_envs
        self.single_observation_space = _space(self._native.observation_space())
        self.single_action_space = _space(self._native.action_space())
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._discrete = isinstance(self.single_action_space, gymnasium.spaces.Discrete)

    def _observations(self, flat: list[float]) -> np.ndarray:
        values = np.asarray(flat, dtype=np.float32).reshape(self.num_envs, -1)
        if isinstance(self.single_observation_space, gymnasium.spaces.Discrete):
            return values[:, 0].astype(np.int64)
        return values

    def reset(self, *, seed: Union[None, int, Sequence[int]] = None, options: Optional[dict[str, Any]] = None):
        """Resets every environment, environment ``i`` with ``seed + i`` (a list of seeds must
        be consecutive: ``[s, s + 1, …]``)."""
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> 1)
        elif not isinstance(seed, int):
            seeds = list(seed)
            if len(seeds) != self.num_envs or any(s != seeds[0] + i for i, s in enumerate(seeds)):
                raise ValueError(f"seeds must be {self.num_envs} consecutive integers [s, s + 1, …], got {seeds}")
            seed = seeds[0]
        self._np_random, self._np_random_seed = gymnasium.utils.seeding.np_random(seed)
        return self._observations(self._native.reset(seed)), {}

    def step(self, actions: Any):
        if self._discrete:
            step = self._native.step_discrete([int(a) for a in np.asarray(actions).reshape(-1)])
        else:
            step = self._native.step_continuous(np.asarray(actions, dtype=np.float32).reshape(-1).tolist())
        flat, rewards, terminated, truncated, final_flat = step
        terminated = np.array(terminated, dtype=np.bool_)
        truncated = np.array(truncated, dtype=np.bool_)
        infos: dict[str, Any] = {}
        ended = np.flatnonzero(terminated | truncated)
        if len(ended):
            finals = np.asarray(final_flat, dtype=np.float32).reshape(len(ended), -1)
            final_obs = np.full(self.num_envs, None, dtype=object)
            final_info = np.full(self.num_envs, None, dtype=object)
            for row, env in enumerate(ended):
                final_obs[env] = _observation(self.single_observation_space, finals[row])
                final_info[env] = {}
            mask = np.zeros(self.num_envs, dtype=np.bool_)
            mask[ended] = True
            infos = {"final_obs": final_obs, "_final_obs": mask, "final_info": final_info, "_final_info": mask.copy()}
        return self._observations(flat), np.array(rewards, dtype=np.float64), terminated, truncated, infos


def make(
    plugin: PluginRef,
    *,
    timeout_ms: Optional[int] = None,
    memory_mib: Optional[int] = None,
    fuel: Optional[int] = None,
    stack_kib: Optional[int] = None,
    **config: Any,
) -> SandboxEnv:
    """A Gymnasium environment running ``plugin`` (a ``.wasm`` path or a built-in name such as
    ``cartpole``); keyword arguments other than the limits are the plugin's config."""
    return SandboxEnv(plugin, config, Limits(timeout_ms, memory_mib, fuel, stack_kib))


def make_vec(
    plugin: PluginRef,
    num_envs: int,
    *,
    timeout_ms: Optional[int] = None,
    memory_mib: Optional[int] = None,
    fuel: Optional[int] = None,
    stack_kib: Optional[int] = None,
    **config: Any,
) -> SandboxVectorEnv:
    """A Gymnasium vector environment of ``num_envs`` copies of ``plugin``."""
    return SandboxVectorEnv(plugin, num_envs, config, Limits(timeout_ms, memory_mib, fuel, stack_kib))
