"""rein_sandbox.gym: environment plugins as Gymnasium environments."""

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rein_sandbox.gym as rgym
from rein_sandbox import PluginError


@pytest.mark.parametrize("name", ["cartpole", "pendulum"])
def test_passes_gymnasiums_env_checker(name):
    env = rgym.make(name)
    check_env(env, skip_render_check=True)


def test_cartpole_is_cartpole():
    env = rgym.make("cartpole")
    obs, info = env.reset(seed=3)
    assert obs.dtype == np.float32 and obs.shape == (4,)
    assert np.all(np.abs(obs) <= 0.05)  # Gymnasium's initial state: uniform in ±0.05
    steps, total = 0, 0.0
    terminated = truncated = False
    while not (terminated or truncated):
        obs, reward, terminated, truncated, info = env.step(1)  # always push right: falls soon
        steps, total = steps + 1, total + reward
    assert terminated and not truncated
    assert 5 <= steps <= 30 and total == steps


def test_pendulum_takes_array_actions():
    env = rgym.make("pendulum", max_episode_steps=5)
    env.reset(seed=0)
    for _ in range(5):
        obs, reward, terminated, truncated, _ = env.step(np.array([0.5], dtype=np.float32))
        assert obs.shape == (3,) and reward <= 0.0
    assert truncated and not terminated


def test_vector_env_equals_single_envs():
    num_envs, seed = 4, 11
    envs = rgym.make_vec("cartpole", num_envs)
    singles = [rgym.make("cartpole") for _ in range(num_envs)]
    obs, _ = envs.reset(seed=seed)
    expected = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(singles)])
    np.testing.assert_array_equal(obs, expected)
    rng = np.random.default_rng(0)
    ended_seen = 0
    for _ in range(60):
        actions = rng.integers(0, 2, num_envs)
        obs, rewards, terminated, truncated, infos = envs.step(actions)
        for i, env in enumerate(singles):
            o, r, te, tr, _ = env.step(actions[i])
            assert rewards[i] == r and terminated[i] == te and truncated[i] == tr
            if te or tr:
                ended_seen += 1
                assert infos["_final_obs"][i]
                np.testing.assert_array_equal(infos["final_obs"][i], o)
                o, _ = env.reset()  # same-step autoreset continues the env's own generator
            np.testing.assert_array_equal(obs[i], o)
    assert ended_seen > 0


def test_vector_seeds_must_be_consecutive():
    envs = rgym.make_vec("pendulum", 2)
    with pytest.raises(ValueError, match="consecutive"):
        envs.reset(seed=[1, 5])


def test_a_reward_plugin_is_not_an_environment():
    with pytest.raises(PluginError, match="math-answer"):
        rgym.make("math-answer")


def test_bad_config_is_the_plugins_error():
    with pytest.raises(PluginError):
        rgym.make("cartpole", gravity="strong")
