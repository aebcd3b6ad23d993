"""`{{name}}`: asks the judge model the recipe grants whether each completion answers the
question correctly; 1 for "Yes", 0 otherwise.

A rein reward plugin in Python for the `reward-with-judge` world (it imports `judge`).
`cargo xtask build-plugins` compiles it with componentize-py into target/plugins/{{name}}.wasm.
Grant it a judge in the recipe: `judge = { max_new_tokens = 4 }` (the policy's starting
model) or `judge = { model = "<dir>" }`. Its test cases, with the scripted judge's replies,
are in cases.jsonl:

    cargo rein plugin test target/plugins/{{name}}.wasm --cases plugins/{{name}}/cases.jsonl
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.reward_api import CompletionScore, RewardInputs
from wit_world.imports import judge
from wit_world.imports.types import ConfigKey, Message, PluginError, PluginMetadata

NAME = "{{name}}"
DESCRIPTION = "1 when the judge says the completion is correct, else 0"
CONFIG_KEYS = [ConfigKey("rubric", "the judge's system message", '"Reply Yes or No."')]

# componentize-py creates a new `RewardApi` for every call: what `init` sets lives here.
RUBRIC = "Reply Yes or No."


def score_group(group):
    """Asks about every completion at once; a refused request fails the group."""
    requests = [
        judge.JudgeRequest(
            [Message("system", RUBRIC), Message("user", f"Question: {group.prompt}\nAnswer: {c}\nIs the answer correct?")],
            4,  # max_new_tokens
            None,  # temperature: the grant's
            [],  # stop strings
            0,  # top_logprobs
        )
        for c in group.completions
    ]
    scores = []
    for i, verdict in enumerate(judge.judge(requests)):
        if isinstance(verdict, Err):
            raise Err(PluginError(f"completion {i}: the judge refused: {verdict.value}"))
        yes = verdict.value.text.strip().lower().startswith("yes")
        scores.append(CompletionScore(1.0 if yes else 0.0, [], []))
    return scores


class RewardApi(exports.RewardApi):
    def metadata(self):
        return PluginMetadata(NAME, "0.1.0", DESCRIPTION, CONFIG_KEYS)

    def inputs(self):
        return RewardInputs(0)  # the text only, not the tokens

    def init(self, config):
        global RUBRIC
        try:
            values = json.loads(config) if config.strip() else {}
            unknown = sorted(set(values) - {"rubric"})
            if unknown:
                raise ValueError(f"unknown config key `{unknown[0]}` for plugin `{NAME}` (accepted: rubric)")
            RUBRIC = values.get("rubric", RUBRIC)
            if not isinstance(RUBRIC, str):
                raise ValueError("config key `rubric` must be a string")
        except (ValueError, AttributeError) as e:
            raise Err(PluginError(str(e)))

    def score(self, groups):
        return [score_group(group) for group in groups]
