//! The `code-tests` reward: model-written code and its row's test asserts, in the sandbox.
//! Its verdicts equal native CPython's on the solutions of tests/fixtures/code_tests (made by
//! gen_parity.py there), and hostile code scores 0 while the rest of the batch is scored.

use std::path::Path;

use rein_core::{Group, RewardFn};
use rein_plugin::SandboxLimits;
use rein_posttrain::{OnError, WeightedReward, score_groups};
use serde::Deserialize;

use super::common;

#[derive(Deserialize)]
struct Solution {
    problem: String,
    kind: String,
    code: String,
    tests: Vec<String>,
    native: Vec<String>,
}

const OUTCOMES: [&str; 4] = ["passed", "failed", "error", "timeout"];

fn code_tests(limits: SandboxLimits) -> rein_plugin::RewardPlugin {
    let plugin = common::load_with(&common::plugin_path("code-tests"), limits);
    plugin.reward("{}").expect("code-tests accepts an empty config")
}

fn fenced(code: &str) -> String {
    format!("Here is my solution.\n```python\n{code}\n```\n")
}

fn group(tests: &[String], completions: Vec<String>) -> Group {
    Group {
        prompt: "Write the function.".into(),
        completions,
        reference: None,
        metadata: serde_json::json!({ "tests": tests }).to_string(),
        tokens: Vec::new(),
        images: Vec::new(),
    }
}

/// Every solution's share of passed, failed, erring and timed-out tests equals native
/// CPython's, solution by solution (grouped by problem, as GRPO batches them).
#[test]
fn verdicts_equal_native_cpythons() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/code_tests/parity.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let solutions: Vec<Solution> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(solutions.len() >= 100, "{} solutions", solutions.len());
    let mut reward = code_tests(SandboxLimits {
        timeout_ms: 60_000,
        ..SandboxLimits::default()
    });
    let mut by_problem: Vec<(&[String], Vec<&Solution>)> = Vec::new();
    for s in &solutions {
        match by_problem
            .iter_mut()
            .find(|(tests, first)| *tests == s.tests.as_slice() && first[0].problem == s.problem)
        {
            Some((_, members)) => members.push(s),
            None => by_problem.push((&s.tests, vec![s])),
        }
    }
    let groups: Vec<Group> = (by_problem.iter())
        .map(|(tests, members)| group(tests, members.iter().map(|s| fenced(&s.code)).collect()))
        .collect();
    let scores = reward.score(&groups).expect("code-tests scores every solution");
    let (mut passed, mut checked) = (0, 0);
    for ((_, members), scores) in by_problem.iter().zip(&scores) {
        for (solution, score) in members.iter().zip(scores) {
            let n = solution.native.len() as f64;
            let share = |kind: &str| solution.native.iter().filter(|o| *o == kind).count() as f64 / n;
            for kind in OUTCOMES {
                let got = score.components.iter().find(|(name, _)| name == kind).map(|(_, v)| *v);
                assert_eq!(
                    got,
                    Some(share(kind)),
                    "{} / {}: `{kind}` share (native outcomes {:?})",
                    solution.problem,
                    solution.kind,
                    solution.native
                );
            }
            assert_eq!(
                score.score,
                Some(share("passed")),
                "{} / {}",
                solution.problem,
                solution.kind
            );
            passed += solution.native.iter().filter(|o| *o == "passed").count();
            checked += solution.native.len();
        }
    }
    assert!(
        passed > 50 && passed < checked - 50,
        "a mix of verdicts: {passed} of {checked} passed"
    );
}

/// A loop inside C code (no Python line runs, so only the host's deadline stops it) traps the
/// batch; with `isolate` the host scores that completion 0 and the others as usual, and the
/// plugin goes on scoring.
#[test]
fn a_completion_that_hangs_the_sandbox_costs_only_its_own_score() {
    let limits = SandboxLimits {
        timeout_ms: 3_000,
        ..SandboxLimits::default()
    };
    let tests = vec!["assert add(1, 2) == 3".to_string(), "assert add(2, 2) == 4".to_string()];
    let completions = vec![
        fenced("def add(a, b):\n    return a + b"),
        fenced("import itertools\ntotal = sum(itertools.count())\ndef add(a, b):\n    return a + b"),
        fenced("def add(a, b):\n    return a * b"),
    ];
    let groups = [group(&tests, completions)];
    let mut rewards = [WeightedReward {
        reward: Box::new(code_tests(limits)),
        weight: 1.0,
        isolate: true,
    }];
    let (scores, failures) = score_groups(&mut rewards, &groups, OnError::Fail).expect("isolate absorbs the hang");
    assert_eq!(scores[0].total, vec![1.0, 0.0, 0.5]);
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].completion, Some(1));
    assert!(
        failures[0].error.to_string().contains("code-tests"),
        "{}",
        failures[0].error
    );

    // Without `isolate`, the same batch fails the step with the plugin's error.
    rewards[0].isolate = false;
    let (group_index, error) = score_groups(&mut rewards, &groups, OnError::Fail).unwrap_err();
    assert_eq!(group_index, 0);
    assert!(error.is_trap(), "{error}");
}
