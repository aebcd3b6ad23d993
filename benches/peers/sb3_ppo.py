"""Stable-Baselines3 PPO on CartPole-v1 with rl-zoo's tuned hyperparameters, for
`cargo xtask bench ppo`: seconds until the target return, per seed.

rl-baselines3-zoo's `hyperparams/ppo.yml`, CartPole-v1 entry, verbatim: n_envs 8,
n_timesteps 1e5, policy MlpPolicy, n_steps 32, batch_size 256, gae_lambda 0.8, gamma 0.98,
n_epochs 20, ent_coef 0.0, learning_rate lin_0.001, clip_range lin_0.2; everything else SB3's
defaults (as the zoo leaves it), the envs made by `make_vec_env` (DummyVecEnv, Monitor) with
the seed. The zoo's `lin_X` is `progress_remaining * X`, and progress runs over n_timesteps:
so `learn(total_timesteps=1e5)`, as the zoo calls it; a seed that has not reached the target
by then is reported unsolved. verbose=0 (the zoo's verbose=1 prints a table every update).

Stop rule, the same on all three sides (rein, this script, cleanrl_ppo.py): after each whole
update (rollout, then `train()`), the mean return of the last 20 training episodes finished so
far (Monitor's episode returns) is compared with 475; once it is reached the run stops,
reporting the seconds to that point and the update / env-step count. SB3 has no hook right
after `train()`, so the check runs in the callback's `_on_rollout_start` from the second
rollout on (nothing runs between the end of `train()` and it but the loop's bookkeeping), the
clock read there, and the rollout then stopped at its first step; and in
`_on_training_end` for the last update. The clock starts when `learn` is called, after the
environments and the model exist, as rein's does.

Usage: sb3_ppo.py SEED [SEED ...] [--threads 2] [--target 475] [--window 20]
Prints one JSON object: {"label", "stop_rule", "hyperparameters", "threads", "blas",
"versions", "runs": [{"seed", "solved", "seconds", "updates", "env_steps", "episodes",
"mean_return"}, ...]}; one line per seed on stderr.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peer_common  # noqa: E402

if __name__ == "__main__":
    peer_common.limit_threads()

import argparse  # noqa: E402
import time  # noqa: E402

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import stable_baselines3  # noqa: E402
import torch  # noqa: E402
from stable_baselines3 import PPO  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402

LABEL = "SB3 (rl-zoo hyperparameters)"
ENV_ID = "CartPole-v1"
# rl-baselines3-zoo hyperparams/ppo.yml, CartPole-v1 ("# Tuned").
ZOO = {
    "n_envs": 8,
    "n_timesteps": 100_000,
    "policy": "MlpPolicy",
    "n_steps": 32,
    "batch_size": 256,
    "gae_lambda": 0.8,
    "gamma": 0.98,
    "n_epochs": 20,
    "ent_coef": 0.0,
    "learning_rate": "lin_0.001",
    "clip_range": "lin_0.2",
}


def linear_schedule(initial):
    """rl-zoo's `lin_X`: X times the progress remaining (1 at the start, 0 at n_timesteps)."""
    return lambda progress_remaining: progress_remaining * initial


def schedule(value):
    if isinstance(value, str) and value.startswith("lin_"):
        return linear_schedule(float(value[len("lin_"):]))
    return value


class StopAtTarget(BaseCallback):
    """Records finished episodes' returns; after each whole update, stops once the last
    `window` of them average `target`, recording when."""

    def __init__(self, target, window):
        super().__init__()
        self.target, self.window = target, window
        self.returns = []
        self.rollouts = 0  # rollouts started; each one before this was followed by train()
        self.start = None
        self.solved = None  # (updates, env_steps, seconds, mean)
        self.stop = False

    def mean_return(self):
        recent = self.returns[-self.window:]
        return sum(recent) / self.window if len(recent) == self.window else None

    def _check(self, updates):
        mean = self.mean_return()
        if self.solved is None and mean is not None and mean >= self.target:
            self.solved = (updates, self.num_timesteps, time.perf_counter() - self.start, mean)
            self.stop = True

    def _on_rollout_start(self):
        # Called at the start of every rollout: from the second on, right after the previous
        # update's train().
        if self.rollouts >= 1:
            self._check(self.rollouts)
        self.rollouts += 1

    def _on_step(self):
        if self.stop:  # the target was reached at the end of the previous update
            return False
        for info in self.locals["infos"]:
            episode = info.get("episode")
            if episode is not None:
                self.returns.append(float(episode["r"]))
        return True

    def _on_training_end(self):
        # The last update ran to total_timesteps: no rollout start follows it.
        if not self.stop and self.rollouts >= 1:
            self._check(self.rollouts)


def run(seed, target, window):
    env = make_vec_env(ENV_ID, n_envs=ZOO["n_envs"], seed=seed)
    model = PPO(
        ZOO["policy"],
        env,
        n_steps=ZOO["n_steps"],
        batch_size=ZOO["batch_size"],
        gae_lambda=ZOO["gae_lambda"],
        gamma=ZOO["gamma"],
        n_epochs=ZOO["n_epochs"],
        ent_coef=ZOO["ent_coef"],
        learning_rate=schedule(ZOO["learning_rate"]),
        clip_range=schedule(ZOO["clip_range"]),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    stop = StopAtTarget(target, window)
    stop.start = time.perf_counter()
    model.learn(total_timesteps=ZOO["n_timesteps"], callback=stop)
    if stop.solved is None:
        return {"seed": seed, "solved": False, "seconds": time.perf_counter() - stop.start,
                "updates": stop.rollouts, "env_steps": model.num_timesteps, "episodes": len(stop.returns),
                "mean_return": stop.mean_return()}
    updates, steps, seconds, mean = stop.solved
    return {"seed": seed, "solved": True, "seconds": seconds, "updates": updates, "env_steps": steps,
            "episodes": len(stop.returns), "mean_return": mean}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("seeds", type=int, nargs="+")
    parser.add_argument("--target", type=float, default=475.0, help="mean return to reach (475)")
    parser.add_argument("--window", type=int, default=20, help="episodes in the mean (20)")
    peer_common.add_threads_argument(parser)
    args = parser.parse_args()
    out = peer_common.Stdout()
    peer_common.configure_torch(torch, args.threads)
    runs = []
    for seed in args.seeds:
        result = run(seed, args.target, args.window)
        peer_common.log(result)
        runs.append(result)
    out.emit({
        "label": LABEL,
        "stop_rule": f"after each whole update: mean return of the last {args.window} finished "
                     f"training episodes >= {args.target}",
        "hyperparameters": {"env_id": ENV_ID, **ZOO},
        "threads": args.threads,
        "blas": peer_common.torch_blas(torch),
        "versions": peer_common.versions(stable_baselines3, torch, gym, np),
        "runs": runs,
    })


if __name__ == "__main__":
    main()
