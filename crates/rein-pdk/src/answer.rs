//! Finding the final answer in a completion and comparing answers.
//!
//! Extraction follows the conventions math datasets use: `\boxed{…}` (MATH, most reasoning
//! models), `#### …` (GSM8K), `<answer>…</answer>` (R1-style templates). Comparison is exact
//! on rationals where both sides parse as numbers (`0.5`, `1/2`, `\frac{1}{2}`, `-\dfrac12`
//! are all one half; `1,000` is a thousand), and on normalised text otherwise.

/// Where to look for the final answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Extraction {
    /// `<answer>` tag, then `\boxed{}`, then `####`, then the last number in the text.
    Auto,
    /// The last `\boxed{…}`.
    Boxed,
    /// The text after the last `####`, up to the end of its line.
    Hashes,
    /// The content of the last `<tag>…</tag>`.
    Tag(String),
    /// The last number in the text.
    LastNumber,
}

impl Extraction {
    /// Parses a config value: `auto`, `boxed`, `hashes` (or `####`), `last-number`, or
    /// `tag:NAME` (`answer` is `tag:answer`).
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "auto" => Ok(Self::Auto),
            "boxed" => Ok(Self::Boxed),
            "hashes" | "####" => Ok(Self::Hashes),
            "last-number" => Ok(Self::LastNumber),
            "answer" => Ok(Self::Tag("answer".into())),
            _ => match name.strip_prefix("tag:") {
                Some(tag) if !tag.is_empty() => Ok(Self::Tag(tag.into())),
                _ => Err(format!(
                    "unknown extraction `{name}` (expected auto, boxed, hashes, answer, last-number or tag:NAME)"
                )),
            },
        }
    }
}

/// The final answer in `text` according to `how`, trimmed.
pub fn extract<'a>(text: &'a str, how: &Extraction) -> Option<&'a str> {
    let found = match how {
        Extraction::Auto => extract_tag(text, "answer")
            .or_else(|| extract_boxed(text))
            .or_else(|| extract_after_hashes(text))
            .or_else(|| extract_last_number(text)),
        Extraction::Boxed => extract_boxed(text),
        Extraction::Hashes => extract_after_hashes(text),
        Extraction::Tag(tag) => extract_tag(text, tag),
        Extraction::LastNumber => extract_last_number(text),
    };
    found.map(str::trim).filter(|s| !s.is_empty())
}

/// The content of the last `\boxed{…}` (or `\fbox{…}`), braces balanced.
pub fn extract_boxed(text: &str) -> Option<&str> {
    let start = ["\\boxed{", "\\fbox{"]
        .iter()
        .filter_map(|m| text.rfind(m).map(|i| i + m.len()))
        .max()?;
    let mut depth = 1usize;
    for (i, c) in text[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&text[start..start + i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// The text after the last `####`, up to the end of that line.
pub fn extract_after_hashes(text: &str) -> Option<&str> {
    let start = text.rfind("####")? + 4;
    let rest = &text[start..];
    Some(rest.split('\n').next().unwrap_or(rest))
}

/// The content of the last complete `<tag>…</tag>`.
pub fn extract_tag<'a>(text: &'a str, tag: &str) -> Option<&'a str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let end = text.rfind(&close)?;
    let start = text[..end].rfind(&open)? + open.len();
    Some(&text[start..end])
}

/// The last number in the text (optionally signed, with digits, `,` separators, a decimal
/// point, or a `/` fraction).
pub fn extract_last_number(text: &str) -> Option<&str> {
    let bytes = text.as_bytes();
    let mut end = bytes.iter().rposition(u8::is_ascii_digit)? + 1;
    let mut start = end - 1;
    while start > 0 {
        let c = bytes[start - 1];
        let joins_digits = matches!(c, b',' | b'.' | b'/') && start >= 2 && bytes[start - 2].is_ascii_digit();
        if c.is_ascii_digit() || joins_digits {
            start -= 1;
        } else {
            break;
        }
    }
    if start > 0 && bytes[start - 1] == b'-' {
        start -= 1;
    }
    while end > start && !bytes[end - 1].is_ascii_digit() {
        end -= 1;
    }
    Some(&text[start..end])
}

/// A parsed numeric answer: exact when it came from integers, decimals or fractions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// `numerator / denominator` in lowest terms, denominator positive.
    Rational(i128, i128),
    /// A value too large or too precise for an exact rational.
    Float(f64),
}

