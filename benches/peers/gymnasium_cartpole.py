"""Gymnasium's CartPole throughput on this machine, for `cargo xtask bench plugins`: env-steps/s
of `CartPoleVectorEnv` at 256 envs (numpy, one batched step call) and of one
`gym.make("CartPole-v1")` env (resetting when an episode ends), with the same actions as rein's
side (benches/src/plugins.rs).

As rein's `report::rate`: `--warmup` untimed calls, then `--steps` timed rounds of about
`--round-seconds` each; a round's rate is its env steps over its seconds, the figure the true
median of the rounds' rates.

Usage: gymnasium_cartpole.py [--steps 7] [--warmup 1] [--round-seconds 0.2143] [--threads 2]
Prints one JSON object: {"vector_256", "single" (median env-steps/s), "vector_256_rates",
"single_rates" (every round's), "round_seconds", "threads", "versions"}.
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
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv  # noqa: E402

N = 256


def rates(step, work, rounds, warmup, seconds):
    """Each round's rate (work units per second) over `rounds` rounds of about `seconds`."""
    for _ in range(warmup):
        step()
    found = []
    for _ in range(rounds):
        start, n = time.perf_counter(), 0
        while n == 0 or time.perf_counter() - start < seconds:
            step()
            n += 1
        found.append(work * n / (time.perf_counter() - start))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    peer_common.add_step_arguments(parser, steps=7, what="rounds")
    parser.add_argument("--round-seconds", type=float, default=1.5 / 7)
    peer_common.add_threads_argument(parser)
    args = parser.parse_args()
    out = peer_common.Stdout()

    vec = CartPoleVectorEnv(num_envs=N)
    vec.reset(seed=0)
    actions = (np.arange(N) * 7 + np.arange(N) // 3) % 2
    vector = rates(lambda: vec.step(actions), N, args.steps, args.warmup, args.round_seconds)

    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    flip = [0]

    def single_step():
        flip[0] ^= 1
        _, _, terminated, truncated, _ = env.step(flip[0])
        if terminated or truncated:
            env.reset()

    single = rates(single_step, 1, args.steps, args.warmup, args.round_seconds)
    out.emit({
        "vector_256": peer_common.median(vector),
        "single": peer_common.median(single),
        "vector_256_rates": vector,
        "single_rates": single,
        "round_seconds": args.round_seconds,
        "threads": args.threads,
        "versions": peer_common.versions(gym, np),
    })


if __name__ == "__main__":
    main()
