"""Hostile plugins called from worker threads: each call ends at its limit (within 2×), fails
only itself, and lets other Python threads run meanwhile (the GIL is released)."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rein_sandbox import PluginError, Reward
from rein_sandbox.trl import reward_fn

LIMIT_MS = 1000


def attack(name):
    return {"prompt": "p", "completions": ["a", "b"], "reference": "a", "metadata": {"attack": name}}


@pytest.mark.parametrize("name", ["sleep", "sleep-forever", "spin-on-clock", "infinite-loop", "memory-bomb", "deep-recursion", "panic"])
def test_attack_from_a_worker_thread_is_a_none_within_twice_the_limit(hostile, name, caplog):
    fn = reward_fn(hostile, timeout_ms=LIMIT_MS, memory_mib=64)
    fn([""], ["warm"], reference=["warm"])  # load and compile outside the timed call

    def call():
        start = time.monotonic()
        scores = fn(["p", "p"], ["a", "b"], reference=["a", "a"], metadata=[{"attack": name}] * 2)
        return scores, time.monotonic() - start

    with ThreadPoolExecutor(1) as pool:
        scores, elapsed = pool.submit(call).result(timeout=30)
    assert scores == [None, None]
    assert elapsed < 2 * LIMIT_MS / 1000, f"{name} took {elapsed:.2f} s against a {LIMIT_MS} ms limit"
    assert any("hostile-reward" in r.getMessage() for r in caplog.records)
    # The same function scores the next, honest batch.
    assert fn(["p", "p"], ["a", "b"], reference=["a", "a"]) == [1.0, 0.0]


def test_the_deadline_is_named(hostile):
    reward = Reward(hostile, timeout_ms=300)
    with pytest.raises(PluginError, match=r"300 ?ms"):
        reward.score([attack("infinite-loop")])


def test_one_hostile_group_costs_only_its_own_scores(hostile):
    fn = reward_fn(hostile, timeout_ms=LIMIT_MS)
    scores = fn(
        ["p1", "p1", "p2", "p2"],
        ["a", "b", "a", "c"],
        reference=["a", "a", "a", "a"],
        metadata=[None, None, {"attack": "panic"}, {"attack": "panic"}],
    )
    assert scores == [1.0, 0.0, None, None]


def test_scoring_releases_the_gil(hostile):
    reward = Reward(hostile, timeout_ms=LIMIT_MS)
    ticks = 0
    done = threading.Event()

    def count():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    try:
        with pytest.raises(PluginError):
            reward.score([attack("infinite-loop")])
    finally:
        done.set()
        counter.join()
    # A thread holding the GIL for the whole second would leave the counter at about 1.
    assert ticks > 50, f"the counter thread ran {ticks} times in a {LIMIT_MS} ms call"


def test_threads_share_one_reward_safely():
    reward = Reward("math-answer")
    group = {"prompt": "2+2", "completions": ["<answer>4</answer>", "5"], "reference": "4"}
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: reward.score([group] * 8), range(16)))
    assert all(r == [[1.0, 0.0]] * 8 for r in results)