impl Number {
    /// The value as a float.
    pub fn to_f64(self) -> f64 {
        match self {
            Number::Rational(n, d) => n as f64 / d as f64,
            Number::Float(x) => x,
        }
    }

    fn rational(n: i128, d: i128) -> Option<Number> {
        if d == 0 {
            return None;
        }
        let g = gcd(n.unsigned_abs(), d.unsigned_abs()).max(1) as i128;
        let sign = if d < 0 { -1 } else { 1 };
        Some(Number::Rational(sign * n / g, sign * d / g))
    }
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Normalises an answer for text comparison: drops `$`, `\!`, `\left`/`\right`, `\text{…}`
/// wrappers (keeping their content), spaces and a trailing period.
pub fn normalize(answer: &str) -> String {
    let trimmed = answer.trim();
    // Most answers are plain ("42", "x+1"): skip the LaTeX clean-up for them.
    if !trimmed.contains(['\\', '$', '%', '^']) {
        let s: String = trimmed.chars().filter(|c| !c.is_whitespace()).collect();
        return s.trim_end_matches('.').to_string();
    }
    let mut s = trimmed.to_string();
    for junk in [
        "\\left",
        "\\right",
        "\\!",
        "\\,",
        "\\;",
        "\\$",
        "$",
        "\\%",
        "%",
        "^\\circ",
        "^{\\circ}",
    ] {
        if s.contains(junk) {
            s = s.replace(junk, "");
        }
    }
    for wrapper in ["\\text{", "\\textbf{", "\\mathrm{", "\\mbox{"] {
        while let Some(i) = s.find(wrapper) {
            let inner_start = i + wrapper.len();
            let Some(close) = s[inner_start..].find('}') else { break };
            s = format!(
                "{}{}{}",
                &s[..i],
                &s[inner_start..inner_start + close],
                &s[inner_start + close + 1..]
            );
        }
    }
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    s.trim_end_matches('.').to_string()
}

/// Parses a numeric answer: integers (`1,234`), decimals (`-0.25`), scientific (`1e-3`),
/// fractions (`3/4`, `\frac{3}{4}`, `\dfrac34`), with `$`, `%` and units in `\text{}` ignored.
pub fn parse_number(answer: &str) -> Option<Number> {
    parse_normalized(&normalize(answer))
}

/// [`parse_number`] on an already normalised answer.
fn parse_normalized(s: &str) -> Option<Number> {
    let (negative, body) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let value = parse_fraction_command(body).or_else(|| match body.split_once('/') {
        Some((n, d)) => {
            let (n, d) = (parse_plain(n)?, parse_plain(d)?);
            divide(n, d)
        }
        None => parse_plain(body),
    })?;
    Some(if negative { negate(value) } else { value })
}

fn negate(n: Number) -> Number {
    match n {
        Number::Rational(a, b) => Number::Rational(-a, b),
        Number::Float(x) => Number::Float(-x),
    }
}

fn divide(n: Number, d: Number) -> Option<Number> {
    match (n, d) {
        (Number::Rational(a, b), Number::Rational(c, e)) => {
            Number::rational(a.checked_mul(e)?, b.checked_mul(c)?).or(None)
        }
        _ if d.to_f64() != 0.0 => Some(Number::Float(n.to_f64() / d.to_f64())),
        _ => None,
    }
}

/// `\frac{a}{b}`, `\dfrac{a}{b}`, `\tfrac{a}{b}` and the brace-less `\frac34`.
fn parse_fraction_command(s: &str) -> Option<Number> {
    let rest = ["\\frac", "\\dfrac", "\\tfrac"]
        .iter()
        .find_map(|p| s.strip_prefix(p))?;
    let (num, rest) = take_argument(rest)?;
    let (den, rest) = take_argument(rest)?;
    if !rest.is_empty() {
        return None;
    }
    divide(parse_number(num)?, parse_number(den)?)
}

/// One LaTeX argument: `{…}` (balanced) or a single character.
fn take_argument(s: &str) -> Option<(&str, &str)> {
    if let Some(inner) = s.strip_prefix('{') {
        let mut depth = 1usize;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some((&inner[..i], &inner[i + 1..]));
                    }
                }
                _ => {}
            }
        }
        None
    } else {
        let c = s.chars().next()?;
        Some(s.split_at(c.len_utf8()))
    }
}

