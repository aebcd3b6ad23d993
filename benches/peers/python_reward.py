"""The `math-answer` reward as a plain Python function called from Python, the way TRL calls
reward functions (`reward_func(completions, **kwargs) -> list[float]`), for
`cargo xtask bench plugins`.

It runs the very code of plugins/math-answer-py/app.py, outside the sandbox: the
componentize-py binding modules that app imports (`componentize_py_types`, `wit_world`,
`wit_world.exports.reward_api`, `wit_world.imports.types`, ...) are replaced by stand-ins built
from rein's WIT file (crates/rein-plugin/wit/plugin.wit) the way componentize-py lays them out
for the `reward` world: each exported interface in `wit_world.exports.<name>` (its protocol
class `wit_world.exports.<Name>`), each interface those `use` in `wit_world.imports.<name>`,
every WIT record a dataclass with snake_case fields, every `flags` an `enum.Flag` with
UPPER_CASE members. So when a record moves between
interfaces in the WIT, the stand-ins move with it, and an app that imports it from the old
place fails here as it would fail to build. Standard library only; runs with plain `python3`.

Usage: python3 benches/peers/python_reward.py GROUPS.jsonl [--steps 5] [--warmup 1]
       [--threads N]
GROUPS.jsonl: one {"completions": [...], "reference": "..."} per line.
Prints one JSON object: {"completions_per_s", "median_seconds", "step_seconds", "completions",
"threads", "versions"}: a step is one pass over every group; completions_per_s is the
completions of one pass over the median pass time. Pure Python runs on one thread whatever
`--threads` says ("threads": 1).
"""

import argparse
import dataclasses
import enum
import json
import pathlib
import re
import sys
import time
import types

ROOT = pathlib.Path(__file__).resolve().parents[2]
WIT = ROOT / "crates" / "rein-plugin" / "wit" / "plugin.wit"
APP_DIR = ROOT / "plugins" / "math-answer-py"

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peer_common  # noqa: E402


def _blocks(text, keyword):
    """{name: body} of every `keyword name { body }` at the top level of `text`, braces
    balanced; `///` and `//` comments removed first."""
    text = re.sub(r"//[^\n]*", "", text)
    found = {}
    for match in re.finditer(rf"\b{keyword}\s+([a-z][a-z0-9-]*)\s*\{{", text):
        depth, i = 1, match.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        found[match.group(1)] = text[match.end() : i - 1]
    return found


def _pascal(name):
    return "".join(part.capitalize() for part in name.split("-"))


def _snake(name):
    return name.replace("-", "_")


def parse_wit(path=WIT):
    """The WIT file's interfaces ({name: {"records": {record: [fields]}, "flags": {flags:
    [members]}, "uses": [interface]}})
    and worlds ({name: {"export": [...], "import": [...]}})."""
    text = path.read_text(encoding="utf-8")
    interfaces = {}
    for name, body in _blocks(text, "interface").items():
        records = {
            record: re.findall(r"([a-z][a-z0-9-]*)\s*:", fields)
            for record, fields in _blocks(body, "record").items()
        }
        flags = {
            flag: re.findall(r"([a-z][a-z0-9-]*)\s*,?", members)
            for flag, members in _blocks(body, "flags").items()
        }
        uses = re.findall(r"\buse\s+([a-z][a-z0-9-]*)\.\{", body)
        interfaces[name] = {"records": records, "flags": flags, "uses": uses}
    worlds = {}
    for name, body in _blocks(text, "world").items():
        worlds[name] = {
            "export": re.findall(r"\bexport\s+([a-z][a-z0-9-]*)\s*;", body),
            "import": re.findall(r"\bimport\s+([a-z][a-z0-9-]*)\s*;", body),
        }
    return interfaces, worlds


def stand_in_bindings(world="reward", path=WIT):
    """Installs in sys.modules the modules componentize-py generates for `world` of the WIT
    file at `path`, holding plain dataclasses; returns their names."""
    interfaces, worlds = parse_wit(path)
    if world not in worlds:
        raise RuntimeError(f"{path}: no world `{world}` (found: {', '.join(sorted(worlds))})")
    installed = []

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        installed.append(name)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, m)
        return m

    def records(interface):
        out = {
            _pascal(record): dataclasses.make_dataclass(_pascal(record), [_snake(f) for f in fields])
            for record, fields in interfaces[interface]["records"].items()
        }
        for flag, members in interfaces[interface]["flags"].items():
            out[_pascal(flag)] = enum.Flag(_pascal(flag), [_snake(m).upper() for m in members])
        return out

    class Err(Exception):
        """componentize-py's `Err`: raised with the error case of a `result`."""

        def __init__(self, value):
            super().__init__(value)
            self.value = value

    module("componentize_py_types", Err=Err)
    exported = worlds[world]["export"]
    imported = list(worlds[world]["import"])
    for name in exported:
        for used in interfaces[name]["uses"]:
            if used not in imported and used not in exported:
                imported.append(used)
    module("wit_world")
    # The protocol classes an app subclasses (`class RewardApi(exports.RewardApi)`).
    module("wit_world.exports", **{_pascal(name): object for name in exported})
    for name in exported:
        module(f"wit_world.exports.{_snake(name)}", **records(name))
    module("wit_world.imports")
    for name in imported:
        module(f"wit_world.imports.{_snake(name)}", **records(name))
    return installed


def load_app(app_dir=APP_DIR, world="reward"):
    """Imports plugins/math-answer-py/app.py under the stand-in bindings; returns the module."""
    stand_in_bindings(world)
    sys.path.insert(0, str(app_dir))
    try:
        sys.modules.pop("app", None)
        import app
    finally:
        sys.path.remove(str(app_dir))
    return app


def reward_function(app):
    """The TRL-style reward function over app's default settings."""
    settings = app.Settings.from_config("{}")

    def math_answer_reward(completions, reference, **kwargs):
        """A TRL-style reward function: one float per completion."""
        answer = app.reference_answer(reference)
        return [settings.score_one(c, answer).score for c in completions]

    return math_answer_reward


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("groups", help="JSONL of {completions, reference}")
    peer_common.add_step_arguments(parser, steps=5, what="passes over every group")
    peer_common.add_threads_argument(parser)
    args = parser.parse_args()
    out = peer_common.Stdout()
    app = load_app()
    reward = reward_function(app)
    groups = [json.loads(line) for line in open(args.groups, encoding="utf-8") if line.strip()]
    total = sum(len(g["completions"]) for g in groups)
    times = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        for g in groups:
            reward(g["completions"], g["reference"])
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    median = peer_common.median(times)
    out.emit(
        {
            "completions_per_s": total / median,
            "median_seconds": median,
            "step_seconds": times,
            "completions": total,
            "threads": 1,
            "versions": peer_common.versions(),
        }
    )


if __name__ == "__main__":
    main()
