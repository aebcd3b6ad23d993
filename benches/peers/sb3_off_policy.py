"""Stable-Baselines3 SAC or TD3 on Pendulum-v1, for `cargo xtask bench sac` / `bench td3`:
seconds until the target return, per seed.

Two settings (`--settings`):
- `zoo`: rl-baselines3-zoo's Pendulum entries, everything else SB3's defaults as the zoo leaves
  them. `hyperparams/sac.yml`, Pendulum-v1: n_timesteps 20000, MlpPolicy, learning_rate 1e-3
  (SB3's defaults: net_arch [256, 256], buffer 1e6, learning_starts 100, batch 256, tau 0.005,
  gamma 0.99, train_freq 1, gradient_steps 1, ent_coef "auto"). `hyperparams/td3.yml`,
  Pendulum: noise_type normal, noise_std 0.1, learning_starts 1000 (SB3's defaults:
  net_arch [400, 300], learning_rate 1e-3, buffer 1e6, batch 256, tau 0.005, gamma 0.99,
  policy_delay 2, target_policy_noise 0.2, target_noise_clip 0.5); n_timesteps 20000 as SAC's.
- `rein`: the settings of rein's recipes (recipes/sac-pendulum.toml, td3-pendulum.toml): net_arch
  [64, 64], buffer 100000, learning_starts 1000, batch 256, learning rates 1e-3, tau 0.005,
  gamma 0.99; SAC's entropy temperature learned toward -act_dim; TD3's exploration noise 0.1,
  policy delay 2.

Stop rule, the same as rein's: after every environment step at which an episode ends, the mean
return of the last 10 finished training episodes (Monitor's returns) is compared with -200; once
reached the run stops, reporting the seconds to that point and the env steps. The clock starts
when `learn` is called, after the environment and the model exist, as rein's does.

Usage: sb3_off_policy.py {sac,td3} SEED [SEED ...] [--settings zoo|rein] [--threads 2]
Prints one JSON object: {"label", "stop_rule", "hyperparameters", "threads", "blas", "versions",
"runs": [{"seed", "solved", "seconds", "env_steps", "episodes", "mean_return"}, ...]}; one line
per seed on stderr.
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
from stable_baselines3 import SAC, TD3  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.noise import NormalActionNoise  # noqa: E402

ENV_ID = "Pendulum-v1"
TIMESTEPS = 20_000
SETTINGS = {
    ("sac", "zoo"): {"learning_rate": 1e-3},
    ("td3", "zoo"): {"learning_starts": 1000, "noise_std": 0.1},
    ("sac", "rein"): {"learning_rate": 1e-3, "buffer_size": 100_000, "learning_starts": 1000,
                      "batch_size": 256, "tau": 0.005, "gamma": 0.99, "net_arch": [64, 64]},
    ("td3", "rein"): {"learning_rate": 1e-3, "buffer_size": 100_000, "learning_starts": 1000,
                      "batch_size": 256, "tau": 0.005, "gamma": 0.99, "net_arch": [64, 64],
                      "noise_std": 0.1, "policy_delay": 2},
}


class StopAtTarget(BaseCallback):
    """Records finished episodes' returns; stops once the last `window` average `target`."""

    def __init__(self, target, window):
        super().__init__()
        self.target, self.window = target, window
        self.returns = []
        self.start = None
        self.solved = None  # (env_steps, seconds, mean)

    def mean_return(self):
        recent = self.returns[-self.window:]
        return sum(recent) / self.window if len(recent) == self.window else None

    def _on_step(self):
        ended = False
        for info in self.locals["infos"]:
            episode = info.get("episode")
            if episode is not None:
                self.returns.append(float(episode["r"]))
                ended = True
        mean = self.mean_return()
        if ended and mean is not None and mean >= self.target:
            self.solved = (self.num_timesteps, time.perf_counter() - self.start, mean)
            return False
        return True


def model_for(algorithm, settings, env, seed):
    s = dict(SETTINGS[(algorithm, settings)])
    noise_std = s.pop("noise_std", None)
    net_arch = s.pop("net_arch", None)
    kwargs = {"seed": seed, "device": "cpu", "verbose": 0, **s}
    if net_arch is not None:
        kwargs["policy_kwargs"] = {"net_arch": net_arch}
    if algorithm == "sac":
        return SAC("MlpPolicy", env, **kwargs)
    act_dim = env.action_space.shape[-1]
    high = float(env.action_space.high[0])
    noise = NormalActionNoise(mean=np.zeros(act_dim), sigma=noise_std * high * np.ones(act_dim))
    return TD3("MlpPolicy", env, action_noise=noise, **kwargs)


def run(algorithm, settings, seed, target, window):
    env = make_vec_env(ENV_ID, n_envs=1, seed=seed)
    model = model_for(algorithm, settings, env, seed)
    stop = StopAtTarget(target, window)
    stop.start = time.perf_counter()
    model.learn(total_timesteps=TIMESTEPS, callback=stop)
    if stop.solved is None:
        return {"seed": seed, "solved": False, "seconds": time.perf_counter() - stop.start,
                "env_steps": model.num_timesteps, "episodes": len(stop.returns),
                "mean_return": stop.mean_return()}
    steps, seconds, mean = stop.solved
    return {"seed": seed, "solved": True, "seconds": seconds, "env_steps": steps,
            "episodes": len(stop.returns), "mean_return": mean}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("algorithm", choices=["sac", "td3"])
    parser.add_argument("seeds", type=int, nargs="+")
    parser.add_argument("--settings", choices=["zoo", "rein"], default="zoo")
    parser.add_argument("--target", type=float, default=-200.0, help="mean return to reach (-200)")
    parser.add_argument("--window", type=int, default=10, help="episodes in the mean (10)")
    peer_common.add_threads_argument(parser)
    args = parser.parse_args()
    out = peer_common.Stdout()
    peer_common.configure_torch(torch, args.threads)
    runs = []
    for seed in args.seeds:
        result = run(args.algorithm, args.settings, seed, args.target, args.window)
        peer_common.log(result)
        runs.append(result)
    out.emit({
        "label": f"SB3 {args.algorithm.upper()} ({args.settings} settings)",
        "stop_rule": f"after each env step that ends an episode: mean return of the last {args.window} "
                     f"finished training episodes >= {args.target}",
        "hyperparameters": {"env_id": ENV_ID, "n_timesteps": TIMESTEPS,
                            **SETTINGS[(args.algorithm, args.settings)]},
        "threads": args.threads,
        "blas": peer_common.torch_blas(torch),
        "versions": peer_common.versions(stable_baselines3, torch, gym, np),
        "runs": runs,
    })


if __name__ == "__main__":
    main()
