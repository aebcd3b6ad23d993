//! The judge a recipe grants a reward plugin (`rein:plugin/judge`): refused without the grant,
//! each limit of the budget enforced with the error naming it, the budget renewed per call,
//! usage counted, and each request's seed fixed by the run's seed and the request.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rein_core::{Group, JudgeLimits, PluginErrorKind, RewardFn, ScriptedJudge};
use rein_plugin::{JUDGE_IMPORT, JudgeGrant, RewardPlugin, SandboxLimits};

use crate::common::load;

fn group(completions: &[&str]) -> Vec<Group> {
    vec![Group {
        prompt: "What is 2 + 3?".into(),
        completions: completions.iter().map(|c| c.to_string()).collect(),
        reference: Some("5".into()),
        metadata: String::new(),
        tokens: Vec::new(),
        images: Vec::new(),
    }]
}

/// `judge-match` (verdict mode) granted a scripted judge under `limits`.
fn judged(judge: &Arc<Mutex<ScriptedJudge>>, limits: JudgeLimits, seed: u64) -> RewardPlugin {
    let plugin = load("judge-match");
    let grant = JudgeGrant::new(judge.clone(), limits, seed);
    plugin
        .reward_with_judge("{}", grant)
        .expect("judge-match accepts an empty config")
}

fn scripted(replies: &[&str]) -> Arc<Mutex<ScriptedJudge>> {
    Arc::new(Mutex::new(ScriptedJudge::new(replies.iter().copied())))
}

fn scores(reward: &mut RewardPlugin, completions: &[&str]) -> Vec<Option<f64>> {
    let scored = reward.score(&group(completions)).expect("the group is scored");
    scored[0].iter().map(|s| s.score).collect()
}

#[test]
fn a_plugin_that_imports_the_judge_is_refused_without_the_grant() {
    let error = load("judge-match").reward("{}").unwrap_err();
    assert_eq!(error.plugin, "judge-match");
    match &error.kind {
        PluginErrorKind::NotGranted { import, .. } => assert_eq!(import, JUDGE_IMPORT),
        other => panic!("expected NotGranted, got {other:?}"),
    }
    assert!(error.to_string().contains("judge = {"), "{error}");
}

#[test]
fn a_grant_to_a_plugin_that_does_not_import_the_judge_is_refused() {
    let grant = JudgeGrant::new(scripted(&[]), JudgeLimits::default(), 0);
    let error = load("math-answer").reward_with_judge("{}", grant).unwrap_err();
    assert!(matches!(error.kind, PluginErrorKind::UnusedGrant { .. }), "{error}");
    assert!(error.to_string().contains("reward-with-judge"), "{error}");
}

#[test]
fn the_judges_answers_reach_the_plugin_and_its_usage_is_counted() {
    let judge = scripted(&["Yes", "No", "Yes."]);
    let mut reward = judged(&judge, JudgeLimits::default(), 0);
    assert_eq!(
        scores(&mut reward, &["5", "6", "five"]),
        [Some(1.0), Some(0.0), Some(1.0)]
    );
    let usage = reward.take_judge_usage().expect("a judged reward reports usage");
    assert_eq!((usage.calls, usage.tokens, usage.failures), (3, 3, 0));
    assert_eq!(reward.take_judge_usage().unwrap().calls, 0, "usage is taken once");
    // The plugin's requests arrive with the grant's defaults filled in.
    let asked = judge.lock().unwrap().asked.clone();
    assert_eq!(asked.len(), 3);
    assert!(asked.iter().all(|r| r.max_new_tokens == 4 && r.temperature == 0.0));
    assert!(asked[0].messages[1].content.contains("Student's answer: 5"));
}

#[test]
fn requests_past_the_groups_budget_get_the_error_naming_it_and_the_next_call_has_a_new_budget() {
    let judge = scripted(&["Yes"; 8]);
    let limits = JudgeLimits {
        max_requests_per_group: 2,
        ..JudgeLimits::default()
    };
    let mut reward = judged(&judge, limits, 0);
    let error = reward.score(&group(&["5", "5", "5"])).unwrap_err();
    assert!(
        matches!(error.kind, PluginErrorKind::Guest { .. }),
        "the plugin reports the refusal itself: {error}"
    );
    let message = error.to_string();
    assert!(
        message.contains("completion 2: the judge's budget of 2 requests"),
        "{message}"
    );
    assert_eq!(
        judge.lock().unwrap().asked.len(),
        2,
        "the refused request never reached the judge"
    );
    assert_eq!(reward.take_judge_usage().unwrap().failures, 1);
    // A new call, a new budget.
    assert_eq!(scores(&mut reward, &["5", "5"]), [Some(1.0), Some(1.0)]);
}

