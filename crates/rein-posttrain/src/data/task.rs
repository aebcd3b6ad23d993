//! A synthetic verifiable task the project generates itself (no dataset downloads): integer
//! arithmetic with a worked solution for supervised warm-up and a checkable answer for RL.
//!
//! The worked solution is a digit-by-digit scratchpad inside `<think>`, least significant digit
//! first with its carry or borrow (`47 + 38`: `<think>7+8=15, 4+3+1=8</think><answer>85</answer>`),
//! so each step is single-digit arithmetic a small model can learn; whether it gets every step
//! right is what the reward checks.

pub use rein_recipe::ArithmeticTask;
use rein_recipe::Solution;
use rein_sampler::SeededRng;
use serde_json::json;

use crate::data::Example;

/// The digit-by-digit scratchpad for `a op b` (`a ≥ b` for subtraction, non-negative operands).
pub fn scratchpad(a: i64, op: &str, b: i64) -> String {
    let steps = scratchpad_steps(a, op, b);
    let written: Vec<String> = steps.iter().map(|(work, value)| format!("{work}={value}")).collect();
    written.join(", ")
}

/// The scratchpad's steps, least significant digit first: each step's work (`4+3+1`) and its
/// value (`8`), which is the answer's digit at that place (the last step: its leading digits).
fn scratchpad_steps(a: i64, op: &str, b: i64) -> Vec<(String, i64)> {
    let digits = |x: i64| -> Vec<i64> {
        let mut d: Vec<i64> = x.to_string().bytes().rev().map(|c| i64::from(c - b'0')).collect();
        d.resize(d.len().max(1), 0);
        d
    };
    let (da, db) = (digits(a), digits(b));
    let n = da.len().max(db.len());
    let mut steps = Vec::with_capacity(n);
    let mut carry = 0i64;
    for i in 0..n {
        let (x, y) = (da.get(i).copied().unwrap_or(0), db.get(i).copied().unwrap_or(0));
        let last = i + 1 == n;
        match op {
            "+" => {
                let sum = x + y + carry;
                let carried = if carry > 0 { "+1" } else { "" };
                steps.push((format!("{x}+{y}{carried}"), sum));
                carry = if last { 0 } else { sum / 10 };
            }
            _ => {
                let (borrowed_in, value) = (carry, x - carry);
                let borrow = i64::from(value < y && !last);
                let top = if borrow > 0 { format!("1{x}") } else { x.to_string() };
                let minus_borrow = if borrowed_in > 0 { "-1" } else { "" };
                steps.push((format!("{top}-{y}{minus_borrow}"), value + 10 * borrow - y));
                carry = borrow;
            }
        }
    }
    steps
}

/// A worked solution of `What is a op b?` with one slip: one step's value off by one, and the
/// answer off by as much at that step's place (`47 + 38`: `7+8=15, 4+3+1=9` → `95`). The
/// dispreferred completion of a generated preference pair. `None` for a prompt the task did
/// not write, or a product (its solution has no steps).
pub fn slipped_solution(prompt: &str, rng: &mut SeededRng) -> Option<String> {
    let problem = prompt.strip_prefix("What is ")?.strip_suffix('?')?;
    let mut words = problem.split(' ');
    let (a, op, b) = (
        words.next()?.parse::<i64>().ok()?,
        words.next()?,
        words.next()?.parse::<i64>().ok()?,
    );
    if !matches!(op, "+" | "-") {
        return None;
    }
    let result = if op == "+" { a + b } else { a - b };
    let mut steps = scratchpad_steps(a, op, b);
    let at = rng.below(steps.len() as u64) as usize;
    let value = steps[at].1;
    // Down one where that keeps the step and the answer non-negative, else up one.
    let place = 10i64.pow(at as u32);
    let delta = if value > 0 && result >= place && rng.uniform() < 0.5 {
        -1
    } else {
        1
    };
    steps[at].1 = value + delta;
    let written: Vec<String> = steps.iter().map(|(work, value)| format!("{work}={value}")).collect();
    let answer = result + delta * place;
    Some(format!(
        "<think>{}</think><answer>{answer}</answer>",
        written.join(", ")
    ))
}

