//! Multi-turn recipes: episodes with tool calls logged and reported, templates that rewrite
//! earlier turns refused.

use super::*;

/// The calculator recipe, shrunk: SFT on conversational traces, multi-turn GRPO with the
/// sandboxed calculator, greedy episodes in both evaluations; its metrics carry the episode
/// figures and report.md their table.
#[test]
fn a_multi_turn_recipe_logs_episodes_and_reports_tool_use() {
    let runs = common::scratch("lm-agent");
    let overrides: Vec<String> = [
        "data.task.train=200",
        "data.task.test=4",
        "sft.steps=4",
        "sft.batch_size=4",
        "algorithm.steps=1",
        "algorithm.prompts_per_step=2",
        "sampler.n=2",
        "sampler.max_new_tokens=8",
        "agent.max_turns=2",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("train.runs_dir={:?}", runs.display().to_string())])
    .collect();
    let recipe = LoadedRecipe::load(&root().join("recipes/grpo-calculator.toml"), &overrides).unwrap();
    let RunOutcome::Lm(outcome) = rein_train::run(&recipe, &plugin_dir(), true).unwrap() else {
        panic!("a language-model outcome")
    };
    for report in [outcome.before.unwrap(), outcome.after.unwrap()] {
        let episodes = report.episodes.expect("greedy episodes in the evaluation");
        assert!((1.0..=2.0).contains(&episodes.turns), "{episodes:?}");
    }
    let dir = outcome.run_dir.unwrap();
    let metrics = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    let grpo: serde_json::Value = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["stage"] == "grpo")
        .unwrap();
    for key in [
        "episode/turns",
        "episode/tool_calls",
        "episode/env_token_share",
        "episode/truncated_frac",
        "episode/tool_errors/malformed",
        "episode/tool_errors/timeout",
    ] {
        assert!(grpo[key].is_number(), "{key} missing from {grpo}");
    }
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        report.contains("| greedy episodes | turns | tool-call rate | tool errors | truncated |"),
        "{report}"
    );
}

/// A multi-turn recipe whose chat template rewrites earlier turns (Qwen3's habit of dropping
/// an earlier assistant turn's `<think>` block) is refused at start-up, before any training,
/// with an error naming the drift.
#[test]
fn a_multi_turn_recipe_refuses_a_template_that_rewrites_earlier_turns() {
    let runs = common::scratch("lm-drift");
    let tokenizer = runs.join("drifting-tokenizer");
    std::fs::create_dir_all(&tokenizer).unwrap();
    let assets = root().join("recipes/assets/arithmetic-tokenizer");
    std::fs::copy(assets.join("tokenizer.json"), tokenizer.join("tokenizer.json")).unwrap();
    let template = "{% for message in messages %}{% set content = message['content'] %}\
        {% if message['role'] == 'assistant' and not loop.last %}{% set content = content.split('</think>')[-1] %}{% endif %}\
        {{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}{% endfor %}\
        {% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    let config = serde_json::json!({"chat_template": template, "eos_token": "<|im_end|>"});
    std::fs::write(tokenizer.join("tokenizer_config.json"), config.to_string()).unwrap();
    let overrides = vec![
        format!("model.tokenizer={:?}", tokenizer.display().to_string()),
        format!("train.runs_dir={:?}", runs.display().to_string()),
    ];
    let recipe = LoadedRecipe::load(&root().join("recipes/grpo-calculator.toml"), &overrides).unwrap();
    let error = rein_train::run(&recipe, &plugin_dir(), true).unwrap_err();
    let text = error.to_string();
    assert!(text.contains("<think>"), "{text}");
    assert!(
        !std::fs::read_dir(&runs)
            .unwrap()
            .any(|e| e.unwrap().path().join("metrics.jsonl").exists()),
        "refused before training"
    );
}
