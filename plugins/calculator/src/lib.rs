//! `calculator`: a tool that evaluates an arithmetic expression exactly, in rational numbers.
//!
//! `+ - * /`, `^` (integer powers), parentheses, unary minus, integers and decimals
//! (`1.5` is `3/2`). The result is an integer or a reduced fraction (`-7/3`). Division by zero,
//! a malformed expression, a result beyond 128-bit numerators and denominators: each is a tool
//! error the model reads, naming the position or the operation.

use rein_pdk::json::{Map, Value, json};
use rein_pdk::{Config, ConfigKey, Metadata, Tool, ToolOutput, ToolSpec};

/// The tool.
pub struct Calculator {
    max_length: usize,
}

/// Expressions nest at most this deep (a parser, not the sandbox, should say no).
const MAX_DEPTH: usize = 64;

/// Powers at most this large in magnitude.
const MAX_EXPONENT: i128 = 512;

impl Tool for Calculator {
    const METADATA: Metadata = Metadata::new(
        "calculator",
        "Evaluates an arithmetic expression exactly (+ - * / ^, parentheses) in rational numbers",
    )
    .config(&[ConfigKey::new("max_length", "Longest expression accepted, in characters").default("1000")]);

    fn new(config: &Config) -> Result<Self, String> {
        let max_length = config.u64_or("max_length", 1000)? as usize;
        Ok(Calculator { max_length })
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "calculator".into(),
            description: "Evaluate an arithmetic expression exactly. Supports + - * / ^ and parentheses; \
                          returns an integer or a fraction."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "expression": {"type": "string", "description": "The expression, e.g. \"(12 + 30) * 4 / 7\""}
                },
                "required": ["expression"]
            }),
        }
    }

    fn call(&mut self, arguments: &Map<String, Value>) -> Result<ToolOutput, String> {
        let expression = match arguments.get("expression") {
            Some(Value::String(e)) => e,
            Some(Value::Number(n)) => return Ok(n.to_string().into()),
            Some(_) => return Err("`expression` must be a string".into()),
            None => return Err("missing the argument `expression`".into()),
        };
        if expression.chars().count() > self.max_length {
            return Err(format!("the expression is longer than {} characters", self.max_length));
        }
        evaluate(expression).map(|r| r.to_string().into())
    }
}

rein_pdk::export_tool!(Calculator);

/// A reduced fraction with a positive denominator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rational {
    num: i128,
    den: i128,
}

const OVERFLOW: &str = "the result is too large (beyond 128-bit integers)";

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Rational {
    fn new(num: i128, den: i128) -> Result<Self, String> {
        if den == 0 {
            return Err("division by zero".into());
        }
        let g = gcd(num.unsigned_abs(), den.unsigned_abs()).max(1);
        let (mut num, mut den) = (num / g as i128, den / g as i128);
        if den < 0 {
            num = num.checked_neg().ok_or(OVERFLOW)?;
            den = den.checked_neg().ok_or(OVERFLOW)?;
        }
        Ok(Self { num, den })
    }

    fn integer(n: i128) -> Self {
        Self { num: n, den: 1 }
    }

    fn add(self, o: Self) -> Result<Self, String> {
        let num = (self.num.checked_mul(o.den))
            .zip(o.num.checked_mul(self.den))
            .and_then(|(a, b)| a.checked_add(b));
        Self::new(num.ok_or(OVERFLOW)?, self.den.checked_mul(o.den).ok_or(OVERFLOW)?)
    }

    fn neg(self) -> Result<Self, String> {
        Ok(Self {
            num: self.num.checked_neg().ok_or(OVERFLOW)?,
            den: self.den,
        })
    }

    fn mul(self, o: Self) -> Result<Self, String> {
        // Cross-reduce first so that exact results that fit are not lost to overflow.
        let g1 = gcd(self.num.unsigned_abs(), o.den.unsigned_abs()).max(1) as i128;
        let g2 = gcd(o.num.unsigned_abs(), self.den.unsigned_abs()).max(1) as i128;
        let num = (self.num / g1).checked_mul(o.num / g2).ok_or(OVERFLOW)?;
        let den = (self.den / g2).checked_mul(o.den / g1).ok_or(OVERFLOW)?;
        Self::new(num, den)
    }

    fn recip(self) -> Result<Self, String> {
        Self::new(self.den, self.num)
    }

    fn pow(self, exponent: Self) -> Result<Self, String> {
        if exponent.den != 1 {
            return Err(format!("the exponent {exponent} is not an integer"));
        }
        if exponent.num.abs() > MAX_EXPONENT {
            return Err(format!("the exponent {exponent} is beyond ±{MAX_EXPONENT}"));
        }
        let base = if exponent.num < 0 { self.recip()? } else { self };
        let mut result = Self::integer(1);
        for _ in 0..exponent.num.unsigned_abs() {
            result = result.mul(base)?;
        }
        Ok(result)
    }
}