/// The multi-turn solution of `a op b` with the `calculator` tool, as a conversational
/// completion (a JSON list of messages, TRL's format): a tool call, the calculator's answer,
/// then the answer in `<answer>` tags.
pub fn calculator_trace(a: i64, op: &str, b: i64, result: i64) -> String {
    // Name first, as the Hermes format writes it (a JSON map would sort the keys).
    let call = format!(r#"{{"name": "calculator", "arguments": {{"expression": "{a}{op}{b}"}}}}"#);
    json!([
        {"role": "assistant", "content": format!("<tool_call>{call}</tool_call>")},
        {"role": "tool", "content": result.to_string()},
        {"role": "assistant", "content": format!("<answer>{result}</answer>")},
    ])
    .to_string()
}

/// The task's train and held-out splits, disjoint, reproducible from `seed`.
pub fn generate_task(task: &ArithmeticTask, seed: u64) -> (Vec<Example>, Vec<Example>) {
    let mut rng = SeededRng::new(seed ^ 0xA817_4E7C);
    let mut seen = std::collections::HashSet::new();
    let ranges = task.operand_ranges();
    let mut draw = |count: usize| {
        let mut out = Vec::with_capacity(count);
        while out.len() < count {
            // One range draws nothing from the generator, so tasks without `digits` stay the same.
            let range = match ranges.len() {
                1 => &ranges[0],
                n => &ranges[rng.below(n as u64) as usize],
            };
            let span = u64::from(range.high - range.low) + 1;
            let mut a = i64::from(range.low) + rng.below(span) as i64;
            let mut b = i64::from(range.low) + rng.below(span) as i64;
            let op = &task.ops[rng.below(task.ops.len() as u64) as usize];
            if op == "-" && a < b {
                (a, b) = (b, a);
            }
            if !seen.insert((a, b, op.clone())) {
                continue;
            }
            let result = match op.as_str() {
                "+" => a + b,
                "-" => a - b,
                _ => a * b,
            };
            out.push(Example {
                prompt: format!("What is {a} {op} {b}?"),
                answer: Some(result.to_string()),
                completion: Some(match (task.solution, op.as_str()) {
                    (Solution::Calculator, _) if rng.uniform() < task.tool_share => calculator_trace(a, op, b, result),
                    (Solution::Calculator | Solution::Answer, _) => format!("<answer>{result}</answer>"),
                    (Solution::Scratchpad, "*") => {
                        format!("<think>{a} * {b} = {result}</think><answer>{result}</answer>")
                    }
                    (Solution::Scratchpad, _) => {
                        format!("<think>{}</think><answer>{result}</answer>", scratchpad(a, op, b))
                    }
                }),
                metadata: (range.source.as_ref())
                    .map(|source| json!({ "data_source": source }).to_string())
                    .unwrap_or_default(),
                images: Vec::new(),
            });
        }
        out
    };
    let test = draw(task.test);
    let train = draw(task.train);
    (train, test)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratchpads_carry_and_borrow_digit_by_digit() {
        assert_eq!(scratchpad(47, "+", 38), "7+8=15, 4+3+1=8");
        assert_eq!(scratchpad(99, "+", 99), "9+9=18, 9+9+1=19");
        assert_eq!(scratchpad(5, "+", 3), "5+3=8");
        assert_eq!(scratchpad(5, "+", 73), "5+3=8, 0+7=7");
        assert_eq!(scratchpad(52, "-", 38), "12-8=4, 5-3-1=1");
        assert_eq!(scratchpad(70, "-", 7), "10-7=3, 7-0-1=6");
        assert_eq!(scratchpad(9, "-", 4), "9-4=5");
        assert_eq!(scratchpad(40, "-", 40), "0-0=0, 4-4=0");
    }

    #[test]
    fn slips_change_one_step_and_the_answer_at_its_place() {
        let mut rng = SeededRng::new(3);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let slipped = slipped_solution("What is 47 + 38?", &mut rng).unwrap();
            let right = "<think>7+8=15, 4+3+1=8</think><answer>85</answer>";
            let diffs = slipped.chars().zip(right.chars()).filter(|(a, b)| a != b).count();
            assert!(diffs >= 1 && slipped != right, "{slipped}");
            seen.insert(slipped);
        }
        let expected = [
            "<think>7+8=14, 4+3+1=8</think><answer>84</answer>",
            "<think>7+8=16, 4+3+1=8</think><answer>86</answer>",
            "<think>7+8=15, 4+3+1=7</think><answer>75</answer>",
            "<think>7+8=15, 4+3+1=9</think><answer>95</answer>",
        ];
        assert_eq!(seen, expected.iter().map(|s| s.to_string()).collect());
        // Never negative: 0 − 0 can only slip up.
        for _ in 0..20 {
            let slipped = slipped_solution("What is 40 - 40?", &mut rng).unwrap();
            assert!(!slipped.contains('-') || !slipped.contains("=-"), "{slipped}");
            assert!(!slipped.contains("<answer>-"), "{slipped}");
        }
        assert_eq!(slipped_solution("What is 4 * 5?", &mut rng), None);
        assert_eq!(slipped_solution("Hello?", &mut rng), None);
    }

    #[test]
    fn answer_solutions_are_the_answer_alone() {
        let task = ArithmeticTask {
            min_operand: 0,
            max_operand: 99,
            ops: vec!["+".into(), "-".into()],
            train: 20,
            test: 5,
            solution: Solution::Answer,
            tool_share: 1.0,
            digits: Vec::new(),
        };
        let (train, _) = generate_task(&task, 3);
        for e in &train {
            let answer = e.answer.as_deref().unwrap();
            assert_eq!(
                e.completion.as_deref(),
                Some(format!("<answer>{answer}</answer>").as_str())
            );
        }
    }

    #[test]
    fn splits_are_disjoint_reproducible_and_correct() {
        let task = ArithmeticTask {
            min_operand: 0,
            max_operand: 20,
            ops: vec!["+".into(), "-".into(), "*".into()],
            train: 300,
            test: 50,
            solution: Solution::Scratchpad,
            tool_share: 1.0,
            digits: Vec::new(),
        };
        let (train, test) = generate_task(&task, 1);
        assert_eq!((train.len(), test.len()), (300, 50));
        let prompts: std::collections::HashSet<_> = train.iter().map(|e| &e.prompt).collect();
        assert!(test.iter().all(|e| !prompts.contains(&e.prompt)));
        assert_eq!(generate_task(&task, 1).0, train);
        for e in train.iter().take(50) {
            let words: Vec<&str> = e
                .prompt
                .trim_start_matches("What is ")
                .trim_end_matches('?')
                .split(' ')
                .collect();
            let (a, b): (i64, i64) = (words[0].parse().unwrap(), words[2].parse().unwrap());
            let expected = match words[1] {
                "+" => a + b,
                "-" => a - b,
                _ => a * b,
            };
            assert_eq!(e.answer.as_deref(), Some(expected.to_string().as_str()));
            assert!(
                e.completion
                    .as_ref()
                    .unwrap()
                    .ends_with(&format!("<answer>{expected}</answer>"))
            );
            assert!(expected >= 0, "subtraction keeps a ≥ b");
        }
        assert!(
            ArithmeticTask {
                train: 10_000,
                ..task.clone()
            }
            .validate()
            .is_err()
        );
        assert!(
            ArithmeticTask {
                ops: vec!["/".into()],
                ..task
            }
            .validate()
            .is_err()
        );
    }

    /// With `digits`, both operands of a problem have the length its source names, the lengths
    /// share the rows evenly, and lengths the operand range cannot give are refused.
    #[test]
    fn digit_lengths_make_sources_of_their_own() {
        let task = ArithmeticTask {
            min_operand: 0,
            max_operand: 999,
            ops: vec!["+".into(), "-".into()],
            train: 900,
            test: 90,
            solution: Solution::Scratchpad,
            tool_share: 1.0,
            digits: vec![2, 3],
        };
        let (train, test) = generate_task(&task, 4);
        let mut per_source = std::collections::BTreeMap::new();
        for e in train.iter().chain(&test) {
            let row: serde_json::Value = serde_json::from_str(&e.metadata).unwrap();
            let source = row["data_source"].as_str().unwrap().to_string();
            let problem = e.prompt.trim_start_matches("What is ").trim_end_matches('?');
            let words: Vec<&str> = problem.split(' ').collect();
            for operand in [words[0], words[2]] {
                assert_eq!(format!("{}-digit", operand.len()), source, "{}", e.prompt);
            }
            *per_source.entry(source).or_insert(0usize) += 1;
        }
        assert_eq!(per_source.len(), 2);
        assert!(per_source.values().all(|&n| (430..560).contains(&n)), "{per_source:?}");
        // Without digits, rows carry no source and the problems are those of before.
        let plain = ArithmeticTask {
            digits: Vec::new(),
            ..task.clone()
        };
        assert!(generate_task(&plain, 4).0.iter().all(|e| e.metadata.is_empty()));
        for (digits, max_operand, message) in [
            (vec![3], 99, "no 3-digit operand"),
            (vec![0], 999, "from 1 to 9"),
            (vec![2, 2], 999, "twice"),
        ] {
            let (key, error) = ArithmeticTask {
                digits,
                max_operand,
                ..task.clone()
            }
            .validate()
            .unwrap_err();
            assert!(key == "digits" && error.contains(message), "{key}: {error}");
        }
    }

    #[test]
    fn calculator_solutions_call_the_tool_in_the_share_asked() {
        let task = ArithmeticTask {
            min_operand: 100,
            max_operand: 999,
            ops: vec!["*".into()],
            train: 1000,
            test: 0,
            solution: Solution::Calculator,
            tool_share: 0.3,
            digits: Vec::new(),
        };
        let (train, _) = generate_task(&task, 2);
        let mut traces = 0;
        for e in &train {
            let completion = e.completion.as_deref().unwrap();
            let answer = e.answer.as_deref().unwrap();
            if let Ok(messages) = serde_json::from_str::<Vec<serde_json::Value>>(completion) {
                traces += 1;
                let (a, b) = e
                    .prompt
                    .trim_start_matches("What is ")
                    .trim_end_matches('?')
                    .split_once(" * ")
                    .unwrap();
                assert_eq!(
                    messages[0]["content"],
                    format!(
                        r#"<tool_call>{{"name": "calculator", "arguments": {{"expression": "{a}*{b}"}}}}</tool_call>"#
                    )
                );
                assert_eq!(messages[1], serde_json::json!({"role": "tool", "content": answer}));
                assert_eq!(messages[2]["content"], format!("<answer>{answer}</answer>"));
            } else {
                assert_eq!(completion, format!("<answer>{answer}</answer>"));
            }
        }
        assert!((250..350).contains(&traces), "{traces} traces of 1000");
    }
}
