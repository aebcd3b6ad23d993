"""`hostile-reward-py`: the Python twin of tests/plugins/hostile-reward.

Attacks the host when a group's metadata says `{"attack": "..."}` and otherwise behaves: 1 when
a completion equals the reference, else 0. One instance can thus be attacked and then asked to
score a good batch, showing the host recovered.

Attacks: the Rust plugin's (`infinite-loop`, `memory-bomb`, `deep-recursion`, `panic`,
`oversized-output`, `nan`, `infinity`, `nan-component`, `wrong-length`, `flood-stdout`,
`guest-error`) plus `raise`, an uncaught exception that is not a plugin error; and the clock
attacks `sleep` (`time.sleep` for an hour), `spin-on-clock` (a busy loop on `time.monotonic()`)
and `clock` (the wall clock as the score). Its config may name an attack for `init`:
`{"attack": "sleep"}`.

Build: componentize-py -d crates/rein-plugin/wit -w reward componentize app -o hostile-reward-py.wasm
"""

import json
import sys
import time

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.reward_api import CompletionScore, RewardInputs
from wit_world.imports.types import Component, PluginError, PluginMetadata

NAME = "hostile-reward-py"

# Whatever the memory bomb allocated stays reachable from the module, so nothing can free it.
HOARD = []


class Refusal(Exception):
    """A plugin error for the current group."""


def recurse(depth):
    return 0 if depth == 0 else 1 + recurse(depth - 1)


def attack_of(group):
    """The group's `attack`, as rein-pdk's `Group::metadata_json` reads it."""
    if not group.metadata.strip():
        return None
    try:
        metadata = json.loads(group.metadata)
    except ValueError as e:
        raise Refusal(f"group metadata is not valid JSON: {e}") from None
    attack = metadata.get("attack") if isinstance(metadata, dict) else None
    return attack if isinstance(attack, str) else None


def score_group(group):
    n = len(group.completions)
    attack = attack_of(group)
    if attack is None:
        pass
    elif attack == "infinite-loop":
        x = 0
        while True:
            x += 1
    elif attack == "memory-bomb":
        while True:
            HOARD.append(b"\x01" * (1 << 20))  # a fresh, filled 1 MiB object each time
    elif attack == "deep-recursion":
        sys.setrecursionlimit(1 << 30)  # past Python's own guard, towards the real stack
        return [CompletionScore(float(recurse(1 << 40)), [], [])] * n
    elif attack == "panic":
        raise RuntimeError("the hostile plugin panics on purpose")
    elif attack == "raise":
        raise ValueError("the hostile plugin raises on purpose")
    elif attack == "oversized-output":
        # 80 MiB of component names: over the host's 64 MiB output limit.
        name = "x" * (1 << 20)
        big = CompletionScore(0.0, [Component(f"{i}{name}", 1.0) for i in range(80)], [])
        return [big] + [CompletionScore(0.0, [], []) for _ in range(max(n - 1, 0))]
    elif attack == "nan":
        return [CompletionScore(float("nan"), [], []) for _ in range(n)]
    elif attack == "infinity":
        return [CompletionScore(float("inf"), [], []) for _ in range(n)]
    elif attack == "nan-component":
        return [CompletionScore(0.0, [Component("bad", float("nan"))], []) for _ in range(n)]
    elif attack == "wrong-length":
        return [CompletionScore(1.0, [], []) for _ in range(n + 1)]
    elif attack == "flood-stdout":
        for i in range(100_000):
            print(f"line {i} of a chatty plugin")
    elif attack == "guest-error":
        raise Refusal("refusing on purpose")
    elif attack == "sleep":
        time.sleep(3600)
    elif attack == "spin-on-clock":
        start = time.monotonic()
        while time.monotonic() - start < 3600:
            pass
    elif attack == "clock":
        start = time.monotonic()
        time.sleep(0.005)
        slept = time.monotonic() - start
        return [CompletionScore(time.time(), [Component("slept_ns", slept * 1e9)], []) for _ in range(n)]
    else:
        raise Refusal(f"unknown attack `{attack}`")
    reference = group.reference or ""
    return [CompletionScore(1.0 if c == reference else 0.0, [], []) for c in group.completions]


class RewardApi(exports.RewardApi):
    def metadata(self):
        return PluginMetadata(NAME, "0.1.0", "attacks the host on request", [])

    def inputs(self):
        return RewardInputs(0)  # the text only, not the tokens

    def init(self, config):
        if not config.strip():
            return
        try:
            values = json.loads(config)
        except ValueError as e:
            raise Err(PluginError(f"config is not valid JSON: {e}"))
        if not isinstance(values, dict):
            raise Err(PluginError(f"config must be a JSON object, got {json.dumps(values)}"))
        for key in sorted(values):
            if key != "attack":
                raise Err(PluginError(f"unknown config key `{key}` for plugin `{NAME}` (accepted: attack)"))
        if values.get("attack") == "sleep":
            time.sleep(3600)

    def score(self, groups):
        out = []
        for i, group in enumerate(groups):
            try:
                out.append(score_group(group))
            except Refusal as e:
                raise Err(PluginError(f"group {i}: {e}"))
        return out