/// An unsigned decimal: digits with optional `,` thousands separators, a fractional part and
/// an exponent.
fn parse_plain(s: &str) -> Option<Number> {
    let s = s.strip_prefix('+').unwrap_or(s);
    let (negative, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    if s.is_empty() || !s.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        return None;
    }
    if s.contains(',') && !valid_thousands(s.split(['.', 'e', 'E']).next().unwrap_or("")) {
        return None;
    }
    let s = s.replace(',', "");
    let value = if s.contains(['e', 'E']) {
        Number::Float(s.parse::<f64>().ok().filter(|x| x.is_finite())?)
    } else {
        let (int, frac) = s.split_once('.').unwrap_or((&s, ""));
        if !(int.chars().all(|c| c.is_ascii_digit()) && frac.chars().all(|c| c.is_ascii_digit()))
            || int.len() + frac.len() == 0
        {
            return None;
        }
        let digits = format!("{int}{frac}");
        match (digits.parse::<i128>(), 10i128.checked_pow(frac.len() as u32)) {
            (Ok(n), Some(d)) => Number::rational(n, d)?,
            _ => Number::Float(s.parse::<f64>().ok()?),
        }
    };
    Some(if negative { negate(value) } else { value })
}

fn valid_thousands(int: &str) -> bool {
    let groups: Vec<&str> = int.split(',').collect();
    !groups[0].is_empty() && groups[0].len() <= 3 && groups[1..].iter().all(|g| g.len() == 3)
}

/// An answer prepared for repeated comparison: normalised and parsed once (e.g. a group's
/// reference, compared with each of its completions).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    text: String,
    number: Option<Number>,
}

impl Answer {
    /// Normalises and parses `answer`.
    pub fn new(answer: &str) -> Self {
        let text = normalize(answer);
        let number = parse_normalized(&text);
        Self { text, number }
    }

    /// Whether `self` and `other` are the same answer: numerically (exact for rationals,
    /// within `relative_tolerance` when either side is a float) if both are numbers, otherwise
    /// as normalised text.
    pub fn matches(&self, other: &Answer, relative_tolerance: f64) -> bool {
        match (self.number, other.number) {
            (Some(Number::Rational(p, q)), Some(Number::Rational(r, s))) if relative_tolerance == 0.0 => {
                p == r && q == s
            }
            (Some(x), Some(y)) => {
                let (x, y) = (x.to_f64(), y.to_f64());
                x == y || (x - y).abs() <= relative_tolerance * x.abs().max(y.abs())
            }
            (None, None) => !self.text.is_empty() && self.text == other.text,
            _ => false,
        }
    }
}

