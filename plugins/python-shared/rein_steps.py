"""Splitting a completion into steps, for rewards that score each step: Python's `rein_pdk::steps`.

A step is a span of the completion's characters (`str` indices: Unicode code points, what the
host counts). Each rule returns the steps in order, without overlaps, each trimmed of the
whitespace around it (Rust's `char::is_whitespace`), and skips steps that are only whitespace:

- `lines`: each line;
- `marker:TEXT`: each part that starts at a line beginning with TEXT, optional spaces and a digit
  (`Step 1:`), the text before the first such line its own step;
- `delimiter:TEXT`: the parts between occurrences of TEXT (`\\n` in TEXT is a newline).

    from rein_steps import split
    for step in split(completion, "lines"):
        steps.append(StepScore(step.start, step.end, 1.0 if check(step.text) else 0.0))

The same cases pass here, in JavaScript (plugins/js-shared/steps.js) and in Rust.
"""

from typing import List, NamedTuple, Tuple

# Rust's `char::is_whitespace` (Unicode White_Space); `str.strip()` also takes U+001C..U+001F.
WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
DIGITS = "0123456789"


class Step(NamedTuple):
    """One step: its trimmed text and its characters `start:end` in the completion."""

    text: str
    start: int
    end: int


def parse_rule(value: str) -> Tuple[str, str]:
    """`(kind, text)` from a config value; raises ValueError naming the value."""
    kind, _, text = value.partition(":")
    if value == "lines":
        return ("lines", "")
    if kind in ("marker", "delimiter") and text:
        return (kind, text.replace("\\n", "\n"))
    raise ValueError(f"steps rule `{value}`: expected `lines`, `marker:TEXT` or `delimiter:TEXT`")


def _pieces(text: str, delimiter: str) -> List[Tuple[int, int]]:
    out, start = [], 0
    while True:
        at = text.find(delimiter, start)
        if at < 0:
            out.append((start, len(text)))
            return out
        out.append((start, at))
        start = at + len(delimiter)


def _begins_step(text: str, at: int, marker: str) -> bool:
    """The line at `at` starts with `marker`, optional spaces and a digit."""
    if not text.startswith(marker, at):
        return False
    i = at + len(marker)
    while i < len(text) and text[i] == " ":
        i += 1
    return i < len(text) and text[i] in DIGITS


def split(text: str, rule: str = "lines") -> List[Step]:
    """The steps of `text` under `rule` (see the module docs)."""
    kind, arg = parse_rule(rule)
    if kind == "lines":
        parts = _pieces(text, "\n")
    elif kind == "delimiter":
        parts = _pieces(text, arg)
    else:
        cuts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n" and _begins_step(text, i + 1, arg)]
        cuts.append(len(text))
        parts = list(zip(cuts, cuts[1:]))
    steps = []
    for start, end in parts:
        part = text[start:end]
        body = part.strip(WHITESPACE)
        if body:
            first = start + len(part) - len(part.lstrip(WHITESPACE))
            steps.append(Step(body, first, first + len(body)))
    return steps
