// `math-answer-js`: 1 when a completion's final answer equals the reference answer, else 0.
//
// The completion's answer is found with the configured extraction (`auto`: `<answer>` tag,
// then `\boxed{}`, then `####`, then the last number). The reference's answer is its
// `\boxed{}` or `####` part when it has one, else the whole reference. Answers compare
// exactly as rationals when both are numbers (`0.5` = `1/2` = `\frac{1}{2}`), as normalised
// text otherwise. Groups without a reference are "not applicable".
//
// A JavaScript port of the Rust `math-answer` plugin (plugins/math-answer) and of the answer
// helpers it uses (crates/rein-pdk/src/answer.rs and config.rs) with the same semantics, edge
// cases included: the cases in plugins/math-answer-cases.jsonl pass on both. Exact numbers are
// BigInt fractions held to Rust's i128 range, never floats.
//
// Build: componentize-js --wit crates/rein-plugin/wit --world-name reward \
//          --disable http --disable fetch-event -o math-answer-js.wasm app.js

const NAME = "math-answer-js";
const DESCRIPTION =
  "1 when the completion's final answer equals the reference answer (numerically or as normalised text), else 0";
// As the Rust plugin declares them (defaults written as JSON).
const CONFIG_KEYS = [
  {
    name: "extract",
    description: "where the completion's answer is: auto, boxed, hashes, answer, last-number or tag:NAME",
    defaultValue: '"auto"',
  },
  { name: "tolerance", description: "relative tolerance for numeric answers (0 = exact)", defaultValue: "0" },
  { name: "correct_score", description: "score of a correct answer", defaultValue: "1.0" },
  { name: "wrong_score", description: "score of a wrong answer", defaultValue: "0.0" },
  { name: "unanswered_score", description: "score when no answer can be found", defaultValue: "0.0" },
];

// Rust's `char::is_whitespace` (Unicode White_Space). JS's `\s` and `trim()` differ: they take
// U+FEFF and leave U+0085.
const WS = "\\t\\n\\v\\f\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const WHITESPACE_RUNS = new RegExp(`[${WS}]+`, "g");
const LEADING_WHITESPACE = new RegExp(`^[${WS}]+`);
const TRAILING_WHITESPACE = new RegExp(`[${WS}]+$`);
const trim = (s) => s.replace(LEADING_WHITESPACE, "").replace(TRAILING_WHITESPACE, "");

// Only ASCII digits count.
const isDigit = (c) => c !== undefined && c >= "0" && c <= "9";
const ASCII_DIGITS = /^[0-9]*$/;
const LAST_DIGIT = /[0-9][^0-9]*$/;
// What Rust's `str::parse::<f64>` accepts for an unsigned number with an exponent.
const SCIENTIFIC = /^(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][+-]?[0-9]+$/;

// The Rust plugin keeps exact numbers as i128 fractions: checked arithmetic falls back (to a
// float, or to "not a number"), and the few unchecked operations wrap (release builds).
const I128_MAX = (1n << 127n) - 1n;
const wrapI128 = (x) => BigInt.asIntN(128, x);
const fitsI128 = (x) => BigInt.asIntN(128, x) === x;

// --- Extraction ------------------------------------------------------------------------------

/** Parses a config value into `{ kind, tag }`; throws the Rust message when unknown. */
function parseExtraction(name) {
  if (name === "auto" || name === "boxed" || name === "last-number") return { kind: name };
  if (name === "hashes" || name === "####") return { kind: "hashes" };
  if (name === "answer") return { kind: "tag", tag: "answer" };
  if (name.startsWith("tag:") && name.length > "tag:".length) return { kind: "tag", tag: name.slice(4) };
  throw new Error(
    `unknown extraction \`${name}\` (expected auto, boxed, hashes, answer, last-number or tag:NAME)`,
  );
}

