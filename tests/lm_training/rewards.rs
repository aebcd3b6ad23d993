//! Rewards in a run: a failing plugin under each `on_error`, a reward model beside a plugin, a
//! judge model answering a plugin, a process reward model beside a plugin, a label-free signal
//! alone.

use super::*;

/// A recipe on the tiny Qwen2 fixture with the hostile reward plugin, prompts from a file
/// where one row asks the plugin to panic.
fn hostile_recipe(dir: &Path, on_error: &str) -> LoadedRecipe {
    std::fs::write(
        dir.join("train.jsonl"),
        "{\"prompt\": \"calm\", \"answer\": \"x\"}\n{\"prompt\": \"trouble\", \"answer\": \"x\", \"attack\": \"panic\"}\n",
    )
    .unwrap();
    let model = root().join("tests/fixtures/lm/qwen2-gqa");
    let recipe = format!(
        r#"
seed = 3
[model]
path = {model:?}
[data]
train = "train.jsonl"
[sampler]
n = 2
max_new_tokens = 4
[algorithm]
name = "grpo"
steps = 2
prompts_per_step = 2
on_error = "{on_error}"
[[reward]]
plugin = {plugin:?}
[eval]
k = 0
[train]
runs_dir = {runs:?}
"#,
        model = model.display().to_string(),
        runs = dir.join("runs").display().to_string(),
        plugin = common::test_plugin_path("hostile-reward").display().to_string(),
    );
    std::fs::write(dir.join("recipe.toml"), recipe).unwrap();
    LoadedRecipe::load(&dir.join("recipe.toml"), &[]).unwrap()
}

#[test]
fn a_failing_reward_plugin_follows_on_error() {
    let dir = common::scratch("lm-onerror");
    let err = rein_train::run(&hostile_recipe(&dir, "fail"), &plugin_dir(), false).unwrap_err();
    let TrainError::Lm(lm) = &err else { panic!("{err}") };
    let rein_posttrain::LmError::Reward { prompt, error, .. } = lm.as_ref() else {
        panic!("{err}")
    };
    assert_eq!(prompt, "trouble");
    assert_eq!(error.plugin, "hostile-reward");
    assert!(
        err.to_string().contains("the hostile plugin panics on purpose"),
        "{err}"
    );
    for policy in ["zero", "skip"] {
        let outcome = rein_train::run(&hostile_recipe(&dir, policy), &plugin_dir(), true).unwrap();
        let RunOutcome::Lm(outcome) = outcome else { panic!() };
        let metrics = std::fs::read_to_string(outcome.run_dir.unwrap().join("metrics.jsonl")).unwrap();
        let failures: u64 = metrics
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter_map(|l| l["train/reward_failures"].as_u64())
            .sum();
        assert!(failures >= 1, "{policy}: the failure is logged");
        // The panic is a trap, counted per plugin in every record.
        let last: serde_json::Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
        let traps = last["plugins/hostile-reward/traps"].as_u64();
        assert!(traps >= Some(1), "{policy}: the plugin's traps are counted: {last}");
    }
}

/// GRPO with a reward model beside a plugin: its scores are logged under its name and enter the
/// sum with their weight.
#[test]
fn a_reward_model_scores_completions_beside_a_plugin() {
    let runs = common::scratch("lm-reward-model");
    let rm = root().join("tests/fixtures/lm/llama-rm");
    let rewards = format!(
        "reward=[{{plugin = \"math-answer\", config = {{extract = \"answer\"}}}}, \
         {{model = {:?}, name = \"rm\", weight = 0.5, batch_size = 3}}]",
        rm.display().to_string()
    );
    let recipe = tiny_default(&runs, &["sft.steps=2", rewards.as_str()]);
    let RunOutcome::Lm(outcome) = rein_train::run(&recipe, &plugin_dir(), true).unwrap() else {
        panic!("a language-model outcome")
    };
    let metrics = std::fs::read_to_string(outcome.run_dir.unwrap().join("metrics.jsonl")).unwrap();
    let grpo: Vec<serde_json::Value> = (metrics.lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|l: &serde_json::Value| l["stage"] == "grpo")
        .collect();
    assert_eq!(grpo.len(), 2);
    for line in &grpo {
        let (total, answer, rm) = (
            line["train/reward"].as_f64().unwrap(),
            line["train/reward/math-answer"].as_f64().unwrap(),
            line["train/reward/rm"].as_f64().unwrap(),
        );
        assert!(rm.is_finite() && rm != 0.0, "{line}");
        assert!((total - (answer + 0.5 * rm)).abs() < 1e-6, "{line}");
    }
}

