// `{{name}}`: 1 when a completion contains the reference answer, else 0.
//
// A rein reward plugin in JavaScript. `cargo xtask build-plugins` compiles it with
// componentize-js into target/plugins/{{name}}.wasm, a component for rein's `reward` world that
// runs in the same sandbox as Rust plugins (no files, no network, memory and time limits per
// call). Its test cases are in cases.jsonl:
//
//     cargo rein plugin test target/plugins/{{name}}.wasm --cases plugins/{{name}}/cases.jsonl

const NAME = "{{name}}";
const DESCRIPTION = "1 when the completion contains the reference answer, else 0";
const CONFIG_KEYS = [{ name: "ignore_case", description: "compare without regard to case", defaultValue: "false" }];

let ignoreCase = false;

/** The config as an object; throws an Error naming an unknown key or a wrong type. */
function parseConfig(text) {
  const values = text.trim() === "" ? {} : JSON.parse(text);
  if (values === null || typeof values !== "object" || Array.isArray(values)) {
    throw new Error(`config must be a JSON object, got ${text}`);
  }
  const accepted = CONFIG_KEYS.map((key) => key.name);
  for (const key of Object.keys(values).sort()) {
    if (!accepted.includes(key)) {
      throw new Error(`unknown config key \`${key}\` for plugin \`${NAME}\` (accepted: ${accepted.join(", ")})`);
    }
  }
  if ("ignore_case" in values && typeof values.ignore_case !== "boolean") {
    throw new Error(`config key \`ignore_case\` must be a boolean, got ${JSON.stringify(values.ignore_case)}`);
  }
  return values;
}

/** One score per completion; none (not applicable) when there is no reference. */
function scoreGroup(group) {
  if (group.reference === undefined) {
    return group.completions.map(() => ({ score: undefined, components: [], steps: [] }));
  }
  const fold = (s) => (ignoreCase ? s.toLowerCase() : s);
  const reference = fold(group.reference);
  return group.completions.map((c) => ({ score: fold(c).includes(reference) ? 1 : 0, components: [], steps: [] }));
}

export const rewardApi = {
  metadata() {
    return { name: NAME, version: "0.1.0", description: DESCRIPTION, configKeys: CONFIG_KEYS };
  },

  inputs() {
    return { tokens: false }; // the text only, not the tokens
  },

  init(config) {
    try {
      ignoreCase = parseConfig(config).ignore_case ?? false;
    } catch (e) {
      throw { message: e.message }; // the `plugin-error` record
    }
  },

  score(groups) {
    return groups.map(scoreGroup);
  },
};
