r"""`math-answer-py`: 1 when a completion's final answer equals the reference answer, else 0.

The completion's answer is found with the configured extraction (`auto`: `<answer>` tag,
then `\boxed{}`, then `####`, then the last number). The reference's answer is its
`\boxed{}` or `####` part when it has one, else the whole reference. Answers compare
exactly as rationals when both are numbers (`0.5` = `1/2` = `\frac{1}{2}`), as normalised
text otherwise. Groups without a reference are "not applicable".

A Python port of the Rust `math-answer` plugin (plugins/math-answer) and of the answer helpers
it uses (crates/rein-pdk/src/answer.rs and config.rs) with the same semantics, edge cases
included: the cases in plugins/math-answer-cases.jsonl pass on both. Pure standard library.

Build: componentize-py -d crates/rein-plugin/wit -w reward componentize app -o math-answer-py.wasm
"""

import json
import math
import re
import sys
from typing import NamedTuple, Optional, Union

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.reward_api import CompletionScore, RewardInputs
from wit_world.imports.types import Component, ConfigKey, PluginError, PluginMetadata

NAME = "math-answer-py"
DESCRIPTION = (
    "1 when the completion's final answer equals the reference answer "
    "(numerically or as normalised text), else 0"
)
# (name, description, default as JSON), as the Rust plugin declares them.
CONFIG_KEYS = [
    (
        "extract",
        "where the completion's answer is: auto, boxed, hashes, answer, last-number or tag:NAME",
        '"auto"',
    ),
    ("tolerance", "relative tolerance for numeric answers (0 = exact)", "0"),
    ("correct_score", "score of a correct answer", "1.0"),
    ("wrong_score", "score of a wrong answer", "0.0"),
    ("unanswered_score", "score when no answer can be found", "0.0"),
]

# Rust's `char::is_whitespace` (Unicode White_Space). Python's `str.isspace`/`strip()` also
# take U+001C..U+001F, and `re`'s `\s` differs again, so the set is spelled out.
WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
WHITESPACE_RUN = re.compile("[" + WHITESPACE + "]+")
# Only ASCII digits count (`str.isdigit` would also accept e.g. `²` or `٣`).
DIGITS = "0123456789"
ASCII_DIGITS = re.compile("[0-9]*")
# What Rust's `str::parse::<f64>` accepts for an unsigned number with an exponent.
SCIENTIFIC = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][+-]?[0-9]+")

# The Rust plugin keeps exact numbers as i128 fractions: checked arithmetic falls back (to a
# float, or to "not a number"), and the few unchecked operations wrap (release builds).
I128_MIN, I128_MAX = -(1 << 127), (1 << 127) - 1


def fits_i128(x: int) -> bool:
    return I128_MIN <= x <= I128_MAX


def wrap_i128(x: int) -> int:
    """`x` as two's-complement i128 arithmetic would leave it."""
    return (x - I128_MIN) % (1 << 128) + I128_MIN


# `\frac` arguments are parsed recursively (three Python frames per level): let nesting go at
# least as deep as the Rust plugin's 512 KiB stack allows (about 1700 levels; Python's default
# 1000 frames stop at about 330). Python-to-Python calls keep their frames on the heap, not on
# the wasm stack.
sys.setrecursionlimit(20_000)


# --- Extraction ---------------------------------------------------------------------------


class Extraction(NamedTuple):
    """Where to look for the final answer: `kind` is auto, boxed, hashes, tag or last-number."""

    kind: str
    tag: str = ""

    @staticmethod
    def parse(name: str) -> "Extraction":
        """Parses a config value; raises `ValueError` with the Rust message when unknown."""
        if name in ("auto", "boxed", "last-number"):
            return Extraction(name)
        if name in ("hashes", "####"):
            return Extraction("hashes")
        if name == "answer":
            return Extraction("tag", "answer")
        if name.startswith("tag:") and len(name) > len("tag:"):
            return Extraction("tag", name[len("tag:") :])
        raise ValueError(
            f"unknown extraction `{name}` "
            "(expected auto, boxed, hashes, answer, last-number or tag:NAME)"
        )


def extract(text: str, how: Extraction) -> Optional[str]:
    """The final answer in `text` according to `how`, trimmed; None when there is none."""
    if how.kind == "auto":
        # Only "not found" moves on to the next convention: an empty `<answer></answer>` or
        # a `####` at the very end is found, and then trimmed to nothing (unanswered).
        found = extract_tag(text, "answer")
        if found is None:
            found = extract_boxed(text)
        if found is None:
            found = extract_after_hashes(text)
        if found is None:
            found = extract_last_number(text)
    elif how.kind == "boxed":
        found = extract_boxed(text)
    elif how.kind == "hashes":
        found = extract_after_hashes(text)
    elif how.kind == "tag":
        found = extract_tag(text, how.tag)
    else:
        found = extract_last_number(text)
    if found is None:
        return None
    return found.strip(WHITESPACE) or None


