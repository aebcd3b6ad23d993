"""`judge-rubric-py`: a judge model grades each completion against a rubric, 0 to 10.

A rein reward plugin in Python for the `reward-with-judge` world: it asks the judge model the
recipe grants (`[[reward]] judge = {...}`) one question per completion, all of a group's at
once, and parses the grade from the judge's answer ("Grade: 7" scores 0.7). The parsing stays
here, in the sandbox; the host only runs the model, within the grant's budget.

- An answer without a grade is not applicable (`None`), with the component `ungraded` = 1; the
  judge rambling to its token limit without a grade (`finished` false) is one.
- A request the judge refuses (its budget spent, the judge failing) fails the group with the
  judge's error, which the host counts as a failure of this reward.

Build: componentize-py -d crates/rein-plugin/wit -w reward-with-judge componentize app -o judge-rubric-py.wasm
"""

import json
import re

from componentize_py_types import Err, Ok
from wit_world import exports
from wit_world.exports.reward_api import CompletionScore, RewardInputs
from wit_world.imports import judge
from wit_world.imports.types import Component, ConfigKey, Message, PluginError, PluginMetadata

NAME = "judge-rubric-py"
DESCRIPTION = "a judge model's grade of the completion against a rubric, scaled to 0..1"
RUBRIC = (
    "You grade a student's answer to a question. Give 10 for a correct answer with a clear, "
    "correct explanation, 5 for a correct answer explained badly, 0 for a wrong answer. "
    "Reply with one line: Grade: N"
)
CONFIG_KEYS = [
    ConfigKey("rubric", "the judge's system message", json.dumps(RUBRIC[:24] + "…")),
    ConfigKey("max_new_tokens", "tokens the judge may write per grade", "16"),
]

# componentize-py creates a new `RewardApi` for every call: what `init` sets lives here.
SETTINGS = {"rubric": RUBRIC, "max_new_tokens": 16}

GRADE = re.compile(r"grade\s*[:=]?\s*(\d+(?:\.\d+)?)", re.IGNORECASE)


def parse_config(text):
    """The settings; raises ValueError naming an unknown key or a wrong type."""
    values = json.loads(text) if text.strip() else {}
    if not isinstance(values, dict):
        raise ValueError(f"config must be a JSON object, got {text}")
    accepted = [key.name for key in CONFIG_KEYS]
    for key in sorted(values):
        if key not in accepted:
            raise ValueError(f"unknown config key `{key}` for plugin `{NAME}` (accepted: {', '.join(accepted)})")
    settings = dict(SETTINGS, **values)
    if not isinstance(settings["rubric"], str):
        raise ValueError("config key `rubric` must be a string")
    tokens = settings["max_new_tokens"]
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        raise ValueError(f"config key `max_new_tokens` must be a positive integer, got {json.dumps(tokens)}")
    return settings


def grade(text):
    """The grade in the judge's answer, scaled to 0..1, or None when it gives none."""
    found = GRADE.search(text)
    if found is None:
        return None
    return min(max(float(found.group(1)), 0.0), 10.0) / 10.0


def request(group, completion):
    question = f"Question: {group.prompt}\n"
    if group.reference is not None:
        question += f"Reference answer: {group.reference}\n"
    question += f"Student's answer: {completion}"
    messages = [Message("system", SETTINGS["rubric"]), Message("user", question)]
    return judge.JudgeRequest(messages, SETTINGS["max_new_tokens"], None, ["\n"], 0)


def describe(error):
    """The judge's error in words, naming the limit it hit."""
    kind = type(error).__name__.removeprefix("JudgeError_")
    return f"the judge refused: {kind} ({error.value})"


def score_group(group):
    answers = judge.judge([request(group, c) for c in group.completions])
    scores = []
    for i, answer in enumerate(answers):
        if isinstance(answer, Err):
            raise Err(PluginError(f"completion {i}: {describe(answer.value)}"))
        value = grade(answer.value.text)
        if value is None:
            scores.append(CompletionScore(None, [Component("ungraded", 1.0)], []))
        else:
            scores.append(CompletionScore(value, [Component("ungraded", 0.0)], []))
    return scores


class RewardApi(exports.RewardApi):
    def metadata(self):
        return PluginMetadata(NAME, "0.1.0", DESCRIPTION, CONFIG_KEYS)

    def inputs(self):
        return RewardInputs(0)  # the text only, not the tokens

    def init(self, config):
        global SETTINGS
        try:
            SETTINGS = parse_config(config)
        except ValueError as e:  # json.JSONDecodeError is one too
            raise Err(PluginError(str(e)))

    def score(self, groups):
        return [score_group(group) for group in groups]