/// Whether two answers are the same (see [`Answer::matches`]).
pub fn equivalent(a: &str, b: &str, relative_tolerance: f64) -> bool {
    Answer::new(a).matches(&Answer::new(b), relative_tolerance)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn extraction_follows_each_convention() {
        assert_eq!(extract_boxed(r"so \boxed{\frac{1}{2}} done"), Some(r"\frac{1}{2}"));
        assert_eq!(extract_boxed(r"\boxed{1} then \boxed{2}"), Some("2"));
        assert_eq!(extract_boxed(r"\boxed{unclosed"), None);
        assert_eq!(extract_after_hashes("work\n#### 42\nbye"), Some(" 42"));
        assert_eq!(
            extract_tag("<answer>7</answer> x <answer> 8 </answer>", "answer"),
            Some(" 8 ")
        );
        assert_eq!(extract_tag("<answer>7", "answer"), None);
        assert_eq!(extract_last_number("it costs $1,250.50."), Some("1,250.50"));
        assert_eq!(extract_last_number("x = -3/4, done"), Some("-3/4"));
        assert_eq!(extract_last_number("no digits"), None);
        let auto = Extraction::Auto;
        assert_eq!(extract("<think>2+2</think><answer> 4 </answer>", &auto), Some("4"));
        assert_eq!(extract(r"thus \boxed{4}. #### 5", &auto), Some("4"));
        assert_eq!(extract("so 3 then 5", &auto), Some("5"));
        assert_eq!(extract("<answer>  </answer>", &Extraction::Tag("answer".into())), None);
    }

    #[test]
    fn extraction_names_parse() {
        assert_eq!(Extraction::parse("####"), Ok(Extraction::Hashes));
        assert_eq!(Extraction::parse("tag:final"), Ok(Extraction::Tag("final".into())));
        assert!(
            Extraction::parse("magic")
                .unwrap_err()
                .contains("unknown extraction `magic`")
        );
    }

    #[test]
    fn numbers_parse_exactly() {
        assert_eq!(parse_number("1,000"), Some(Number::Rational(1000, 1)));
        assert_eq!(parse_number("0.50"), Some(Number::Rational(1, 2)));
        assert_eq!(parse_number(r"-\dfrac{2}{4}"), Some(Number::Rational(-1, 2)));
        assert_eq!(parse_number(r"\frac34"), Some(Number::Rational(3, 4)));
        assert_eq!(parse_number(r"\$12"), Some(Number::Rational(12, 1)));
        assert_eq!(parse_number(r"45\%"), Some(Number::Rational(45, 1)));
        assert_eq!(parse_number(r"5 \text{ cm}"), None);
        assert_eq!(parse_number("1/0"), None);
        assert_eq!(parse_number("1,00"), None);
        assert_eq!(parse_number("abc"), None);
        assert_eq!(parse_number("1e3"), Some(Number::Float(1000.0)));
    }

    #[test]
    fn equivalence_is_numeric_then_textual() {
        assert!(equivalent("0.5", r"\frac{1}{2}", 0.0));
        assert!(equivalent("1,000", "1000", 0.0));
        assert!(!equivalent("0.333", "1/3", 0.0));
        assert!(equivalent("0.333333333", "1/3", 1e-6));
        assert!(equivalent(r"x^2 + 1", "x^2+1", 0.0));
        assert!(equivalent(r"\text{Paris}", "Paris.", 0.0));
        assert!(!equivalent("2", "two", 0.0));
        assert!(!equivalent("", "", 0.0));
    }

    proptest! {
        #[test]
        fn integers_round_trip_through_every_format(n in -1_000_000i64..1_000_000) {
            let plain = n.to_string();
            prop_assert_eq!(parse_number(&plain), Some(Number::Rational(n as i128, 1)));
            let boxed = format!(r"The answer is \boxed{{{n}}}.");
            prop_assert_eq!(extract(&boxed, &Extraction::Auto), Some(plain.as_str()));
            let hashes = format!("steps...\n#### {n}");
            prop_assert_eq!(extract(&hashes, &Extraction::Auto), Some(plain.as_str()));
            let tagged = format!("<think>{}</think><answer>{n}</answer>", n / 2);
            prop_assert_eq!(extract(&tagged, &Extraction::Auto), Some(plain.as_str()));
            let prose = format!("first {} then {n}", n.wrapping_mul(7));
            prop_assert_eq!(extract(&prose, &Extraction::LastNumber), Some(plain.as_str()));
        }

        #[test]
        fn fractions_equal_their_decimals(p in -500i64..500, q in 1i64..500) {
            let fraction = format!("{p}/{q}");
            let latex = if p < 0 { format!(r"-\frac{{{}}}{{{q}}}", -p) } else { format!(r"\frac{{{p}}}{{{q}}}") };
            prop_assert!(equivalent(&fraction, &latex, 0.0));
            let decimal = (p as f64 / q as f64).to_string();
            prop_assert!(equivalent(&fraction, &decimal, 1e-12));
            let scaled = format!("{}/{}", p * 3, q * 3);
            prop_assert!(equivalent(&fraction, &scaled, 0.0));
            let next = format!("{}/{q}", p + 1);
            prop_assert!(!equivalent(&fraction, &next, 0.0));
        }

        #[test]
        fn thousands_separators_do_not_change_the_value(n in 0u64..10_000_000_000) {
            let plain = n.to_string();
            let mut grouped = String::new();
            for (i, c) in plain.chars().enumerate() {
                if i > 0 && (plain.len() - i) % 3 == 0 {
                    grouped.push(',');
                }
                grouped.push(c);
            }
            prop_assert!(equivalent(&plain, &grouped, 0.0));
        }

        #[test]
        fn extraction_never_panics(text in "\\PC{0,64}") {
            for how in [Extraction::Auto, Extraction::Boxed, Extraction::Hashes, Extraction::LastNumber] {
                let _ = extract(&text, &how);
            }
            let _ = parse_number(&text);
            let _ = equivalent(&text, "1", 0.0);
        }
    }
}
