//! `scratchpad-steps`: checks each step of a digit-by-digit scratchpad and scores it, for
//! process advantages (`advantage = "process"`).
//!
//! The problem is read from the prompt (`What is A + B?` or `What is A - B?`, the generated
//! arithmetic task's form). The completion's scratchpad is the text inside `<think>…</think>`
//! (to its end when the tag is not closed), cut into steps by the `steps` rule (default: at
//! `, `). Step `i` is correct when it writes the `i`-th step of the problem's scratchpad, least
//! significant digit first, its work and its value (`47 + 38`: `7+8=15`, then `4+3+1=8`); a step
//! past the last is wrong. Each step is scored `correct` or `wrong`, on its own span of the
//! completion. The completion's own score is not given (the reward does not apply to it): the
//! outcome stays the answer reward's; the share of correct steps is logged as `steps_correct`,
//! and the number of steps as `steps`. A prompt of another form, or a product, is not
//! applicable at all.

use rein_pdk::steps::{Split, split};
use rein_pdk::{Config, ConfigKey, Group, Metadata, Reward, Score};

/// The reward.
pub struct ScratchpadSteps {
    rule: Split,
    correct: f64,
    wrong: f64,
}

/// `a op b` from a prompt `What is a op b?` (addition or subtraction with `a ≥ b ≥ 0`).
pub fn problem(prompt: &str) -> Option<(u64, char, u64)> {
    let body = prompt.trim().strip_prefix("What is ")?.strip_suffix('?')?;
    let mut words = body.split(' ');
    let a = words.next()?.parse::<u64>().ok()?;
    let op = match words.next()? {
        "+" => '+',
        "-" => '-',
        _ => return None,
    };
    let b = words.next()?.parse::<u64>().ok()?;
    (words.next().is_none() && (op == '+' || a >= b)).then_some((a, op, b))
}

/// The scratchpad's steps for `a op b`, least significant digit first, as written (`4+3+1=8`,
/// `13-5-1=7`): the last step carries the leading digits.
pub fn expected_steps(a: u64, op: char, b: u64) -> Vec<String> {
    let digits = |x: u64| -> Vec<u64> { x.to_string().bytes().rev().map(|c| u64::from(c - b'0')).collect() };
    let (da, db) = (digits(a), digits(b));
    let n = da.len().max(db.len());
    let mut carry = 0u64;
    (0..n)
        .map(|i| {
            let (x, y) = (da.get(i).copied().unwrap_or(0), db.get(i).copied().unwrap_or(0));
            let last = i + 1 == n;
            if op == '+' {
                let sum = x + y + carry;
                let carried = if carry > 0 { "+1" } else { "" };
                carry = if last { 0 } else { sum / 10 };
                format!("{x}+{y}{carried}={sum}")
            } else {
                let value = x as i64 - carry as i64;
                let borrow = u64::from(value < y as i64 && !last);
                let top = if borrow > 0 { format!("1{x}") } else { x.to_string() };
                let minus_borrow = if carry > 0 { "-1" } else { "" };
                carry = borrow;
                format!("{top}-{y}{minus_borrow}={}", value + 10 * borrow as i64 - y as i64)
            }
        })
        .collect()
}

/// The scratchpad of `completion` and the character offset it starts at: inside `<think>` up
/// to `</think>` or the end, or the whole completion without a `<think>`.
fn scratchpad(completion: &str) -> (&str, usize) {
    let Some(open) = completion.find("<think>") else {
        return (completion, 0);
    };
    let from = open + "<think>".len();
    let to = completion[from..]
        .find("</think>")
        .map_or(completion.len(), |end| from + end);
    (&completion[from..to], completion[..from].chars().count())
}

impl ScratchpadSteps {
    /// Scores one completion of the problem `a op b`.
    pub fn score_one(&self, completion: &str, (a, op, b): (u64, char, u64)) -> Score {
        let expected = expected_steps(a, op, b);
        let (pad, offset) = scratchpad(completion);
        let steps = split(pad, &self.rule);
        let mut score = Score::not_applicable();
        let mut correct = 0usize;
        for (i, step) in steps.iter().enumerate() {
            let ok = expected.get(i).is_some_and(|e| e == step.text);
            correct += usize::from(ok);
            let span = rein_pdk::steps::Step {
                start: step.start + offset,
                end: step.end + offset,
                ..step.clone()
            };
            score = score.step(&span, if ok { self.correct } else { self.wrong });
        }
        let share = if steps.is_empty() {
            0.0
        } else {
            correct as f64 / steps.len() as f64
        };
        score.with("steps_correct", share).with("steps", steps.len() as f64)
    }
}