impl std::fmt::Display for Rational {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.den {
            1 => write!(f, "{}", self.num),
            d => write!(f, "{}/{d}", self.num),
        }
    }
}

/// Evaluates `text`.
pub fn evaluate(text: &str) -> Result<Rational, String> {
    let mut parser = Parser {
        chars: text.chars().collect(),
        at: 0,
        depth: 0,
    };
    let value = parser.sum()?;
    parser.skip_spaces();
    match parser.peek() {
        None => Ok(value),
        Some(c) => Err(parser.unexpected(c)),
    }
}

/// A recursive-descent parser that evaluates as it goes, with Python's precedence (`-2^2` is
/// −4, `2^3^2` is 512): sum = product (('+' | '-') product)*; product = unary (('*' | '/')
/// unary)*; unary = ('-' | '+') unary | power; power = atom ('^' unary)?;
/// atom = number | '(' sum ')'.
struct Parser {
    chars: Vec<char>,
    at: usize,
    depth: usize,
}

impl Parser {
    fn skip_spaces(&mut self) {
        while self.chars.get(self.at).is_some_and(|c| c.is_whitespace()) {
            self.at += 1;
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    /// The next non-space character, consumed when it is one of `ops`.
    fn take(&mut self, ops: &[char]) -> Option<char> {
        self.skip_spaces();
        let c = self.peek().filter(|c| ops.contains(c))?;
        self.at += 1;
        Some(c)
    }

    fn unexpected(&self, c: char) -> String {
        format!("unexpected `{c}` at position {}", self.at + 1)
    }

    fn sum(&mut self) -> Result<Rational, String> {
        let mut value = self.product()?;
        while let Some(op) = self.take(&['+', '-']) {
            let rhs = self.product()?;
            value = if op == '+' {
                value.add(rhs)?
            } else {
                value.add(rhs.neg()?)?
            };
        }
        Ok(value)
    }

    fn product(&mut self) -> Result<Rational, String> {
        let mut value = self.unary()?;
        while let Some(op) = self.take(&['*', '/', '×', '÷']) {
            let rhs = self.unary()?;
            value = match op {
                '*' | '×' => value.mul(rhs)?,
                _ => value.mul(rhs.recip()?)?,
            };
        }
        Ok(value)
    }

    fn unary(&mut self) -> Result<Rational, String> {
        match self.take(&['-', '+']) {
            Some('-') => self.nested(Self::unary)?.neg(),
            Some(_) => self.nested(Self::unary),
            None => self.power(),
        }
    }

    fn power(&mut self) -> Result<Rational, String> {
        let base = self.atom()?;
        if self.take(&['^']).is_some() {
            let exponent = self.nested(Self::unary)?;
            return base.pow(exponent);
        }
        Ok(base)
    }

    fn atom(&mut self) -> Result<Rational, String> {
        if self.take(&['(']).is_none() {
            return self.number();
        }
        let value = self.nested(Self::sum)?;
        match self.take(&[')']) {
            Some(_) => Ok(value),
            None => Err(format!("missing `)` at position {}", self.at + 1)),
        }
    }

    /// Runs `f` one level deeper, refusing past [`MAX_DEPTH`].
    fn nested(&mut self, f: fn(&mut Self) -> Result<Rational, String>) -> Result<Rational, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(format!("the expression nests deeper than {MAX_DEPTH} levels"));
        }
        let value = f(self);
        self.depth -= 1;
        value
    }

