//! Multi-turn recipes: episodes with tool calls logged and reported, templates that rewrite
//! earlier turns refused.

use super::*;

/// The calculator recipe with `overrides`, run into `runs`.
fn shrunk_calculator(runs: &Path, overrides: &[&str]) -> (LoadedRecipe, Box<rein_posttrain::LmOutcome>) {
    let overrides: Vec<String> = (overrides.iter().map(|s| s.to_string()))
        .chain([format!("train.runs_dir={:?}", runs.display().to_string())])
        .collect();
    let recipe = LoadedRecipe::load(&root().join("recipes/grpo-calculator.toml"), &overrides).unwrap();
    let RunOutcome::Lm(outcome) = rein_train::run(&recipe, &plugin_dir(), true).unwrap() else {
        panic!("a language-model outcome")
    };
    (recipe, outcome)
}

/// The calculator recipe, shrunk: SFT on conversational traces, multi-turn GRPO with the
/// sandboxed calculator, greedy episodes in both evaluations; its metrics carry the episode
/// figures and report.md their table.
#[test]
fn a_multi_turn_recipe_logs_episodes_and_reports_tool_use() {
    let runs = common::scratch("lm-agent");
    let (_, outcome) = shrunk_calculator(
        &runs,
        &[
            "data.task.train=200",
            "data.task.test=4",
            "sft.steps=4",
            "sft.batch_size=4",
            "algorithm.steps=1",
            "algorithm.prompts_per_step=2",
            "sampler.n=2",
            "sampler.max_new_tokens=8",
            "agent.max_turns=2",
        ],
    );
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

/// A tool that keeps every call's arguments before passing it on: what a tree of episodes
/// asked the tool.
struct Counted {
    tool: Box<dyn rein_core::Tool>,
    calls: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl rein_core::Tool for Counted {
    fn spec(&self) -> &rein_core::ToolSpec {
        self.tool.spec()
    }

    fn call(&mut self, arguments: &str) -> Result<rein_core::ToolOutput, rein_core::ToolError> {
        self.calls.lock().unwrap().push(arguments.to_string());
        self.tool.call(arguments)
    }
}

/// A prompt of text alone, as the task writes it.
fn text_prompt(text: &str) -> rein_posttrain::Prompt {
    rein_posttrain::Prompt {
        text: text.to_string(),
        tokens: Vec::new(),
        answer: None,
        target: None,
        target_trained: None,
        metadata: "{}".into(),
        source: String::new(),
        images: std::sync::Arc::new([]),
        image_files: std::sync::Arc::new([]),
    }
}

/// Trees of multi-turn episodes (ARPO) branch after tool calls. The tiny model is taught by SFT
/// on traces that all call the calculator, and a tree-rollout GRPO step runs with the sandboxed
/// plugin. Then trees grown from the SFT model show: every branch goes on from a copy of its
/// parent's transcript up to a fork right after a tool's reply, and the tool answered each call
/// once (a branch's copy of its parent's reply is not asked again): its calls are exactly the
/// well-formed calls in the leaves' own turns, fewer than the leaves' episodes hold in all.
#[test]
fn a_tree_of_episodes_branches_after_tool_calls_and_asks_the_tool_once_per_call() {
    let runs = common::scratch("lm-agent-tree");
    let (recipe, outcome) = shrunk_calculator(
        &runs,
        &[
            "data.task.train=400",
            "data.task.test=4",
            "data.task.tool_share=1.0",
            "sft.steps=120",
            "sft.batch_size=8",
            "algorithm.steps=1",
            "algorithm.prompts_per_step=2",
            "sampler.n=6",
            "rollout.kind=\"tree\"",
            "rollout.rule=\"tool_calls\"",
            "rollout.trunks=2",
            "rollout.branch_points=2",
            "rollout.branches=2",
        ],
    );
    let dir = outcome.run_dir.unwrap();
    let grpo = stage_records(&runs, "grpo");
    assert!(grpo[0]["rollout/fallback_branch_points"].is_number(), "{:?}", grpo[0]);

    let sft = dir.join("sft");
    let model: rein_model::lm::CausalLm<burn::backend::Flex> = rein_model::lm::load(&sft, &Default::default()).unwrap();
    let tokenizer = rein_model::lm::LmTokenizer::load(&sft, &[]).unwrap();
    let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let calculator = Counted {
        tool: Box::new(common::load("calculator").tool("{}").unwrap()),
        calls: calls.clone(),
    };
    let mut agent = rein_posttrain::rollout::episodes::Agent {
        tools: vec![Box::new(calculator)],
        env: None,
        max_turns: 3,
        max_tokens: 200,
        system_prompt: None,
        images: None,
    };
    let prompts = ["What is 123 * 456?", "What is 907 * 318?", "What is 555 * 702?"].map(text_prompt);
    let chosen: Vec<&rein_posttrain::Prompt> = prompts.iter().collect();
    let config = rein_sampler::GenerationConfig {
        max_new_tokens: 96,
        temperature: 1.0,
        n: 6,
        stop_token_ids: tokenizer.eos_ids().to_vec(),
        seed: 5,
        ..Default::default()
    };
    let spec = recipe.plan().unwrap().rollout().unwrap().tree.unwrap();
    let grown = rein_posttrain::rollout::episode_tree::grow_episodes(
        &model,
        &tokenizer,
        &mut agent,
        &chosen,
        &config,
        0,
        &Default::default(),
        &spec,
    )
    .unwrap();
    assert_eq!(grown.leaves.len(), 3 * 6);
    let own_calls: Vec<String> = (grown.leaves.iter().enumerate())
        .flat_map(|(e, episode)| {
            let t = &episode.transcript;
            let at = grown.branches[e].map_or(0, |b| b.at);
            if let Some(branch) = grown.branches[e] {
                let parent = &grown.leaves[e / 6 * 6 + branch.parent].transcript;
                let shared = t.prompt_len() + at;
                assert_eq!(t.tokens()[..shared], parent.tokens()[..shared], "episode {e}");
                // A fork is right after a tool's reply, where the model's next turn begins.
                let before = tokenizer.decode(&t.tokens()[..shared], false).unwrap();
                let ends = if at > 0 {
                    "</tool_response><|im_end|>\n<|im_start|>assistant\n"
                } else {
                    "<|im_start|>assistant\n"
                };
                assert!(before.ends_with(ends), "episode {e} branches after {before:?}");
            }
            let own = tokenizer.decode(&t.tokens()[t.prompt_len() + at..], false).unwrap();
            rein_posttrain::rollout::tool_calls::parse_tool_calls(&own)
                .into_iter()
                .filter_map(|call| call.ok().filter(|c| c.name == "calculator"))
                .map(|c| c.arguments)
                .collect::<Vec<_>>()
        })
        .collect();
    let forked = grown.branches.iter().flatten().filter(|b| b.at > 0).count();
    assert!(
        forked >= 4,
        "branches from forks: {forked}; {}",
        grown.fallback_branch_points
    );
    let asked = calls.lock().unwrap().clone();
    assert!(asked.len() >= 3, "the SFT model calls the calculator: {asked:?}");
    let (mut asked_sorted, mut own_sorted) = (asked.clone(), own_calls.clone());
    asked_sorted.sort();
    own_sorted.sort();
    assert_eq!(
        asked_sorted, own_sorted,
        "the tool answered exactly the leaves' own calls"
    );
    let held: usize = grown.leaves.iter().map(|e| e.tool_calls).sum();
    assert!(
        asked.len() < held,
        "{} calls asked, {held} in the leaves' episodes",
        asked.len()
    );
}