impl Reward for ScratchpadSteps {
    const METADATA: Metadata = Metadata::new(
        "scratchpad-steps",
        "scores each step of an arithmetic scratchpad: correct when it is the problem's step at that place",
    )
    .config(&[
        ConfigKey::new(
            "steps",
            "how the scratchpad is cut into steps: `lines`, `marker:TEXT` or `delimiter:TEXT`",
        )
        .default("\"delimiter:, \""),
        ConfigKey::new("correct", "score of a correct step").default("1.0"),
        ConfigKey::new("wrong", "score of a wrong step").default("0.0"),
    ]);

    fn new(config: &Config) -> Result<Self, String> {
        let rule =
            Split::parse(config.str_or("steps", "delimiter:, ")?).map_err(|e| format!("config key `steps`: {e}"))?;
        Ok(Self {
            rule,
            correct: config.f64_or("correct", 1.0)?,
            wrong: config.f64_or("wrong", 0.0)?,
        })
    }

    fn score(&mut self, group: &Group) -> Result<Vec<Score>, String> {
        let problem = problem(&group.prompt);
        Ok((group.completions.iter())
            .map(|c| match problem {
                Some(problem) => self.score_one(c, problem),
                None => Score::not_applicable(),
            })
            .collect())
    }
}

rein_pdk::export_reward!(ScratchpadSteps);

#[cfg(test)]
mod tests {
    use super::*;

    fn reward(config: &str) -> ScratchpadSteps {
        ScratchpadSteps::new(&Config::parse(config, &ScratchpadSteps::METADATA).unwrap()).unwrap()
    }

    fn spans(score: &Score, completion: &str) -> Vec<(String, f64)> {
        let chars: Vec<char> = completion.chars().collect();
        (score.steps.iter())
            .map(|&(start, end, s)| (chars[start..end].iter().collect(), s))
            .collect()
    }

    #[test]
    fn the_expected_steps_are_the_tasks_scratchpad() {
        assert_eq!(expected_steps(47, '+', 38), ["7+8=15", "4+3+1=8"]);
        assert_eq!(expected_steps(999, '+', 1), ["9+1=10", "9+0+1=10", "9+0+1=10"]);
        assert_eq!(expected_steps(52, '-', 17), ["12-7=5", "5-1-1=3"]);
        assert_eq!(expected_steps(100, '-', 1), ["10-1=9", "10-0-1=9", "1-0-1=0"]);
        assert_eq!(expected_steps(5, '-', 5), ["5-5=0"]);
    }

    #[test]
    fn each_step_is_scored_on_its_own_span() {
        let r = reward("{}");
        let completion = "<think>7+8=15, 4+3+1=9</think><answer>95</answer>";
        let score = r.score_one(completion, (47, '+', 38));
        assert_eq!(score.value, None, "the outcome is the answer reward's");
        assert_eq!(
            spans(&score, completion),
            [("7+8=15".to_string(), 1.0), ("4+3+1=9".to_string(), 0.0)]
        );
        assert_eq!(
            score.components,
            [("steps_correct".to_string(), 0.5), ("steps".to_string(), 2.0)]
        );
    }

    #[test]
    fn extra_steps_and_an_unclosed_scratchpad_are_wrong_where_they_differ() {
        let r = reward(r#"{"correct": 2, "wrong": -1}"#);
        let completion = "ok <think>12-7=5, 5-1-1=3, 0-0=0";
        let score = r.score_one(completion, (52, '-', 17));
        assert_eq!(
            spans(&score, completion),
            [
                ("12-7=5".to_string(), 2.0),
                ("5-1-1=3".to_string(), 2.0),
                ("0-0=0".to_string(), -1.0)
            ]
        );
        assert!(
            r.score_one("<think></think><answer>1</answer>", (1, '+', 0))
                .steps
                .is_empty()
        );
    }

    #[test]
    fn only_sums_and_differences_of_the_task_are_problems() {
        assert_eq!(problem("What is 47 + 38?"), Some((47, '+', 38)));
        assert_eq!(problem("What is 3 - 5?"), None, "a negative difference");
        assert_eq!(problem("What is 3 * 5?"), None);
        assert_eq!(problem("Tell me 3 + 5"), None);
        let mut r = reward("{}");
        let group = Group {
            prompt: "What is 6 * 7?".into(),
            completions: vec!["<think>6*7=42</think>".into()],
            ..Group::default()
        };
        assert_eq!(r.score(&group).unwrap(), [Score::not_applicable()]);
    }

    #[test]
    fn a_bad_rule_is_refused_naming_the_key() {
        let config = Config::parse(r#"{"steps": "sentences"}"#, &ScratchpadSteps::METADATA).unwrap();
        let Err(error) = ScratchpadSteps::new(&config) else {
            panic!("accepted")
        };
        assert!(error.contains("`steps`"), "{error}");
    }
}