/// A process reward model (the tiny Qwen2 standing in, with `#` as its step tag) scores the
/// main job's completions step by step beside the answer checker: its reward, the weakest
/// step's probability, is in (0, 1) and joins the weighted sum.
#[test]
fn a_process_reward_model_scores_completions_beside_a_plugin() {
    let runs = common::scratch("lm-prm");
    let prm = root().join("tests/fixtures/lm/qwen2-gqa");
    let rewards = format!(
        "reward=[{{plugin = \"math-answer\", config = {{extract = \"answer\"}}}}, \
         {{model = {:?}, kind = \"prm\", name = \"prm\", weight = 0.5, prm = {{tag = \" #\"}}}}]",
        prm.display().to_string()
    );
    let recipe = tiny_default(&runs, &["sft.steps=2", rewards.as_str()]);
    let RunOutcome::Lm(_) = rein_train::run(&recipe, &plugin_dir(), true).unwrap() else {
        panic!("a language-model outcome")
    };
    let records = stage_records(&runs, "grpo");
    assert_eq!(records.len(), 2);
    for line in &records {
        let (total, answer, prm) = (
            line["train/reward"].as_f64().unwrap(),
            line["train/reward/math-answer"].as_f64().unwrap(),
            line["train/reward/prm"].as_f64().unwrap(),
        );
        assert!(prm > 0.0 && prm < 1.0, "{line}");
        assert!(line["train/reward/prm/steps"].as_f64().unwrap() >= 1.0, "{line}");
        assert!((total - (answer + 0.5 * prm)).abs() < 1e-6, "{line}");
    }
}

/// GRPO with a reward plugin granted a judge (the policy's own starting model): every
/// completion is judged within the budget, and the judge's usage is logged under the reward's
/// name.
#[test]
fn a_plugin_granted_a_judge_asks_it_for_every_completion() {
    let runs = common::scratch("lm-judge");
    let rewards = "reward=[{plugin = \"math-answer\", config = {extract = \"answer\"}}, \
                   {plugin = \"judge-match\", weight = 0.5, judge = {max_new_tokens = 4}, limits = {timeout_ms = 60000}}]";
    let recipe = tiny_default(&runs, &["sft.steps=2", rewards]);
    let RunOutcome::Lm(outcome) = rein_train::run(&recipe, &plugin_dir(), true).unwrap() else {
        panic!("a language-model outcome")
    };
    let metrics = std::fs::read_to_string(outcome.run_dir.unwrap().join("metrics.jsonl")).unwrap();
    let grpo: Vec<serde_json::Value> = (metrics.lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|l: &serde_json::Value| l["stage"] == "grpo")
        .collect();
    assert_eq!(grpo.len(), 2);
    for line in &grpo {
        let usage = |key: &str| line[format!("train/reward/judge-match/{key}")].as_f64().unwrap();
        let calls = usage("judge_calls");
        // Two groups of four completions at least (dynamic sampling may score more).
        assert!(calls >= 8.0 && calls % 4.0 == 0.0, "{line}");
        assert!(
            usage("judge_tokens") >= calls && usage("judge_tokens") <= 4.0 * calls,
            "{line}"
        );
        assert!(usage("judge_ms") > 0.0, "{line}");
        assert_eq!(usage("judge_failures"), 0.0, "{line}");
        assert!(line["train/reward/judge-match"].as_f64().unwrap().is_finite(), "{line}");
    }
}

/// Two GRPO steps on the tiny Qwen2 over the prompts "one" and "two" (answers 1 and 2), with
/// `sampler` and `algorithm` lines added to their sections and `rewards` (TOML) as the rewards;
/// the run's GRPO records.
fn two_prompt_grpo(name: &str, sampler: &str, algorithm: &str, rewards: &str) -> Vec<serde_json::Value> {
    let dir = common::scratch(name);
    std::fs::write(
        dir.join("train.jsonl"),
        "{\"prompt\": \"one\", \"answer\": \"1\"}\n{\"prompt\": \"two\", \"answer\": \"2\"}\n",
    )
    .unwrap();
    let recipe = format!(
        r#"
seed = 3
[model]
path = {model:?}
[data]
train = "train.jsonl"
[sampler]
n = 4
{sampler}
[algorithm]
name = "grpo"
steps = 2
prompts_per_step = 2
{algorithm}
{rewards}
[eval]
k = 0
[train]
runs_dir = {runs:?}
"#,
        model = root().join("tests/fixtures/lm/qwen2-gqa").display().to_string(),
        runs = dir.join("runs").display().to_string(),
    );
    std::fs::write(dir.join("grpo.toml"), recipe).unwrap();
    let recipe = LoadedRecipe::load(&dir.join("grpo.toml"), &[]).unwrap();
    let RunOutcome::Lm(outcome) = rein_train::run(&recipe, &plugin_dir(), true).unwrap() else {
        panic!("a language-model outcome")
    };
    assert_eq!(outcome.grpo.unwrap().steps, 2);
    stage_records(&dir.join("runs"), "grpo")
}

