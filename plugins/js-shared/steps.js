// Splitting a completion into steps, for rewards that score each step: JavaScript's
// `rein_pdk::steps`. A plugin imports it as `import { split } from "./js-shared/steps.js"`
// (`cargo xtask build-plugins` builds each JavaScript plugin with `js-shared/` beside its `app.js`).
//
// A step is a span of the completion's characters, counted in Unicode code points (what the host
// and Python count; not JavaScript's UTF-16 string indices). Each rule returns the steps in
// order, without overlaps, each trimmed of the whitespace around it (Rust's
// `char::is_whitespace`), and skips steps that are only whitespace:
//
// - `lines`: each line;
// - `marker:TEXT`: each part that starts at a line beginning with TEXT, optional spaces and a
//   digit (`Step 1:`), the text before the first such line its own step;
// - `delimiter:TEXT`: the parts between occurrences of TEXT (`\n` in TEXT is a newline).
//
// The same cases pass here, in Python (plugins/python-shared/rein_steps.py) and in Rust.

// Rust's `char::is_whitespace` (Unicode White_Space); JS's `trim()` also takes U+FEFF and leaves U+0085.
const WHITESPACE = new Set(
  "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000",
);

/** `{ kind, text }` from a config value; throws an Error naming the value. */
export function parseRule(value) {
  const colon = value.indexOf(":");
  const [kind, text] = colon < 0 ? [value, ""] : [value.slice(0, colon), value.slice(colon + 1)];
  if (value === "lines") return { kind: "lines", text: "" };
  if ((kind === "marker" || kind === "delimiter") && text !== "") {
    return { kind, text: text.replaceAll("\\n", "\n") };
  }
  throw new Error(`steps rule \`${value}\`: expected \`lines\`, \`marker:TEXT\` or \`delimiter:TEXT\``);
}

// The code-point ranges between occurrences of `delimiter` in `chars` (an array of code points).
function pieces(chars, delimiter) {
  const d = Array.from(delimiter);
  const out = [];
  let start = 0;
  for (let i = 0; i + d.length <= chars.length; ) {
    if (d.every((c, k) => chars[i + k] === c)) {
      out.push([start, i]);
      i += d.length;
      start = i;
    } else {
      i += 1;
    }
  }
  out.push([start, chars.length]);
  return out;
}

function beginsStep(chars, at, marker) {
  const m = Array.from(marker);
  if (!m.every((c, k) => chars[at + k] === c)) return false;
  let i = at + m.length;
  while (chars[i] === " ") i += 1;
  return chars[i] !== undefined && chars[i] >= "0" && chars[i] <= "9";
}

/** The steps `{ text, start, end }` of `text` under `rule` (see the top of the file). */
export function split(text, rule = "lines") {
  const { kind, text: arg } = parseRule(rule);
  const chars = Array.from(text);
  let parts;
  if (kind === "lines") {
    parts = pieces(chars, "\n");
  } else if (kind === "delimiter") {
    parts = pieces(chars, arg);
  } else {
    const cuts = [0];
    chars.forEach((c, i) => {
      if (c === "\n" && beginsStep(chars, i + 1, arg)) cuts.push(i + 1);
    });
    cuts.push(chars.length);
    parts = cuts.slice(0, -1).map((c, i) => [c, cuts[i + 1]]);
  }
  const steps = [];
  for (let [start, end] of parts) {
    while (start < end && WHITESPACE.has(chars[start])) start += 1;
    while (end > start && WHITESPACE.has(chars[end - 1])) end -= 1;
    if (start < end) steps.push({ text: chars.slice(start, end).join(""), start, end });
  }
  return steps;
}
