"""Gymnasium's CartPole throughput on this machine, for `cargo xtask bench plugins`.

Prints JSON: env-steps/s of CartPoleVectorEnv at 256 envs, and of one gym.make env.
"""

import json
import time

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv


def rate(step, work, seconds=1.5):
    step()
    rates = []
    for _ in range(5):
        start, n = time.perf_counter(), 0
        while time.perf_counter() - start < seconds / 5:
            step()
            n += 1
        rates.append(work * n / (time.perf_counter() - start))
    return sorted(rates)[len(rates) // 2]


vec = CartPoleVectorEnv(num_envs=256)
vec.reset(seed=0)
actions = (np.arange(256) * 7 + np.arange(256) // 3) % 2
vector_rate = rate(lambda: vec.step(actions), 256)

env = gym.make("CartPole-v1")
env.reset(seed=0)
flip = [0]


def single():
    flip[0] ^= 1
    _, _, terminated, truncated, _ = env.step(flip[0])
    if terminated or truncated:
        env.reset()


single_rate = rate(single, 1)
print(json.dumps({"vector_256": vector_rate, "single": single_rate}))