/// GRPO with no labels: the only training reward is the sampler's self-certainty (the answer
/// checker, at weight 0, measures held-out accuracy), and each step logs its mean, at least
/// `log V` (it is `KL(U ‖ p) + log V`).
#[test]
fn grpo_trains_on_self_certainty_alone() {
    let rewards = "[[reward]]\nsignal = \"self_certainty\"\n[[reward]]\nplugin = \"math-answer\"\nweight = 0.0";
    let records = two_prompt_grpo("lm-self-certainty", "max_new_tokens = 6", "", rewards);
    let vocab = 512f64;
    for r in &records {
        let certainty = r["train/reward/self_certainty"].as_f64().unwrap();
        assert!(certainty >= vocab.ln() - 1e-4, "{r}");
        let reward = r["train/reward"].as_f64().unwrap();
        assert!((reward - certainty).abs() < 1e-6, "the signal is the whole reward: {r}");
    }
}

/// GRPO on step scores (`advantage = "process"`): a Python reward that reads each completion's
/// tokens finds that their texts add up to the completion and that their log-probabilities are
/// the sampler's (negative, finite), and scores its lines; every step logs how many step scores
/// a completion got, and the policy trains on them.
#[test]
fn grpo_trains_on_step_scores_from_a_reward_that_reads_tokens() {
    let plugin = common::test_plugin_path("steps-py").display().to_string();
    let rewards = format!(
        "[[reward]]\nplugin = {plugin:?}\nconfig = {{ steps = \"delimiter: \" }}\n[[reward]]\nplugin = \"math-answer\""
    );
    let algorithm = "advantage = \"process\"\nprocess_gamma = 0.9";
    let records = two_prompt_grpo("lm-process", "max_new_tokens = 12", algorithm, &rewards);
    for r in &records {
        let add_up = r["train/reward/steps-py/tokens_add_up"].as_f64().unwrap();
        assert_eq!(add_up, 1.0, "every completion's token texts add up to it: {r}");
        let logprobs = r["train/reward/steps-py/logprob_sum"].as_f64().unwrap();
        assert!(logprobs < 0.0 && logprobs.is_finite(), "{r}");
        let steps = r["train/step_scores"].as_f64().unwrap();
        assert!(steps > 1.0, "the completions' words are steps: {r}");
    }
}

/// `scratchpad-steps` reads the generated arithmetic task's scratchpads as the generator writes
/// them: every step of a worked solution is correct, and a slipped solution has exactly one
/// wrong step, on the span of the step that slipped.
#[test]
fn the_scratchpad_steps_plugin_checks_the_generated_tasks_steps() {
    use rein_core::{Group, RewardFn};
    let task: rein_posttrain::ArithmeticTask =
        serde_json::from_value(serde_json::json!({ "max_operand": 999, "ops": ["+", "-"], "train": 40, "test": 1 }))
            .unwrap();
    let (examples, _) = rein_posttrain::generate_task(&task, 5);
    let mut rng = rein_sampler::SeededRng::new(5);
    let mut reward = common::load("scratchpad-steps").reward("{}").unwrap();
    for example in &examples {
        let worked = example.completion.clone().unwrap();
        let slipped = rein_posttrain::slipped_solution(&example.prompt, &mut rng).unwrap();
        let group = Group {
            prompt: example.prompt.clone(),
            completions: vec![worked.clone(), slipped.clone()],
            ..Group::default()
        };
        let scores = reward.score(&[group]).unwrap().remove(0);
        // Each step's text and score.
        let steps = |i: usize, text: &str| -> Vec<(String, f64)> {
            let chars: Vec<char> = text.chars().collect();
            (scores[i].steps.iter())
                .map(|s| (chars[s.start..s.end].iter().collect(), s.score))
                .collect()
        };
        let (right, slip) = (steps(0, &worked), steps(1, &slipped));
        assert!(
            !right.is_empty() && right.iter().all(|(_, s)| *s == 1.0),
            "{worked}: {right:?}"
        );
        assert_eq!(right.len(), slip.len());
        for ((good, _), (written, score)) in right.iter().zip(&slip) {
            assert_eq!(*score == 1.0, good == written, "{slipped}: {slip:?}");
        }
        assert_eq!(slip.iter().filter(|(_, s)| *s == 0.0).count(), 1, "{slipped}: {slip:?}");
        assert_eq!(scores[0].score, None, "the outcome is the answer reward's");
    }
}