/** The final answer in `text` according to `how`, trimmed; null when there is none. */
function extract(text, how) {
  let found;
  switch (how.kind) {
    case "auto":
      // Only "not found" (null) moves on to the next convention: an empty `<answer></answer>`
      // or a `####` at the very end is found, and then trimmed to nothing (unanswered).
      found =
        extractTag(text, "answer") ?? extractBoxed(text) ?? extractAfterHashes(text) ?? extractLastNumber(text);
      break;
    case "boxed":
      found = extractBoxed(text);
      break;
    case "hashes":
      found = extractAfterHashes(text);
      break;
    case "tag":
      found = extractTag(text, how.tag);
      break;
    default:
      found = extractLastNumber(text);
  }
  if (found === null) return null;
  const answer = trim(found);
  return answer === "" ? null : answer;
}

/** The content of the last `\boxed{…}` (or `\fbox{…}`), braces balanced. */
function extractBoxed(text) {
  const starts = ["\\boxed{", "\\fbox{"].filter((m) => text.includes(m)).map((m) => text.lastIndexOf(m) + m.length);
  if (starts.length === 0) return null;
  const start = Math.max(...starts);
  // Only the last opening counts: if it is never closed there is no boxed answer, even when an
  // earlier one was closed.
  let depth = 1;
  for (let i = start; i < text.length; i++) {
    if (text[i] === "{") depth++;
    else if (text[i] === "}" && --depth === 0) return text.slice(start, i);
  }
  return null;
}

/** The text after the last `####`, up to the end of that line (possibly empty). */
function extractAfterHashes(text) {
  const i = text.lastIndexOf("####");
  return i < 0 ? null : text.slice(i + 4).split("\n", 1)[0];
}

/** The content of the last complete `<tag>…</tag>`. */
function extractTag(text, tag) {
  const open = `<${tag}>`;
  const end = text.lastIndexOf(`</${tag}>`);
  if (end < 0) return null;
  const start = text.slice(0, end).lastIndexOf(open);
  return start < 0 ? null : text.slice(start + open.length, end);
}

/** The last number in the text (optionally signed, with digits, `,` separators, a decimal
 * point, or a `/` fraction). */
function extractLastNumber(text) {
  const last = LAST_DIGIT.exec(text);
  if (last === null) return null;
  const end = last.index + 1;
  let start = end - 1;
  while (start > 0) {
    const c = text[start - 1];
    // `,`, `.` and `/` belong to the number only between digits.
    const joinsDigits = (c === "," || c === "." || c === "/") && start >= 2 && isDigit(text[start - 2]);
    if (isDigit(c) || joinsDigits) start--;
    else break;
  }
  if (start > 0 && text[start - 1] === "-") start--;
  return text.slice(start, end);
}

// --- Numbers ---------------------------------------------------------------------------------
//
// A parsed numeric answer is exact, `{ num, den }` (BigInts in lowest terms, den positive,
// within i128), when it came from integers, decimals or fractions that fit; else a JS number.

const isRational = (x) => x !== null && typeof x === "object";

function gcd(a, b) {
  while (b !== 0n) {
    const r = a % b;
    a = b;
    b = r;
  }
  return a;
}

const abs = (x) => (x < 0n ? -x : x);

/** `n / d` reduced, as Rust's `Number::rational` computes it (null when d is 0). */
function rational(n, d) {
  if (d === 0n) return null;
  const g = wrapI128(gcd(abs(n), abs(d))); // a u128 cast to i128
  const sign = d < 0n ? -1n : 1n;
  return { num: wrapI128(sign * n) / g, den: wrapI128(sign * d) / g };
}

// Each side converted, then divided (as Rust's `n as f64 / d as f64`).
const toFloat = (x) => (isRational(x) ? Number(x.num) / Number(x.den) : x);

const negate = (x) => (isRational(x) ? { num: wrapI128(-x.num), den: x.den } : -x);