def extract_boxed(text: str) -> Optional[str]:
    """The content of the last `\\boxed{…}` (or `\\fbox{…}`), braces balanced."""
    starts = [text.rfind(m) + len(m) for m in ("\\boxed{", "\\fbox{") if m in text]
    if not starts:
        return None
    start = max(starts)
    # Only the last opening counts: if it is never closed there is no boxed answer, even when
    # an earlier one was closed.
    depth = 1
    for i in range(start, len(text)):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def extract_after_hashes(text: str) -> Optional[str]:
    """The text after the last `####`, up to the end of that line (possibly empty)."""
    i = text.rfind("####")
    if i < 0:
        return None
    return text[i + 4 :].split("\n", 1)[0]


def extract_tag(text: str, tag: str) -> Optional[str]:
    """The content of the last complete `<tag>…</tag>`."""
    open_, close = f"<{tag}>", f"</{tag}>"
    end = text.rfind(close)
    if end < 0:
        return None
    start = text.rfind(open_, 0, end)
    if start < 0:
        return None
    return text[start + len(open_) : end]


def extract_last_number(text: str) -> Optional[str]:
    """The last number in the text (optionally signed, with digits, `,` separators, a decimal
    point, or a `/` fraction)."""
    end = max(text.rfind(d) for d in DIGITS) + 1
    if end == 0:
        return None
    start = end - 1
    while start > 0:
        c = text[start - 1]
        # `,`, `.` and `/` belong to the number only between digits.
        joins_digits = c in ",./" and start >= 2 and text[start - 2] in DIGITS
        if c in DIGITS or joins_digits:
            start -= 1
        else:
            break
    if start > 0 and text[start - 1] == "-":
        start -= 1
    return text[start:end]


# --- Numbers ------------------------------------------------------------------------------


class Rational(NamedTuple):
    """`num / den` in lowest terms, den positive (both within i128)."""

    num: int
    den: int


# A parsed numeric answer: exact (Rational) when it came from integers, decimals or fractions
# that fit in i128, else a float.
Number = Union[Rational, float]


