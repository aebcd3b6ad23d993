// `steps-js`: the JavaScript step helper (plugins/js-shared/steps.js) and the tokens a reward may
// read, seen from inside a component; the twin of tests/plugins/steps-py.
//
// Reads each completion's tokens. Cuts each completion into steps by the `steps` rule of its
// config (default `lines`) and scores step k (from 0) k + 1, on its span; the completion gets no
// score. Components: `tokens_add_up` (1 when its tokens' texts, joined, are the completion) and
// `logprob_sum` (its tokens' log-probabilities, summed).

import { split } from "./js-shared/steps.js";

let rule = "lines";

function scoreOne(completion, tokens) {
  const steps = split(completion, rule).map((s, k) => ({ start: s.start, end: s.end, score: k + 1 }));
  const joined = tokens.map((t) => t.text).join("");
  return {
    score: undefined,
    components: [
      { name: "tokens_add_up", value: tokens.length > 0 && joined === completion ? 1 : 0 },
      { name: "logprob_sum", value: tokens.reduce((sum, t) => sum + t.logprob, 0) },
    ],
    steps,
  };
}

export const rewardApi = {
  metadata() {
    return { name: "steps-js", version: "0.1.0", description: "scores each step by its place", configKeys: [] };
  },

  inputs() {
    return { tokens: true };
  },

  init(config) {
    const values = JSON.parse(config || "{}");
    try {
      rule = values.steps ?? "lines";
      split("", rule);
    } catch (e) {
      throw { message: e.message };
    }
  },

  score(groups) {
    return groups.map((group) =>
      group.completions.map((c, i) => scoreOne(c, group.tokens.length > 0 ? group.tokens[i] : [])),
    );
  },
};
