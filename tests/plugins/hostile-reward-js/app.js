// `hostile-reward-js`: the JavaScript twin of tests/plugins/hostile-reward.
//
// Attacks the host when a group's metadata says `{"attack": "..."}` and otherwise behaves: 1
// when a completion equals the reference, else 0. One instance can thus be attacked and then
// asked to score a good batch, showing the host recovered.
//
// Attacks: the Rust plugin's (`infinite-loop`, `memory-bomb`, `deep-recursion`, `panic`,
// `oversized-output`, `nan`, `infinity`, `nan-component`, `wrong-length`, `flood-stdout`,
// `guest-error`) plus `raise`, which throws a value that is neither an Error nor a
// `plugin-error` record; and the clock attacks `spin-on-clock` (a busy loop on `Date.now()`),
// `set-timeout` (a timer an hour away, left pending) and `clock` (the wall clock as the score).
// Its config may name an attack for `init`: `{"attack": "spin-on-clock"}`.
//
// Build: componentize-js --wit crates/rein-plugin/wit --world-name reward \
//          --disable http --disable fetch-event -o hostile-reward-js.wasm app.js

const NAME = "hostile-reward-js";

// Whatever the memory bomb allocated stays reachable from the module, so nothing can free it.
const hoard = [];

/** A plugin error for the current group. */
class Refusal extends Error {}

function recurse(depth) {
  return depth === 0 ? 0 : 1 + recurse(depth - 1);
}

/** The group's `attack`, as rein-pdk's `Group::metadata_json` reads it. */
function attackOf(group) {
  if (group.metadata.trim() === "") return null;
  let metadata;
  try {
    metadata = JSON.parse(group.metadata);
  } catch (e) {
    throw new Refusal(`group metadata is not valid JSON: ${e.message}`);
  }
  const attack = metadata !== null && typeof metadata === "object" ? metadata.attack : undefined;
  return typeof attack === "string" ? attack : null;
}

const scores = (n, make) => Array.from({ length: n }, make);

/** A busy loop on the wall clock for an hour. */
function spinOnClock() {
  const start = Date.now();
  while (Date.now() - start < 3600 * 1000) {}
}

function scoreGroup(group) {
  const n = group.completions.length;
  const attack = attackOf(group);
  switch (attack) {
    case null:
      break;
    case "infinite-loop": {
      let x = 0;
      for (;;) x = (x + 1) | 0;
    }
    case "memory-bomb":
      for (;;) hoard.push(new Uint8Array(1 << 20).fill(1)); // a fresh, filled 1 MiB each time
    case "deep-recursion":
      return scores(n, () => ({ score: recurse(2 ** 40), components: [], steps: [] }));
    case "panic":
      throw new Error("the hostile plugin panics on purpose");
    case "raise":
      throw 42; // not an Error, not a `{ message }` record
    case "oversized-output": {
      // 80 MiB of component names: over the host's 64 MiB output limit.
      const name = "x".repeat(1 << 20);
      const big = { score: 0, components: Array.from({ length: 80 }, (_, i) => ({ name: `${i}${name}`, value: 1 })), steps: [] };
      return [big, ...scores(Math.max(n - 1, 0), () => ({ score: 0, components: [], steps: [] }))];
    }
    case "nan":
      return scores(n, () => ({ score: NaN, components: [], steps: [] }));
    case "infinity":
      return scores(n, () => ({ score: Infinity, components: [], steps: [] }));
    case "nan-component":
      return scores(n, () => ({ score: 0, components: [{ name: "bad", value: NaN }], steps: [] }));
    case "wrong-length":
      return scores(n + 1, () => ({ score: 1, components: [], steps: [] }));
    case "flood-stdout":
      for (let i = 0; i < 100000; i++) console.log(`line ${i} of a chatty plugin`);
      break;
    case "guest-error":
      throw new Refusal("refusing on purpose");
    case "spin-on-clock":
      spinOnClock();
      break;
    case "set-timeout":
      setTimeout(() => hoard.push("late"), 3600 * 1000);
      break;
    case "clock":
      return scores(n, () => ({ score: Date.now() / 1000, components: [{ name: "slept_ns", value: 0 }], steps: [] }));
    default:
      throw new Refusal(`unknown attack \`${attack}\``);
  }
  const reference = group.reference ?? "";
  return group.completions.map((c) => ({ score: c === reference ? 1 : 0, components: [], steps: [] }));
}

export const rewardApi = {
  metadata() {
    return { name: NAME, version: "0.1.0", description: "attacks the host on request", configKeys: [] };
  },

  inputs() {
    return { tokens: false }; // the text only, not the tokens
  },

  init(config) {
    if (config.trim() === "") return;
    let values;
    try {
      values = JSON.parse(config);
    } catch (e) {
      throw { message: `config is not valid JSON: ${e.message}` };
    }
    if (values === null || typeof values !== "object" || Array.isArray(values)) {
      throw { message: `config must be a JSON object, got ${JSON.stringify(values)}` };
    }
    for (const key of Object.keys(values).sort()) {
      if (key !== "attack") {
        throw { message: `unknown config key \`${key}\` for plugin \`${NAME}\` (accepted: attack)` };
      }
    }
    if (values.attack === "spin-on-clock") spinOnClock();
  },

  score(groups) {
    return groups.map((group, i) => {
      try {
        return scoreGroup(group);
      } catch (e) {
        if (e instanceof Refusal) throw { message: `group ${i}: ${e.message}` };
        throw e;
      }
    });
  },
};
