"""`steps-py`: the Python step helper (plugins/python-shared/rein_steps.py) and the tokens a reward
may read, seen from inside a component.

Reads each completion's tokens. Cuts each completion into steps by the `steps` rule of its config
(default `lines`) and scores step k (from 0) k + 1, on its span; the completion gets no score.
Components: `tokens_add_up` (1 when its tokens' texts, joined, are the completion) and
`logprob_sum` (its tokens' log-probabilities, summed).
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.reward_api import CompletionScore, RewardInputs, StepScore
from wit_world.imports.types import Component, PluginError, PluginMetadata

from rein_steps import split

RULE = "lines"


def score_one(completion, tokens):
    steps = [StepScore(s.start, s.end, float(k + 1)) for k, s in enumerate(split(completion, RULE))]
    joined = "".join(t.text for t in tokens)
    components = [
        Component("tokens_add_up", 1.0 if tokens and joined == completion else 0.0),
        Component("logprob_sum", float(sum(t.logprob for t in tokens))),
    ]
    return CompletionScore(None, components, steps)


class RewardApi(exports.RewardApi):
    def metadata(self):
        return PluginMetadata("steps-py", "0.1.0", "scores each step by its place", [])

    def inputs(self):
        return RewardInputs.TOKENS

    def init(self, config):
        global RULE
        values = json.loads(config or "{}")
        try:
            RULE = values.get("steps", "lines")
            split("", RULE)
        except ValueError as e:
            raise Err(PluginError(str(e)))

    def score(self, groups):
        out = []
        for group in groups:
            tokens = group.tokens or [[] for _ in group.completions]
            out.append([score_one(c, t) for c, t in zip(group.completions, tokens)])
        return out
