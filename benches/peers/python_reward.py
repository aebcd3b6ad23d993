"""The `math-answer` reward as a plain Python function called from Python, the way TRL calls
reward functions (`reward_func(completions, **kwargs) -> list[float]`), for
`cargo xtask bench plugins`.

It runs the very code of plugins/math-answer-py/app.py, outside the sandbox: the componentize-py
binding modules that app imports are replaced by plain stand-ins. Standard library only.

Usage: python3 benches/peers/python_reward.py GROUPS.jsonl
Prints {"completions_per_s": ...}, the fastest of three passes over every group.
"""

import collections
import json
import pathlib
import sys
import time
import types


def stand_in_bindings():
    """Modules named like componentize-py's generated bindings, holding plain records."""

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    class Err(Exception):
        def __init__(self, value):
            super().__init__(value)
            self.value = value

    module("componentize_py_types", Err=Err)
    module("wit_world")
    module("wit_world.exports", RewardApi=object)
    module(
        "wit_world.exports.reward_api",
        Component=collections.namedtuple("Component", "name value"),
        CompletionScore=collections.namedtuple("CompletionScore", "score components"),
    )
    module("wit_world.imports")
    module(
        "wit_world.imports.types",
        ConfigKey=collections.namedtuple("ConfigKey", "name description default_value"),
        PluginError=collections.namedtuple("PluginError", "message"),
        PluginMetadata=collections.namedtuple("PluginMetadata", "name version description config_keys"),
    )


def main():
    stand_in_bindings()
    root = pathlib.Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "plugins" / "math-answer-py"))
    import app  # noqa: E402  (after the stand-ins)

    settings = app.Settings.from_config("{}")

    def math_answer_reward(completions, reference, **kwargs):
        """A TRL-style reward function: one float per completion."""
        answer = app.reference_answer(reference)
        return [settings.score_one(c, answer).score for c in completions]

    groups = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8")]
    total = sum(len(g["completions"]) for g in groups)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for g in groups:
            math_answer_reward(g["completions"], g["reference"])
        best = min(best, time.perf_counter() - start)
    print(json.dumps({"completions_per_s": total / best}))


if __name__ == "__main__":
    main()