def rational(n: int, d: int) -> Optional[Rational]:
    """`n / d` reduced, as Rust's `Number::rational` computes it (None when d is 0)."""
    if d == 0:
        return None
    g = wrap_i128(math.gcd(n, d))  # a u128 cast to i128
    sign = -1 if d < 0 else 1
    # The divisions are exact, so Python's floor division equals Rust's truncating one.
    return Rational(wrap_i128(sign * n) // g, wrap_i128(sign * d) // g)


def to_float(x: Number) -> float:
    # Each side converted, then divided (not Python's exactly rounded int / int).
    return float(x.num) / float(x.den) if isinstance(x, Rational) else x


def negate(x: Number) -> Number:
    return Rational(wrap_i128(-x.num), x.den) if isinstance(x, Rational) else -x


def divide(n: Number, d: Number) -> Optional[Number]:
    if isinstance(n, Rational) and isinstance(d, Rational):
        num, den = n.num * d.den, n.den * d.num
        # An overflowing product makes the answer "not a number" (no float fallback).
        if not (fits_i128(num) and fits_i128(den)):
            return None
        return rational(num, den)
    if to_float(d) != 0.0:
        return to_float(n) / to_float(d)
    return None


JUNK = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\$", "$", "\\%", "%", "^\\circ", "^{\\circ}")
WRAPPERS = ("\\text{", "\\textbf{", "\\mathrm{", "\\mbox{")


def normalize(answer: str) -> str:
    """Normalises an answer for text comparison: drops `$`, `\\!`, `\\left`/`\\right`,
    `\\text{…}` wrappers (keeping their content), all whitespace and trailing periods.
    Case is kept."""
    s = answer
    # Most answers are plain ("42", "x+1"): skip the LaTeX clean-up for them.
    if any(c in s for c in "\\$%^"):
        # In this order, one pass each: `\!` removal can make a new `\left` that stays.
        for junk in JUNK:
            s = s.replace(junk, "")
        for wrapper in WRAPPERS:
            while (i := s.find(wrapper)) >= 0:
                inner = i + len(wrapper)
                close = s.find("}", inner)  # the first `}`: not brace-balanced
                if close < 0:
                    break
                s = s[:i] + s[inner:close] + s[close + 1 :]
    return WHITESPACE_RUN.sub("", s).rstrip(".")


def parse_number(answer: str) -> Optional[Number]:
    """Parses a numeric answer: integers (`1,234`), decimals (`-0.25`), scientific (`1e-3`),
    fractions (`3/4`, `\\frac{3}{4}`, `\\dfrac34`), with `$`, `%` and units in `\\text{}`
    ignored."""
    return parse_normalized(normalize(answer))


def parse_normalized(s: str) -> Optional[Number]:
    if s.startswith("-"):
        negative, body = True, s[1:]
    else:
        negative, body = False, s[1:] if s.startswith("+") else s
    value = parse_fraction_command(body)
    if value is None:
        if "/" in body:
            n, _, d = body.partition("/")  # at the first `/`
            n, d = parse_plain(n), parse_plain(d)
            value = None if n is None or d is None else divide(n, d)
        else:
            value = parse_plain(body)
    if value is None:
        return None
    return negate(value) if negative else value


def parse_fraction_command(s: str) -> Optional[Number]:
    """`\\frac{a}{b}`, `\\dfrac{a}{b}`, `\\tfrac{a}{b}` and the brace-less `\\frac34`."""
    for command in ("\\frac", "\\dfrac", "\\tfrac"):
        if s.startswith(command):
            rest = s[len(command) :]
            break
    else:
        return None
    num = take_argument(rest)
    if num is None:
        return None
    den = take_argument(num[1])
    if den is None or den[1]:
        return None
    # The arguments are full answers again (normalised, may hold fractions themselves).
    n, d = parse_number(num[0]), parse_number(den[0])
    if n is None or d is None:
        return None
    return divide(n, d)


def take_argument(s: str) -> Optional[tuple]:
    """One LaTeX argument, `{…}` (balanced) or a single character: (argument, rest)."""
    if s.startswith("{"):
        depth = 1
        for i in range(1, len(s)):
            if s[i] == "{":
                depth += 1
            elif s[i] == "}":
                depth -= 1
                if depth == 0:
                    return s[1:i], s[i + 1 :]
        return None
    return (s[0], s[1:]) if s else None


def parse_plain(s: str) -> Optional[Number]:
    """An unsigned decimal (one sign allowed, `+` before `-`): digits with optional `,`
    thousands separators, a fractional part and an exponent."""
    if s.startswith("+"):
        s = s[1:]
    negative = s.startswith("-")
    if negative:
        s = s[1:]
    if not s or not (s[0] in DIGITS or s[0] == "."):
        return None
    if "," in s and not valid_thousands(re.split("[.eE]", s, maxsplit=1)[0]):
        return None
    s = s.replace(",", "")
    if "e" in s or "E" in s:
        # Scientific notation is never exact; infinities are not numbers.
        if not SCIENTIFIC.fullmatch(s):
            return None
        value = float(s)
        if not math.isfinite(value):
            return None
    else:
        int_part, _, frac = s.partition(".")
        if not (ASCII_DIGITS.fullmatch(int_part) and ASCII_DIGITS.fullmatch(frac)):
            return None
        if not int_part + frac:
            return None
        digits = (int_part + frac).lstrip("0")  # also keeps int() clear of its digit limit
        if len(digits) <= 39 and int(digits or "0") <= I128_MAX and len(frac) <= 38:
            value = rational(int(digits or "0"), 10 ** len(frac))
        else:
            # Too large or too precise for an i128 fraction: a float (possibly infinite).
            value = float(s)
    return negate(value) if negative else value


def valid_thousands(int_part: str) -> bool:
    # (Lengths count characters, not UTF-8 bytes as in Rust: a group holding anything but
    # ASCII digits makes the number invalid later either way.)
    groups = int_part.split(",")
    return 0 < len(groups[0]) <= 3 and all(len(g) == 3 for g in groups[1:])


class Answer:
    """An answer normalised and parsed once (e.g. a group's reference, compared with each of
    its completions)."""

    __slots__ = ("text", "number")

    def __init__(self, answer: str):
        self.text = normalize(answer)
        self.number = parse_normalized(self.text)

    def matches(self, other: "Answer", relative_tolerance: float) -> bool:
        """Same answer: numerically (exact for rationals, within `relative_tolerance` when it
        is not 0 or either side is a float) if both are numbers, else as normalised text."""
        x, y = self.number, other.number
        if isinstance(x, Rational) and isinstance(y, Rational) and relative_tolerance == 0.0:
            return x == y
        if x is not None and y is not None:
            x, y = to_float(x), to_float(y)
            return x == y or abs(x - y) <= relative_tolerance * max(abs(x), abs(y))
        if x is None and y is None:
            return self.text != "" and self.text == other.text
        return False


def reference_answer(reference: str) -> Answer:
    """The answer the reference gives: its `\\boxed{}`, else its `####` part, else all of it."""
    found = extract_boxed(reference)
    if found is None:
        found = extract_after_hashes(reference)
    return Answer(reference if found is None else found)


# --- Config (rein-pdk's rules and messages) -------------------------------------------------


def json_text(value) -> str:
    """`value` as serde_json displays it: compact, keys sorted, floats in full from 1e-5 to
    1e16 and as `1.5e-7` / `1e+16` outside."""
    if isinstance(value, dict):
        items = (f"{json_text(k)}:{json_text(v)}" for k, v in sorted(value.items()))
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(json_text(v) for v in value) + "]"
    if isinstance(value, float):
        # `repr` has the same shortest digits; it switches to exponents below 1e-4 and writes
        # `1.5e-07`.
        mantissa, e, exponent = repr(value).partition("e")
        if not e:
            return mantissa
        exponent = int(exponent)
        if exponent == -5:
            digits = len(mantissa.lstrip("-").replace(".", ""))
            return f"{value:.{digits + 4}f}"
        return f"{mantissa}e{exponent:+d}" if exponent > 0 else f"{mantissa}e{exponent}"
    return json.dumps(value, ensure_ascii=False)


def _finite(parse):
    """A json number hook rejecting what serde_json rejects: numbers beyond f64."""

    def hook(text):
        value = parse(text)
        try:
            if math.isfinite(float(value)):
                return value
        except OverflowError:
            pass
        raise ValueError("number out of range")

    return hook


def _no_constant(name):
    raise ValueError(f"expected value, got {name}")  # NaN / Infinity are not JSON


def parse_config(text: str) -> dict:
    """The config object; raises `ValueError` with rein-pdk's message when it is not one or
    holds an undeclared key."""
    if not text.strip(WHITESPACE):
        return {}
    try:
        values = json.loads(
            text,
            parse_float=_finite(float),
            parse_int=_finite(int),
            parse_constant=_no_constant,
        )
    except ValueError as e:  # also json.JSONDecodeError
        raise ValueError(f"config is not valid JSON: {e}") from None
    if not isinstance(values, dict):
        raise ValueError(f"config must be a JSON object, got {json_text(values)}")
    accepted = [name for name, _, _ in CONFIG_KEYS]
    for key in sorted(values):  # serde_json's map is sorted: the first unknown key in order
        if key not in accepted:
            raise ValueError(
                f"unknown config key `{key}` for plugin `{NAME}` (accepted: {', '.join(accepted)})"
            )
    return values


def _wrong_type(key, expected, got):
    return ValueError(f"config key `{key}` must be {expected}, got {json_text(got)}")


def str_or(values: dict, key: str, default: str) -> str:
    if key not in values:  # an explicit null is a wrong type, not "unset"
        return default
    if not isinstance(values[key], str):
        raise _wrong_type(key, "a string", values[key])
    return values[key]


def f64_or(values: dict, key: str, default: float) -> float:
    if key not in values:
        return default
    value = values[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _wrong_type(key, "a number", value)
    return float(value)


class Settings(NamedTuple):
    extraction: Extraction
    tolerance: float
    correct: float
    wrong: float
    unanswered: float

    @staticmethod
    def from_config(text: str) -> "Settings":
        values = parse_config(text)
        return Settings(
            extraction=Extraction.parse(str_or(values, "extract", "auto")),
            tolerance=f64_or(values, "tolerance", 0.0),
            correct=f64_or(values, "correct_score", 1.0),
            wrong=f64_or(values, "wrong_score", 0.0),
            unanswered=f64_or(values, "unanswered_score", 0.0),
        )

    def score_one(self, completion: str, reference: Answer) -> CompletionScore:
        answer = extract(completion, self.extraction)
        if answer is None:
            return CompletionScore(
                self.unanswered, [Component("correct", 0.0), Component("answered", 0.0)], []
            )
        correct = Answer(answer).matches(reference, self.tolerance)
        return CompletionScore(
            self.correct if correct else self.wrong,
            [Component("correct", 1.0 if correct else 0.0), Component("answered", 1.0)],
            [],
        )

    def score(self, group) -> list:
        if group.reference is None:  # not applicable
            return [CompletionScore(None, [], []) for _ in group.completions]
        reference = reference_answer(group.reference)
        return [self.score_one(c, reference) for c in group.completions]


# --- The component ------------------------------------------------------------------------

# componentize-py makes a new `RewardApi` for every call: the settings live in the module.
SETTINGS: Optional[Settings] = None


class RewardApi(exports.RewardApi):
    def metadata(self) -> PluginMetadata:
        return PluginMetadata(
            name=NAME,
            version="0.1.0",
            description=DESCRIPTION,
            config_keys=[ConfigKey(n, d, default) for n, d, default in CONFIG_KEYS],
        )

    def inputs(self) -> RewardInputs:
        return RewardInputs(0)  # the text only, not the tokens

    def init(self, config: str) -> None:
        global SETTINGS
        try:
            SETTINGS = Settings.from_config(config)
        except ValueError as e:
            raise Err(PluginError(str(e)))

    def score(self, groups) -> list:
        if SETTINGS is None:
            raise Err(PluginError("`score` called before `init`"))
        return [SETTINGS.score(group) for group in groups]
