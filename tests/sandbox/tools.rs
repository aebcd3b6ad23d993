//! Tools: whatever a call does inside the sandbox, the model gets a message and the same
//! `ToolPlugin` answers the next call; plus the `calculator` and `guess-number` plugins
//! through the host.

use rein_core::{EpisodeStart, PluginErrorKind, TextEnv, Tool, ToolErrorKind, Turn};
use rein_plugin::{SandboxLimits, ToolPlugin};

use super::{common, quick_limits};

fn hostile_tool(limits: SandboxLimits) -> ToolPlugin {
    let plugin = common::load_with(&common::test_plugin_path("hostile-tool"), limits);
    plugin.tool("{}").expect("hostile-tool accepts an empty config")
}

/// The tool answers a harmless call: the instance (or its replacement) works.
fn echoes(tool: &mut ToolPlugin) {
    assert_eq!(tool.call(r#"{"text": "still here"}"#), Ok("still here".into()));
}

#[test]
fn every_attack_becomes_a_message_and_the_tool_recovers() {
    let mut tool = hostile_tool(quick_limits());
    assert_eq!(tool.spec().name, "hostile");
    echoes(&mut tool);
    for (attack, kind, says) in [
        (
            "infinite-loop",
            ToolErrorKind::Timeout,
            "execution timed out after 1000 ms",
        ),
        ("memory-bomb", ToolErrorKind::Limit, "memory limit of 64 MiB"),
        ("deep-recursion", ToolErrorKind::Limit, "overflowed the stack"),
        ("panic", ToolErrorKind::Crash, "the hostile tool panics on purpose"),
        ("refuse", ToolErrorKind::Tool, "I refuse"),
    ] {
        let error = tool.call(&format!(r#"{{"attack": "{attack}"}}"#)).expect_err(attack);
        assert_eq!(error.kind, kind, "{attack}: {}", error.message);
        assert!(error.message.contains(says), "{attack}: {}", error.message);
        echoes(&mut tool);
    }
    // The sandbox's failures are counted; the tool's own refusal is the model's, not counted.
    let failures = tool.failures();
    assert_eq!((failures.timeouts, failures.traps, failures.errors), (1, 3, 0));
}

#[test]
fn oversized_output_is_refused_with_the_limit() {
    let mut tool = hostile_tool(SandboxLimits::default());
    let error = tool.call(r#"{"attack": "oversized-output"}"#).unwrap_err();
    assert_eq!(error.kind, ToolErrorKind::Host);
    assert!(error.message.contains("over the limit"), "{}", error.message);
    echoes(&mut tool);
}

#[test]
fn arguments_that_are_not_an_object_are_the_models_error() {
    let mut tool = hostile_tool(quick_limits());
    for arguments in ["[1, 2]", "not json", "\"text\""] {
        let error = tool.call(arguments).unwrap_err();
        assert_eq!(error.kind, ToolErrorKind::Tool, "{arguments}");
    }
    echoes(&mut tool);
}

#[test]
fn an_invalid_spec_is_refused_at_load_naming_the_field() {
    let plugin = common::load_with(&common::test_plugin_path("hostile-tool"), quick_limits());
    for (spec, says) in [
        ("bad-name", "tool name `rm -rf`"),
        ("bad-schema", "`parameters` is not a JSON object"),
    ] {
        let error = plugin.tool(&format!(r#"{{"spec": "{spec}"}}"#)).unwrap_err();
        assert_eq!(error.call, Some("init"));
        assert!(matches!(error.kind, PluginErrorKind::InvalidOutput(_)), "{error}");
        assert!(error.to_string().contains(says), "{error}");
    }
    let wrong_kind = plugin.reward("{}").unwrap_err();
    assert!(
        wrong_kind.to_string().contains("is a tool plugin, not a reward plugin"),
        "{wrong_kind}"
    );
}

#[test]
fn the_calculator_computes_exactly_in_the_sandbox() {
    let mut calculator = common::load("calculator").tool("{}").unwrap();
    assert_eq!(calculator.spec().name, "calculator");
    let schema: serde_json::Value = serde_json::from_str(&calculator.spec().parameters).unwrap();
    assert_eq!(schema["required"][0], "expression");
    assert_eq!(
        calculator.call(r#"{"expression": "4821 * 7390"}"#),
        Ok("35627190".into())
    );
    let error = calculator.call(r#"{"expression": "1/0"}"#).unwrap_err();
    assert_eq!(
        (error.kind, error.message.as_str()),
        (ToolErrorKind::Tool, "division by zero")
    );
}

#[test]
fn guess_number_plays_batched_episodes_and_forgets_closed_ones() {
    let mut env = common::load("guess-number").text_env("{}").unwrap();
    let start = |id: u64, secret: &str| EpisodeStart {
        id,
        group: 0,
        prompt: "Guess my number (1-100).".into(),
        reference: Some(secret.into()),
        metadata: String::new(),
        images: Vec::new(),
    };
    let openings = env.reset(&[start(1, "30"), start(2, "70")]).unwrap();
    assert_eq!(openings.len(), 2);
    assert_eq!(openings[0].messages[0].role, "user");
    let turn = |id: u64, content: &str| Turn {
        id,
        content: content.into(),
    };
    let replies = env.step(&[turn(1, "50"), turn(2, "50")]).unwrap();
    assert!(replies[0].messages[0].content.starts_with("Lower."));
    assert!(replies[1].messages[0].content.starts_with("Higher."));
    assert_eq!(replies[0].state_key.as_deref(), Some("1-49"));
    let found = env.step(&[turn(2, "70")]).unwrap();
    assert_eq!((found[0].done, found[0].reward), (true, Some(1.0)));
    env.close(&[2]);
    let error = env.step(&[turn(2, "70")]).unwrap_err();
    assert!(error.to_string().contains("episodes 2 are not open"), "{error}");
    // Episode 1 lives on.
    assert!(!env.step(&[turn(1, "25")]).unwrap()[0].done);
    let duplicate = env.reset(&[start(1, "5")]).unwrap_err();
    assert!(
        duplicate.to_string().contains("episode 1 is already open"),
        "{duplicate}"
    );
}

#[test]
fn python_exec_turns_hostile_code_into_messages() {
    let plugin = common::load_with(&common::plugin_path("python-exec"), quick_limits());
    let mut python = plugin.tool("{}").unwrap();
    assert_eq!(python.spec().name, "python");
    let run = |tool: &mut ToolPlugin, code: &str| tool.call(&serde_json::json!({ "code": code }).to_string());
    assert_eq!(run(&mut python, "print(sum(range(10)))"), Ok("45\n".into()));
    // A loop inside C code is out of the plugin's step budget's reach: the host's deadline.
    let looped = run(&mut python, "print(sum(range(10**12)))").unwrap_err();
    assert_eq!(looped.kind, ToolErrorKind::Timeout, "{}", looped.message);
    assert_eq!(looped.message, "execution timed out after 1000 ms");
    assert_eq!(run(&mut python, "print('back')"), Ok("back\n".into()));
    // CPython raises MemoryError when the sandbox refuses to grow memory, or the allocation
    // traps: either way the model reads about memory.
    let bomb = run(&mut python, "x = []\nwhile True:\n    x.append(' ' * 10**7)").unwrap_err();
    assert!(
        matches!(bomb.kind, ToolErrorKind::Limit | ToolErrorKind::Tool),
        "{bomb:?}"
    );
    assert!(bomb.message.to_lowercase().contains("memory"), "{}", bomb.message);
    assert_eq!(run(&mut python, "print('back')"), Ok("back\n".into()));
}

/// One call's code cannot change what a later call sees, nor end the instance: the isolation
/// unit of `python-exec` is one call (the tool is loaded once per run and shared by every
/// episode). Each pair is (the planting call, a later call and what it must print).
#[test]
fn python_exec_calls_start_from_the_same_interpreter_whatever_earlier_calls_did() {
    let plugin = common::load_with(&common::plugin_path("python-exec"), quick_limits());
    let mut python = plugin.tool(r#"{"max_steps": 100000}"#).unwrap();
    let mut run = |code: &str| python.call(&serde_json::json!({ "code": code }).to_string());
    let lone_random = run("import random\nprint(random.random())").unwrap();
    let leaks = [
        (
            "import builtins\nbuiltins.print = lambda *a, **k: None",
            "print('hi')",
            "hi\n",
        ),
        ("import builtins\ndel builtins.len", "print(len('abc'))", "3\n"),
        ("__builtins__.len = lambda x: 0", "print(len('abc'))", "3\n"),
        (
            "import json\njson.dumps = lambda *a, **k: 'patched'",
            "import json\nprint(json.dumps([1]))",
            "[1]\n",
        ),
        (
            "import sys\nsys.setrecursionlimit(60)",
            "def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\nprint(f(200))",
            "200\n",
        ),
        (
            "import sys, types\nm = types.ModuleType('math')\nm.pi = 3\nsys.modules['math'] = m",
            "import math\nprint(math.pi)",
            "3.141592653589793\n",
        ),
        (
            "import collections\ncollections.Counter.most_common = lambda self, n=None: 'hacked'",
            "from collections import Counter\nprint(Counter('aab').most_common(1))",
            "[('a', 2)]\n",
        ),
        ("import gc\ngc.disable()", "import gc\nprint(gc.isenabled())", "True\n"),
    ];
    for (plant, probe, expected) in leaks {
        let _ = run(plant);
        assert_eq!(run(probe), Ok(expected.into()), "after `{plant}`");
    }
    let _ = run("import random\nrandom.seed(0)");
    assert_eq!(run("import random\nprint(random.random())"), Ok(lone_random));
    let contained = [
        ("import os\nos._exit(0)", "cannot end the process here"),
        (
            "import time\ntime.sleep(3600)",
            "execution stopped after 100000 steps (`max_steps`)",
        ),
        (
            "while True:\n    pass",
            "execution stopped after 100000 steps (`max_steps`)",
        ),
        (
            "import sys\ntry:\n    sys.settrace(None)\nexcept BaseException:\n    pass\nwhile True:\n    pass",
            "execution stopped after 100000 steps (`max_steps`)",
        ),
    ];
    for (code, message) in contained {
        let error = run(code).unwrap_err();
        assert_eq!(error.kind, ToolErrorKind::Tool, "`{code}`: {error:?}");
        assert!(error.message.contains(message), "`{code}`: {}", error.message);
        assert_eq!(run("print('alive')"), Ok("alive\n".into()), "after `{code}`");
    }
    let failures = python.failures();
    assert_eq!((failures.timeouts, failures.traps), (0, 0), "{failures:?}");
}