function divide(n, d) {
  if (isRational(n) && isRational(d)) {
    const num = n.num * d.den;
    const den = n.den * d.num;
    // An overflowing product makes the answer "not a number" (no float fallback).
    if (!fitsI128(num) || !fitsI128(den)) return null;
    return rational(num, den);
  }
  if (toFloat(d) !== 0) return toFloat(n) / toFloat(d);
  return null;
}

const JUNK = ["\\left", "\\right", "\\!", "\\,", "\\;", "\\$", "$", "\\%", "%", "^\\circ", "^{\\circ}"];
const WRAPPERS = ["\\text{", "\\textbf{", "\\mathrm{", "\\mbox{"];
const LATEX = /[\\$%^]/;

/** Normalises an answer for text comparison: drops `$`, `\!`, `\left`/`\right`, `\text{…}`
 * wrappers (keeping their content), all whitespace and trailing periods. Case is kept. */
function normalize(answer) {
  let s = answer;
  // Most answers are plain ("42", "x+1"): skip the LaTeX clean-up for them.
  if (LATEX.test(s)) {
    // In this order, one pass each: `\!` removal can make a new `\left` that stays.
    for (const junk of JUNK) s = s.split(junk).join("");
    for (const wrapper of WRAPPERS) {
      for (let i = s.indexOf(wrapper); i >= 0; i = s.indexOf(wrapper)) {
        const inner = i + wrapper.length;
        const close = s.indexOf("}", inner); // the first `}`: not brace-balanced
        if (close < 0) break;
        s = s.slice(0, i) + s.slice(inner, close) + s.slice(close + 1);
      }
    }
  }
  return s.replace(WHITESPACE_RUNS, "").replace(/\.+$/, "");
}

/** Parses a numeric answer: integers (`1,234`), decimals (`-0.25`), scientific (`1e-3`),
 * fractions (`3/4`, `\frac{3}{4}`, `\dfrac34`), with `$`, `%` and units in `\text{}` ignored. */
const parseNumber = (answer) => parseNormalized(normalize(answer));

function parseNormalized(s) {
  const negative = s.startsWith("-");
  const body = negative || s.startsWith("+") ? s.slice(1) : s;
  let value = parseFractionCommand(body);
  if (value === null) {
    const slash = body.indexOf("/"); // the first `/`
    if (slash >= 0) {
      const n = parsePlain(body.slice(0, slash));
      const d = parsePlain(body.slice(slash + 1));
      value = n === null || d === null ? null : divide(n, d);
    } else {
      value = parsePlain(body);
    }
  }
  if (value === null) return null;
  return negative ? negate(value) : value;
}

/** `\frac{a}{b}`, `\dfrac{a}{b}`, `\tfrac{a}{b}` and the brace-less `\frac34`. */
function parseFractionCommand(s) {
  const command = ["\\frac", "\\dfrac", "\\tfrac"].find((c) => s.startsWith(c));
  if (command === undefined) return null;
  const num = takeArgument(s.slice(command.length));
  if (num === null) return null;
  const den = takeArgument(num[1]);
  if (den === null || den[1] !== "") return null;
  // The arguments are full answers again (normalised, may hold fractions themselves).
  const n = parseNumber(num[0]);
  const d = parseNumber(den[0]);
  return n === null || d === null ? null : divide(n, d);
}

/** One LaTeX argument, `{…}` (balanced) or a single character (code point): [argument, rest]. */
function takeArgument(s) {
  if (s.startsWith("{")) {
    let depth = 1;
    for (let i = 1; i < s.length; i++) {
      if (s[i] === "{") depth++;
      else if (s[i] === "}" && --depth === 0) return [s.slice(1, i), s.slice(i + 1)];
    }
    return null;
  }
  if (s === "") return null;
  const c = String.fromCodePoint(s.codePointAt(0));
  return [c, s.slice(c.length)];
}

/** An unsigned decimal (one sign allowed, `+` before `-`): digits with optional `,` thousands
 * separators, a fractional part and an exponent. */