    fn number(&mut self) -> Result<Rational, String> {
        self.skip_spaces();
        let start = self.at;
        let mut digits = String::new();
        let mut decimals = None::<u32>;
        while let Some(c) = self.peek() {
            match c {
                '0'..='9' => {
                    digits.push(c);
                    decimals = decimals.map(|d| d + 1);
                }
                '.' if decimals.is_none() => decimals = Some(0),
                ',' | '_' if !digits.is_empty() && decimals.is_none() => {}
                _ => break,
            }
            self.at += 1;
        }
        if digits.is_empty() {
            return match self.peek() {
                Some(c) => Err(self.unexpected(c)),
                None if start == 0 => Err("the expression is empty".into()),
                None => Err("the expression ends where a number should be".into()),
            };
        }
        let num: i128 = digits.parse().map_err(|_| OVERFLOW.to_string())?;
        let den = 10i128.checked_pow(decimals.unwrap_or(0)).ok_or(OVERFLOW)?;
        Rational::new(num, den)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(text: &str) -> String {
        match evaluate(text) {
            Ok(value) => value.to_string(),
            Err(e) => format!("error: {e}"),
        }
    }

    #[test]
    fn evaluates_exactly() {
        assert_eq!(eval("1234 * 5678"), "7006652");
        assert_eq!(eval("(12 + 30) * 4 / 7"), "24");
        assert_eq!(eval("1/3 + 1/6"), "1/2");
        assert_eq!(eval("-7/3"), "-7/3");
        assert_eq!(eval("2^10 - 2^-1"), "2047/2");
        assert_eq!(eval("2^3^2"), "512");
        assert_eq!(eval("-2^2"), "-4");
        assert_eq!(eval("1.5 * 4"), "6");
        assert_eq!(eval("0.1 + 0.2"), "3/10");
        assert_eq!(eval("1,000 + 1"), "1001");
        assert_eq!(eval("6 ÷ 4 × 2"), "3");
    }

    #[test]
    fn bad_expressions_are_errors_naming_the_place() {
        assert_eq!(eval("1 / (2 - 2)"), "error: division by zero");
        assert_eq!(eval("2 * * 3"), "error: unexpected `*` at position 5");
        assert_eq!(eval("(1 + 2"), "error: missing `)` at position 7");
        assert_eq!(eval("1 + 2)"), "error: unexpected `)` at position 6");
        assert_eq!(eval(""), "error: the expression is empty");
        assert_eq!(eval("3 +"), "error: the expression ends where a number should be");
        assert_eq!(eval("import os"), "error: unexpected `i` at position 1");
        assert!(eval("2^0.5").contains("is not an integer"));
        assert!(eval("10^100").contains("too large"));
        assert!(eval("2^100000").contains("beyond"));
        let deep = format!("{}1{}", "(".repeat(500), ")".repeat(500));
        assert!(eval(&deep).contains("nests deeper"), "{}", eval(&deep));
        let negations = "-".repeat(10_000) + "1";
        assert!(eval(&negations).contains("nests deeper"));
    }

    #[test]
    fn arguments_are_checked() {
        let mut tool = Calculator { max_length: 10 };
        let args = |v: Value| v.as_object().cloned().unwrap();
        assert_eq!(tool.call(&args(json!({"expression": "2+2"}))), Ok("4".into()));
        assert_eq!(tool.call(&args(json!({"expression": 7}))), Ok("7".into()));
        assert!(tool.call(&args(json!({}))).unwrap_err().contains("missing"));
        assert!(
            tool.call(&args(json!({"expression": [1]})))
                .unwrap_err()
                .contains("must be a string")
        );
        let long = tool.call(&args(json!({"expression": "1+1+1+1+1+1"}))).unwrap_err();
        assert!(long.contains("longer than 10"), "{long}");
    }
}
