"""rein_sandbox.verl.compute_score_fn: verl's compute_score contract."""

import pickle

from rein_sandbox.verl import compute_score_fn


def test_single_and_batch_calls():
    compute_score = compute_score_fn("math-answer")
    assert compute_score("openai/gsm8k", "so #### 42", "42", {"question": "6*7?"}) == 1.0
    assert compute_score("openai/gsm8k", "so #### 41", "42") == 0.0
    batch = compute_score(["gsm8k"] * 2, ["#### 42", "#### 1"], ["42", "42"], [None, None])
    assert batch == [1.0, 0.0]


def test_failures_score_the_failure_score(hostile):
    compute_score = compute_score_fn(hostile, failure_score=-1.0, timeout_ms=500)
    assert compute_score("x", "a", "a") == 1.0
    # verl has no metadata column: the hostile plugin is attacked through its init instead.
    sleeper = compute_score_fn(hostile, {"attack": "sleep"}, failure_score=-1.0, timeout_ms=300)
    assert sleeper("x", "a", "a") == -1.0


def test_pickles():
    compute_score = pickle.loads(pickle.dumps(compute_score_fn("math-answer")))
    assert compute_score("d", "#### 3", "3") == 1.0