function parsePlain(s) {
  if (s.startsWith("+")) s = s.slice(1);
  const negative = s.startsWith("-");
  if (negative) s = s.slice(1);
  if (s === "" || !(isDigit(s[0]) || s[0] === ".")) return null;
  if (s.includes(",") && !validThousands(s.split(/[.eE]/, 1)[0])) return null;
  s = s.replaceAll(",", "");
  let value;
  if (s.includes("e") || s.includes("E")) {
    // Scientific notation is never exact; infinities are not numbers.
    if (!SCIENTIFIC.test(s)) return null;
    value = Number(s);
    if (!Number.isFinite(value)) return null;
  } else {
    const dot = s.indexOf(".");
    const [int, frac] = dot < 0 ? [s, ""] : [s.slice(0, dot), s.slice(dot + 1)];
    if (!ASCII_DIGITS.test(int) || !ASCII_DIGITS.test(frac) || int.length + frac.length === 0) return null;
    const digits = (int + frac).replace(/^0+/, "");
    const n = digits.length <= 39 ? BigInt(digits || "0") : null;
    if (n !== null && n <= I128_MAX && frac.length <= 38) {
      value = rational(n, 10n ** BigInt(frac.length));
    } else {
      // Too large or too precise for an i128 fraction: a float (possibly infinite).
      value = Number(s);
    }
  }
  return negative ? negate(value) : value;
}

function validThousands(int) {
  // (Lengths count UTF-16 units, not UTF-8 bytes as in Rust: a group holding anything but
  // ASCII digits makes the number invalid later either way.)
  const [first, ...rest] = int.split(",");
  return first.length > 0 && first.length <= 3 && rest.every((g) => g.length === 3);
}

/** An answer normalised and parsed once (e.g. a group's reference, compared with each of its
 * completions). */
class Answer {
  constructor(answer) {
    this.text = normalize(answer);
    this.number = parseNormalized(this.text);
  }

  /** Same answer: numerically (exact for rationals, within `relativeTolerance` when it is not
   * 0 or either side is a float) if both are numbers, else as normalised text. */
  matches(other, relativeTolerance) {
    const x = this.number;
    const y = other.number;
    if (isRational(x) && isRational(y) && relativeTolerance === 0) {
      return x.num === y.num && x.den === y.den;
    }
    if (x !== null && y !== null) {
      const a = toFloat(x);
      const b = toFloat(y);
      return a === b || Math.abs(a - b) <= relativeTolerance * rustMax(Math.abs(a), Math.abs(b));
    }
    if (x === null && y === null) return this.text !== "" && this.text === other.text;
    return false;
  }
}

// Rust's `f64::max` ignores a NaN operand; `Math.max` returns NaN.
const rustMax = (a, b) => (Number.isNaN(a) ? b : Number.isNaN(b) ? a : Math.max(a, b));

/** The answer the reference gives: its `\boxed{}`, else its `####` part, else all of it. */
function referenceAnswer(reference) {
  return new Answer(extractBoxed(reference) ?? extractAfterHashes(reference) ?? reference);
}

// --- Config (rein-pdk's rules and messages) --------------------------------------------------

// serde_json's map is a BTreeMap: keys in byte (= code point) order, which JS's default
// (UTF-16) sort breaks for characters beyond U+FFFF.
function compareCodePoints(a, b) {
  const [x, y] = [[...a], [...b]];
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const diff = x[i].codePointAt(0) - y[i].codePointAt(0);
    if (diff !== 0) return diff;
  }
  return x.length - y.length;
}

/** A JSON number as serde_json displays it: in full from 1e-5 to 1e16, else `1.5e-7`, `1e+16`.
 * (JSON.parse loses whether it was written `5` or `5.0`: integers are shown as `5`.) */
function numberText(x) {
  if (Number.isInteger(x) && Math.abs(x) < 1e16) return String(x);
  const [mantissa, exponent] = x.toExponential().split("e"); // shortest digits
  const e = Number(exponent);
  if (e >= -5 && e < 16) return String(x);
  return `${mantissa}e${e > 0 ? "+" : ""}${e}`;
}

