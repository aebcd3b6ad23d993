"""Stable-Baselines3 PPO on CartPole-v1 for `cargo xtask bench ppo`: seconds until the mean
return of the last 20 episodes reaches the target, per seed.

rl-zoo's tuned CartPole-v1 hyperparameters (8 envs, n_steps 32, batch 256, 20 epochs,
gamma 0.98, lambda 0.8, linear lr 1e-3 and clip 0.2). The clock starts when `learn` starts,
after the environments and the model exist, as rein's does (its driver starts after the
plugins are loaded and the model built).

Usage: sb3_ppo.py SEED [SEED ...]   prints one JSON object per line
"""

import json
import sys
import time

import gymnasium as gym
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

TARGET = 475.0
WINDOW = 20
MAX_STEPS = 300_000


def linear(start):
    return lambda progress_remaining: progress_remaining * start


class StopAtTarget(BaseCallback):
    """Stops training once the last WINDOW episodes average TARGET; records when."""

    def __init__(self):
        super().__init__()
        self.returns = []
        self.solved_at = None

    def _on_step(self):
        for info in self.locals["infos"]:
            episode = info.get("episode")
            if episode is not None:
                self.returns.append(episode["r"])
        recent = self.returns[-WINDOW:]
        if len(recent) == WINDOW and sum(recent) / WINDOW >= TARGET:
            self.solved_at = (self.num_timesteps, time.perf_counter())
            return False
        return True


def run(seed):
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    stop = StopAtTarget()
    start = time.perf_counter()
    model.learn(total_timesteps=MAX_STEPS, callback=stop)
    if stop.solved_at is None:
        return {"seed": seed, "solved": False, "seconds": time.perf_counter() - start, "steps": MAX_STEPS}
    steps, at = stop.solved_at
    return {"seed": seed, "solved": True, "seconds": at - start, "steps": steps}


if __name__ == "__main__":
    torch.set_num_threads(2)
    print(json.dumps({"versions": {"stable_baselines3": __import__("stable_baselines3").__version__,
                                   "torch": torch.__version__, "gymnasium": gym.__version__}}), flush=True)
    for seed in sys.argv[1:]:
        print(json.dumps(run(int(seed))), flush=True)