#[test]
fn too_many_new_tokens_and_too_long_a_prompt_are_refused_naming_the_limit() {
    // judge-match's verdicts ask for 4 new tokens.
    let judge = scripted(&["Yes"; 4]);
    let limits = JudgeLimits {
        max_new_tokens: 2,
        ..JudgeLimits::default()
    };
    let error = judged(&judge, limits, 0).score(&group(&["5"])).unwrap_err();
    assert!(error.to_string().contains("2 new tokens per request"), "{error}");
    // The scripted judge counts a token per byte; the rubric alone is longer than 16.
    let limits = JudgeLimits {
        max_prompt_tokens: 16,
        ..JudgeLimits::default()
    };
    let error = judged(&judge, limits, 0).score(&group(&["5"])).unwrap_err();
    assert!(error.to_string().contains("prompts of 16 tokens"), "{error}");
    assert!(
        judge.lock().unwrap().asked.is_empty(),
        "no refused request reached the judge"
    );
}

#[test]
fn a_judge_past_its_share_of_the_deadline_is_cut_off_and_the_plugin_survives() {
    let judge = Arc::new(Mutex::new(
        ScriptedJudge::new(["Yes"; 4]).with_delay(Duration::from_millis(300)),
    ));
    let limits = JudgeLimits {
        deadline_share: 0.1,
        ..JudgeLimits::default()
    };
    let plugin = crate::common::load_with(
        &crate::common::plugin_path("judge-match"),
        SandboxLimits {
            timeout_ms: 2_000,
            ..SandboxLimits::default()
        },
    );
    let mut reward = plugin
        .reward_with_judge("{}", JudgeGrant::new(judge.clone(), limits, 0))
        .unwrap();
    let error = reward.score(&group(&["5"])).unwrap_err();
    assert!(error.to_string().contains("deadline (200 ms) is spent"), "{error}");
    // The instance is intact: with a prompt judge, the next call is scored.
    judge.lock().unwrap().clone_from(&ScriptedJudge::new(["Yes"]));
    assert_eq!(scores(&mut reward, &["5"]), [Some(1.0)]);
}

#[test]
fn each_requests_seed_is_fixed_by_the_runs_seed_and_the_request() {
    let seeds = |seed: u64, completions: &[&str]| {
        let judge = scripted(&["Yes"; 4]);
        let mut reward = judged(&judge, JudgeLimits::default(), seed);
        reward.score(&group(completions)).unwrap();
        let asked = judge.lock().unwrap().asked.clone();
        asked.iter().map(|r| r.seed).collect::<Vec<_>>()
    };
    let first = seeds(7, &["5", "6"]);
    // The same question gets the same seed wherever it comes in the call.
    assert_eq!(seeds(7, &["6", "5"]), [first[1], first[0]]);
    assert_ne!(first[0], first[1]);
    assert_ne!(seeds(8, &["5", "6"]), first);
}

#[test]
fn a_python_plugin_asks_the_judge_and_reads_its_refusals() {
    let plugin = load("judge-rubric-py");
    let judge = scripted(&["Grade: 7", "Grade: 3"]);
    let limits = JudgeLimits {
        max_requests_per_group: 1,
        ..JudgeLimits::default()
    };
    let mut reward = plugin
        .reward_with_judge("{}", JudgeGrant::new(judge.clone(), limits, 0))
        .unwrap();
    assert_eq!(scores(&mut reward, &["5"]), [Some(0.7)]);
    let error = reward.score(&group(&["5", "6"])).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("completion 1: the judge refused: RequestsExhausted (1)"),
        "{error}"
    );
    // The rubric and the stop string reach the judge as the plugin wrote them.
    let asked = judge.lock().unwrap().asked.clone();
    assert_eq!(asked[0].stop, ["\n"]);
    assert_eq!(asked[0].max_new_tokens, 16);
    assert!(asked[0].messages[0].content.starts_with("You grade"));
}
