"""rein_sandbox.trl.reward_fn: TRL's reward-function contract."""

import inspect
import logging
import pickle

from rein_sandbox import Reward
from rein_sandbox.trl import reward_fn


def test_has_trls_shape():
    fn = reward_fn("math-answer")
    assert fn.__name__ == "math_answer"
    assert reward_fn("math-answer", name="correct").__name__ == "correct"
    params = list(inspect.signature(fn).parameters)
    assert params[:3] == ["prompts", "completions", "completion_ids"]


def test_standard_completions_with_a_reference_column():
    fn = reward_fn("math-answer")
    prompts = ["2+2?", "2+2?", "3+3?", "3+3?"]
    completions = ["<answer>4</answer>", "\\boxed{5}", "#### 6", "seven"]
    # TRL passes every other dataset column as a keyword argument.
    scores = fn(prompts, completions, [[1], [2], [3], [4]], answer=["4", "4", "6", "6"], trainer_state=None)
    assert scores == [1.0, 0.0, 1.0, 0.0]
    assert all(isinstance(s, float) for s in scores)


def test_conversational_completions():
    fn = reward_fn("math-answer", reference_column="solution")
    prompts = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]] * 2
    completions = [
        [{"role": "assistant", "content": "<answer>4</answer>"}],
        [{"role": "assistant", "content": "<answer>5</answer>"}],
    ]
    assert fn(prompts, completions, None, solution=["4", "4"]) == [1.0, 0.0]


def test_completions_of_a_prompt_form_one_group():
    # Majority vote needs the group: the majority answer of each prompt's completions scores 1.
    fn = reward_fn("majority-vote")
    prompts = ["a"] * 3 + ["b"] * 3
    completions = ["<answer>1</answer>", "<answer>1</answer>", "<answer>2</answer>"] * 2
    direct = Reward("majority-vote").score([{"prompt": "a", "completions": completions[:3]}])[0]
    assert fn(prompts, completions, None) == direct * 2


def test_pickles_and_scores_after_unpickling():
    fn = reward_fn("math-answer", timeout_ms=1500, name="acc")
    fn(["q"], ["<answer>1</answer>"], None, reference=["1"])  # loaded before pickling
    clone = pickle.loads(pickle.dumps(fn))
    assert clone.__name__ == "acc"
    assert clone(["q"], ["<answer>1</answer>"], None, reference=["1"]) == [1.0]


def test_a_plugin_that_cannot_load_gives_nones_and_a_warning(tmp_path, caplog):
    bogus = tmp_path / "bogus.wasm"
    bogus.write_bytes(b"not wasm")
    fn = reward_fn(bogus)
    with caplog.at_level(logging.WARNING, logger="rein_sandbox"):
        assert fn(["q", "q"], ["a", "b"], None) == [None, None]
    assert "bogus" in caplog.text


def test_invalid_results_are_nones(hostile, caplog):
    fn = reward_fn(hostile)
    for attack in ["nan", "infinity", "wrong-length", "guest-error", "oversized-output"]:
        assert fn(["q", "q"], ["a", "b"], None, reference=["a", "a"], metadata=[{"attack": attack}] * 2) == [None, None], attack
    assert "non-finite" in caplog.text and "expected 2" in caplog.text