/** `value` as serde_json displays it: compact, object keys sorted. */
function jsonText(value) {
  if (typeof value === "number") return numberText(value);
  if (Array.isArray(value)) return `[${value.map(jsonText).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const keys = Object.keys(value).sort(compareCodePoints);
    return `{${keys.map((k) => `${JSON.stringify(k)}:${jsonText(value[k])}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

/** The config object; throws rein-pdk's message when it is not one or holds an undeclared key. */
function parseConfig(text) {
  if (trim(text) === "") return {};
  let values;
  try {
    values = JSON.parse(text, (_key, value) => {
      // serde_json rejects numbers beyond f64 (JSON.parse makes them infinite).
      if (typeof value === "number" && !Number.isFinite(value)) throw new Error("number out of range");
      return value;
    });
  } catch (e) {
    throw new Error(`config is not valid JSON: ${e.message}`);
  }
  if (values === null || typeof values !== "object" || Array.isArray(values)) {
    throw new Error(`config must be a JSON object, got ${jsonText(values)}`);
  }
  const accepted = CONFIG_KEYS.map((k) => k.name);
  for (const key of Object.keys(values).sort(compareCodePoints)) {
    if (!accepted.includes(key)) {
      throw new Error(`unknown config key \`${key}\` for plugin \`${NAME}\` (accepted: ${accepted.join(", ")})`);
    }
  }
  return values;
}

const wrongType = (key, expected, got) => new Error(`config key \`${key}\` must be ${expected}, got ${jsonText(got)}`);

function strOr(values, key, fallback) {
  if (!Object.hasOwn(values, key)) return fallback; // an explicit null is a wrong type, not unset
  if (typeof values[key] !== "string") throw wrongType(key, "a string", values[key]);
  return values[key];
}

function f64Or(values, key, fallback) {
  if (!Object.hasOwn(values, key)) return fallback;
  if (typeof values[key] !== "number") throw wrongType(key, "a number", values[key]);
  return values[key];
}

function settingsFromConfig(text) {
  const values = parseConfig(text);
  return {
    extraction: parseExtraction(strOr(values, "extract", "auto")),
    tolerance: f64Or(values, "tolerance", 0),
    correct: f64Or(values, "correct_score", 1),
    wrong: f64Or(values, "wrong_score", 0),
    unanswered: f64Or(values, "unanswered_score", 0),
  };
}

function scoreOne(settings, completion, reference) {
  const answer = extract(completion, settings.extraction);
  if (answer === null) {
    return {
      score: settings.unanswered,
      components: [
        { name: "correct", value: 0 },
        { name: "answered", value: 0 },
      ],
      steps: [],
    };
  }
  const correct = new Answer(answer).matches(reference, settings.tolerance);
  return {
    score: correct ? settings.correct : settings.wrong,
    components: [
      { name: "correct", value: correct ? 1 : 0 },
      { name: "answered", value: 1 },
    ],
    steps: [],
  };
}

function scoreGroup(settings, group) {
  if (group.reference === undefined || group.reference === null) {
    // Not applicable.
    return group.completions.map(() => ({ score: undefined, components: [], steps: [] }));
  }
  const reference = referenceAnswer(group.reference);
  return group.completions.map((c) => scoreOne(settings, c, reference));
}

// --- The component ---------------------------------------------------------------------------

let settings = null;

export const rewardApi = {
  metadata() {
    return { name: NAME, version: "0.1.0", description: DESCRIPTION, configKeys: CONFIG_KEYS };
  },

  inputs() {
    return { tokens: false }; // the text only, not the tokens
  },

  init(config) {
    try {
      settings = settingsFromConfig(config);
    } catch (e) {
      throw { message: e.message }; // the `plugin-error` record
    }
  },

  score(groups) {
    if (settings === null) throw { message: "`score` called before `init`" };
    return groups.map((group) => scoreGroup(settings, group));
  },
};
