//! `[rollout]`: a tree rollout's keys, its group size, and what it refuses.

use super::*;

/// `--set` overrides asking for a tree, then `extra`.
fn tree(extra: &[&'static str]) -> Vec<&'static str> {
    [&["rollout.kind=\"tree\""][..], extra].concat()
}

#[test]
fn a_tree_rollout_reads_its_keys_and_its_leaves_are_the_group() {
    let dir = recipes(&[("grpo.toml", GRPO)]);
    // The defaults: 2 trunks, 1 round of 3 branch points × 2 branches = 8 leaves, sampler.n's default.
    let loaded = load(&dir, "grpo.toml", &tree(&[])).unwrap();
    let section = loaded.plan().unwrap().rollout().unwrap().tree.unwrap();
    assert_eq!(
        (section.trunks, section.branch_points, section.branches, section.rounds),
        (2, 3, 2, 1)
    );
    assert_eq!((section.leaves(), section.rule), (8, rein_recipe::BranchRule::Entropy));
    assert!(loaded.to_toml().contains("branch_points = 3"));
    // Groups (the default kind) read no tree keys, and show none.
    let groups = load(&dir, "grpo.toml", &[]).unwrap();
    assert!(groups.plan().unwrap().rollout().unwrap().tree.is_none());
    assert!(!groups.to_toml().contains("branch_points"));
    for (set, key, says) in [
        (
            vec!["rollout.trunks=3"],
            "rollout.trunks",
            "not a key of kind = \"groups\"",
        ),
        (tree(&["rollout.branches=3"]), "sampler.n", "has 11 leaves"),
        // Sizes whose product overflows are refused as a group of that size would be.
        (
            tree(&["rollout.rounds=9223372036854775807", "rollout.branches=4"]),
            "sampler.n",
            "set sampler.n",
        ),
        (
            tree(&["rollout.branch_points=0"]),
            "rollout.branch_points",
            "at least 1",
        ),
        (
            tree(&["rollout.rule=\"interval\"", "rollout.interval=64"]),
            "rollout.interval",
            "no completion",
        ),
        (tree(&["rollout.step_weight=-1"]), "rollout.step_weight", "≥ 0"),
        (
            tree(&["algorithm.advantage=\"process\""]),
            "algorithm.advantage",
            "credit steps their own way",
        ),
        (
            tree(&["sampler.backend=\"http\"", "sampler.urls=[\"http://localhost:1\"]"]),
            "rollout.rule",
            "servers do not report",
        ),
    ] {
        assert_refused(&dir, "grpo.toml", &set, key, says);
    }
    // Servers sample trees by the interval or line rules.
    let http = tree(&[
        "rollout.rule=\"lines\"",
        "sampler.backend=\"http\"",
        "sampler.urls=[\"http://localhost:1\"]",
    ]);
    assert!(load(&dir, "grpo.toml", &http).is_ok());
}

#[test]
fn trees_of_episodes_branch_after_tool_calls_with_tools_only() {
    let dir = recipes(&[("grpo.toml", GRPO)]);
    let agent =
        |extra: &[&'static str]| tree(&[&["agent.max_turns=3", "tool=[{plugin=\"calculator\"}]"][..], extra].concat());
    let loaded = load(&dir, "grpo.toml", &agent(&["rollout.rule=\"tool_calls\""])).unwrap();
    let tree_rule = loaded.plan().unwrap().rollout().unwrap().tree.unwrap().rule;
    assert_eq!(tree_rule, rein_recipe::BranchRule::ToolCalls);
    for (set, key, says) in [
        // Episodes branch after tool calls, not at tokens.
        (agent(&[]), "rollout.rule", "use rule = \"tool_calls\""),
        (
            agent(&["rollout.rule=\"lines\""]),
            "rollout.rule",
            "use rule = \"tool_calls\"",
        ),
        // Single-turn completions call no tools.
        (tree(&["rollout.rule=\"tool_calls\""]), "rollout.rule", "no [agent]"),
        // A text environment's state cannot be copied into a branch.
        (
            agent(&["rollout.rule=\"tool_calls\"", "agent.env={plugin=\"guess-number\"}"]),
            "agent.env",
            "cannot be copied into a branch",
        ),
    ] {
        assert_refused(&dir, "grpo.toml", &set, key, says);
    }
}

#[test]
fn only_grpo_reads_the_rollout_section() {
    let dir = recipes(&[("dpo.toml", DPO)]);
    assert_refused(
        &dir,
        "dpo.toml",
        &["rollout.kind=\"tree\""],
        "rollout.kind",
        "DPO does not use [rollout]",
    );
}
