"""rein_sandbox.Reward: the same scores as `rein plugin score`, clear errors, pickling."""

import json
import pickle
import subprocess

import pytest

import rein_sandbox
from rein_sandbox import PluginError, Reward

GROUPS = [
    {"prompt": "What is 1/2 as a decimal?", "completions": ["\\boxed{0.5}", "<answer>2</answer>", "no idea"], "reference": "#### 1/2"},
    {"prompt": "2 + 2?", "completions": ["<think>easy</think><answer>4</answer>", "<answer>5</answer>"], "reference": "4"},
    {"prompt": "Pick a number", "completions": ["7", "7", "8", "<answer>7</answer>"], "reference": None, "metadata": {"source": "test"}},
]


def cli_scores(rein_bin, plugin_dir, tmp_path, plugin, config):
    groups = tmp_path / "groups.jsonl"
    with groups.open("w") as f:
        for g in GROUPS:
            g = dict(g, metadata=json.dumps(g["metadata"]) if "metadata" in g else "")
            f.write(json.dumps(g) + "\n")
    out = subprocess.run(
        [str(rein_bin), "plugin", "score", str(plugin_dir / f"{plugin}.wasm"), "--input", str(groups), "--config", json.dumps(config)],
        check=True, capture_output=True, text=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines()]


@pytest.mark.parametrize(
    "plugin, config",
    [
        ("math-answer", {}),
        ("format-tags", {"strict": False}),
        ("majority-vote", {}),
        ("length-penalty", {"max_length": 30, "cache_length": 20}),
    ],
)
def test_scores_equal_rein_plugin_score(rein_bin, plugin_dir, tmp_path, plugin, config):
    expected = cli_scores(rein_bin, plugin_dir, tmp_path, plugin, config)
    reward = Reward(plugin, config)
    detailed = reward.score_detailed(GROUPS)
    assert [[s["score"] for s in g] for g in detailed] == [line["scores"] for line in expected]
    assert [[s["components"] for s in g] for g in detailed] == [line["components"] for line in expected]
    # The built-in and the file built for the CLI are the same plugin.
    assert Reward(plugin_dir / f"{plugin}.wasm", config).score(GROUPS) == reward.score(GROUPS)


def test_builtins_are_listed():
    names = rein_sandbox.builtin_plugins()
    for name in ["math-answer", "format-tags", "majority-vote", "cartpole", "pendulum"]:
        assert name in names
    assert Reward("math-answer").name == "math-answer"


def test_unknown_builtin_names_the_choices():
    with pytest.raises(ValueError, match=r"no built-in plugin 'math-answr'.*math-answer"):
        Reward("math-answr")


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.wasm"):
        Reward(tmp_path / "nope.wasm")


def test_not_a_plugin_is_a_plugin_error(tmp_path):
    bogus = tmp_path / "bogus.wasm"
    bogus.write_bytes(b"\0asm not really")
    with pytest.raises(PluginError, match="bogus"):
        Reward(bogus)


def test_bad_config_is_refused_by_the_plugin():
    with pytest.raises(PluginError, match="strict"):
        Reward("format-tags", {"strict": "very"})


def test_bad_limits_name_the_limit():
    with pytest.raises(ValueError, match="memory"):
        Reward("math-answer", memory_mib=0)


def test_bad_groups_are_value_errors():
    reward = Reward("math-answer")
    with pytest.raises(ValueError, match="unknown keys"):
        reward.score([{"prompt": "p", "completions": ["a"], "answer": "a"}])
    with pytest.raises(ValueError, match=r"groups\[0\] has no 'completions'"):
        reward.score([{"prompt": "p"}])


@pytest.mark.parametrize(
    "groups, message",
    [
        ("abc", r"groups must be a list of dicts.*got str"),
        ({"completions": ["a"]}, r"groups must be a list of dicts.*got dict"),
        (3, r"groups must be a list of dicts.*got int"),
        (["abc"], r"groups\[0\] must be a dict.*got str"),
        ([{"completions": "abc"}], r"groups\[0\]\['completions'\] must be a list of strings, got str"),
        ([{"completions": ["a"]}, {"completions": [3]}], r"groups\[1\]\['completions'\]\[0\] must be a string, got int"),
        ([{"completions": [None]}], r"\['completions'\]\[0\] must be a string, got NoneType"),
        ([{"completions": ["a"], "prompt": 7}], r"groups\[0\]\['prompt'\] must be a string, got int"),
        ([{"completions": ["a"], "reference": ["4"]}], r"\['reference'\] must be a string, a number or None, got list"),
        ([{"completions": ["a"], "metadata": {1, 2}}], r"\['metadata'\] must be a string or JSON-serialisable"),
    ],
)
def test_wrong_types_are_type_errors_naming_the_argument(groups, message):
    reward = Reward("math-answer")
    with pytest.raises(TypeError, match=message):
        reward.score(groups)
    # The reward still scores after each.
    assert reward.score([{"completions": ["\\boxed{4}"], "reference": 4}]) == [[1.0]]


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"plugin": 3}, TypeError, r"plugin must be a built-in plugin's name or the path of a .wasm file, got int"),
        ({"plugin": "math-answer", "config": ["strict"]}, TypeError, r"config must be a dict.*got list"),
        ({"plugin": "math-answer", "config": {"x": {1}}}, ValueError, r"config cannot be written as JSON"),
        ({"plugin": "math-answer", "timeout_ms": "100"}, TypeError, r"timeout_ms must be a whole number or None, got str"),
        ({"plugin": "math-answer", "fuel": 1.5}, TypeError, r"fuel must be a whole number or None, got float"),
        ({"plugin": "math-answer", "stack_kib": True}, TypeError, r"stack_kib must be a whole number or None, got bool"),
        ({"plugin": "math-answer", "memory_mib": -1}, ValueError, r"memory_mib must be in 0..2\*\*64, got -1"),
    ],
)
def test_wrong_arguments_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        Reward(**kwargs)


def test_pickles_as_its_recipe():
    reward = Reward("format-tags", {"strict": False}, timeout_ms=1500)
    clone = pickle.loads(pickle.dumps(reward))
    assert clone.limits.timeout_ms == 1500
    assert clone.score(GROUPS) == reward.score(GROUPS)
