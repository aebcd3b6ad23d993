"""PPO written the way CleanRL's single-file `ppo.py` is (PyTorch, Gymnasium's SyncVectorEnv with
same-step autoreset, orthogonal init, GAE, clipped surrogate and value loss, per-minibatch
advantage normalisation, global gradient clipping, linear LR annealing), with the
hyperparameters of rein's `recipes/ppo-cartpole.toml` as rein resolves it (its `extends`
fragments deep-merged, rein's schema defaults for the keys none sets), for
`cargo xtask bench ppo`: seconds until the target return, per seed.

Hyperparameters, all read from the recipe at run time (see `hyperparameters()`; printed in
the JSON): num_envs, num_steps, update_epochs, num_minibatches, gamma, gae_lambda,
clip_coef (annealed only if anneal_clip), clip_vloss, norm_adv, ent_coef, vf_coef, target_kl,
lr annealed linearly to 0 over rein's number of updates, ceil(train.total_steps /
(num_envs * num_steps)), i.e. lr * (1 - (update - 1) / num_updates) at update 1, 2, ...;
Adam eps / betas, max_grad_norm, the MLP's hidden sizes and activation (actor and critic
separate, as rein's ActorCritic), at most num_updates updates.
One CleanRL detail kept where rein departs from it: truncated episodes are treated as
terminated (rein bootstraps them from the value of their final observation).

Stop rule, the same on all three sides (rein, this script, sb3_ppo.py): after each whole
update (rollout, then the update's optimisation epochs), the mean return of the last
`train.return_window` (20) training episodes finished so far is compared with
`train.stop_at_return` (475); once it is reached the run stops, reporting the seconds to that
point and the update / env-step count. The clock starts after the environments and the network
exist (before the first reset), as rein's does.

Usage: cleanrl_ppo.py SEED [SEED ...] [--recipe recipes/ppo-cartpole.toml] [--threads 2]
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
import math  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
import tomllib  # noqa: E402

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "ppo-cartpole.toml"
LABEL = "CleanRL-style, rein's hyperparameters"
# The Gymnasium environment for each rein environment plugin this script knows.
GYM_IDS = {"cartpole": "CartPole-v1"}

# rein's schema defaults (crates/rein-recipe/src/schema.rs) for the keys used here.
DEFAULTS = {
    "seed": 1,
    "env": {"num_envs": 8},
    "algorithm": {
        "num_steps": 128,
        "gamma": 0.99,
        "gae_lambda": 0.95,
        "update_epochs": 4,
        "num_minibatches": 4,
        "clip_coef": 0.2,
        "anneal_clip": False,
        "clip_vloss": True,
        "ent_coef": 0.01,
        "vf_coef": 0.5,
        "norm_adv": True,
        "target_kl": None,
        "normalize_obs": False,
        "normalize_reward": False,
    },
    "model": {"hidden": [64, 64], "activation": "tanh"},
    # anneal_lr: None means "yes" for PPO.
    "optimizer": {"lr": 2.5e-4, "anneal_lr": None, "eps": 1e-5, "beta1": 0.9, "beta2": 0.999, "max_grad_norm": 0.5},
    "train": {"total_steps": 100_000, "stop_at_return": None, "return_window": 20},
}


def _merge(into, new):
    """rein's deep merge: tables merge key by key, anything else replaces."""
    for key, value in new.items():
        if isinstance(into.get(key), dict) and isinstance(value, dict):
            _merge(into[key], value)
        else:
            into[key] = value


def load_recipe(path):
    """The recipe at `path` with everything it `extends`, deep-merged in order, then itself."""
    path = pathlib.Path(path)
    table = tomllib.loads(path.read_text(encoding="utf-8"))
    extends = table.pop("extends", [])
    composed = {}
    for base in [extends] if isinstance(extends, str) else extends:
        _merge(composed, load_recipe(path.parent / base))
    _merge(composed, table)
    return composed


def hyperparameters(path=RECIPE):
    """The flat hyperparameters this script runs with, from the resolved recipe at `path`."""
    recipe = load_recipe(path)
    algorithm = recipe.get("algorithm", {})
    if algorithm.get("name") != "ppo":
        raise ValueError(f"{path}: not a PPO recipe (algorithm.name = {algorithm.get('name')!r})")
    resolved = {}
    for section, defaults in DEFAULTS.items():
        if isinstance(defaults, dict):
            resolved[section] = {**defaults, **recipe.get(section, {})}
        else:
            resolved[section] = recipe.get(section, defaults)
    alg, opt, train = resolved["algorithm"], resolved["optimizer"], resolved["train"]
    for unsupported in ("normalize_obs", "normalize_reward"):
        if alg[unsupported]:
            raise ValueError(f"{path}: algorithm.{unsupported} is not implemented in this peer")
    plugin = recipe.get("env", {}).get("plugin")
    if plugin not in GYM_IDS:
        raise ValueError(f"{path}: no Gymnasium environment known for the plugin {plugin!r}")
    num_envs, num_steps = resolved["env"]["num_envs"], alg["num_steps"]
    batch = num_envs * num_steps
    return {
        "env_id": GYM_IDS[plugin],
        "num_envs": num_envs,
        "num_steps": num_steps,
        "batch_size": batch,
        "num_minibatches": alg["num_minibatches"],
        "update_epochs": alg["update_epochs"],
        "gamma": alg["gamma"],
        "gae_lambda": alg["gae_lambda"],
        "clip_coef": alg["clip_coef"],
        "anneal_clip": alg["anneal_clip"],
        "clip_vloss": alg["clip_vloss"],
        "norm_adv": alg["norm_adv"],
        "ent_coef": alg["ent_coef"],
        "vf_coef": alg["vf_coef"],
        "target_kl": alg["target_kl"],
        "lr": opt["lr"],
        "anneal_lr": True if opt["anneal_lr"] is None else opt["anneal_lr"],
        "adam_eps": opt["eps"],
        "adam_betas": [opt["beta1"], opt["beta2"]],
        "max_grad_norm": opt["max_grad_norm"],
        "hidden": list(resolved["model"]["hidden"]),
        "activation": resolved["model"]["activation"],
        "total_steps": train["total_steps"],
        # rein: total_steps.div_ceil(batch).max(1)
        "num_updates": max(1, math.ceil(train["total_steps"] / batch)),
        "stop_at_return": train["stop_at_return"],
        "return_window": train["return_window"],
    }


def layer(i, o, std=np.sqrt(2)):
    linear = nn.Linear(i, o)
    nn.init.orthogonal_(linear.weight, std)
    nn.init.constant_(linear.bias, 0.0)
    return linear


def mlp(sizes, output_gain, activation):
    act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
    layers = []
    for i, o in zip(sizes[:-2], sizes[1:-1]):
        layers += [layer(i, o), act()]
    layers.append(layer(sizes[-2], sizes[-1], output_gain))
    return nn.Sequential(*layers)


class Agent(nn.Module):
    def __init__(self, obs_dim, actions, hidden, activation):
        super().__init__()
        self.critic = mlp([obs_dim, *hidden, 1], 1.0, activation)
        self.actor = mlp([obs_dim, *hidden, actions], 0.01, activation)

    def value(self, x):
        return self.critic(x)

    def act(self, x, action=None):
        dist = torch.distributions.Categorical(logits=self.actor(x))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(x)


def run(seed, hp):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    n_envs, n_steps, batch = hp["num_envs"], hp["num_steps"], hp["batch_size"]
    gamma, lam, clip0 = hp["gamma"], hp["gae_lambda"], hp["clip_coef"]
    target, window, updates = hp["stop_at_return"], hp["return_window"], hp["num_updates"]
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(hp["env_id"]) for _ in range(n_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    obs_dim = envs.single_observation_space.shape[0]
    agent = Agent(obs_dim, int(envs.single_action_space.n), hp["hidden"], hp["activation"])
    optimizer = torch.optim.Adam(agent.parameters(), lr=hp["lr"], eps=hp["adam_eps"], betas=tuple(hp["adam_betas"]))
    obs_buf = torch.zeros((n_steps, n_envs, obs_dim))
    act_buf, logp_buf, rew_buf, done_buf, val_buf = (torch.zeros((n_steps, n_envs)) for _ in range(5))
    # Returns of finished training episodes, as rein's `Episodes` keeps them.
    running, returns, step = np.zeros(n_envs), [], 0

    def mean_return():
        return sum(returns[-window:]) / window if len(returns) >= window else None

    start = time.perf_counter()
    obs, _ = envs.reset(seed=seed)
    envs.action_space.seed(seed)
    obs, done = torch.tensor(obs, dtype=torch.float32), torch.zeros(n_envs)
    for update in range(1, updates + 1):
        frac = 1.0 - (update - 1.0) / updates
        if hp["anneal_lr"]:
            optimizer.param_groups[0]["lr"] = frac * hp["lr"]
        clip = clip0 * frac if hp["anneal_clip"] else clip0
        for t in range(n_steps):
            step += n_envs
            obs_buf[t], done_buf[t] = obs, done
            with torch.no_grad():
                action, logp, _, value = agent.act(obs)
            act_buf[t], logp_buf[t], val_buf[t] = action, logp, value.flatten()
            obs, reward, term, trunc, _ = envs.step(action.numpy())
            ended = np.logical_or(term, trunc)
            running += reward
            returns.extend(running[ended].tolist())
            running[ended] = 0.0
            rew_buf[t] = torch.tensor(reward, dtype=torch.float32)
            obs = torch.tensor(obs, dtype=torch.float32)
            done = torch.tensor(ended, dtype=torch.float32)
        with torch.no_grad():
            next_value = agent.value(obs).flatten()
            adv = torch.zeros_like(rew_buf)
            last = 0.0
            for t in reversed(range(n_steps)):
                not_done = 1.0 - (done if t == n_steps - 1 else done_buf[t + 1])
                nxt = next_value if t == n_steps - 1 else val_buf[t + 1]
                delta = rew_buf[t] + gamma * nxt * not_done - val_buf[t]
                adv[t] = last = delta + gamma * lam * not_done * last
            ret = adv + val_buf
        b_obs, b_act, b_logp = obs_buf.reshape(-1, obs_dim), act_buf.reshape(-1), logp_buf.reshape(-1)
        b_adv, b_ret, b_val = adv.reshape(-1), ret.reshape(-1), val_buf.reshape(-1)
        size = batch // hp["num_minibatches"]
        for _ in range(hp["update_epochs"]):
            order = np.random.permutation(batch)
            for s in range(0, batch, size):
                mb = order[s : s + size]
                _, logp, entropy, value = agent.act(b_obs[mb], b_act[mb].long())
                log_ratio = logp - b_logp[mb]
                ratio = log_ratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - log_ratio).mean()
                mb_adv = b_adv[mb]
                if hp["norm_adv"]:
                    mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio, -mb_adv * ratio.clamp(1 - clip, 1 + clip)).mean()
                value = value.flatten()
                if hp["clip_vloss"]:
                    clipped = b_val[mb] + (value - b_val[mb]).clamp(-clip, clip)
                    v_loss = 0.5 * torch.max((value - b_ret[mb]) ** 2, (clipped - b_ret[mb]) ** 2).mean()
                else:
                    v_loss = 0.5 * ((value - b_ret[mb]) ** 2).mean()
                loss = pg_loss - hp["ent_coef"] * entropy.mean() + hp["vf_coef"] * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), hp["max_grad_norm"])
                optimizer.step()
            if hp["target_kl"] is not None and approx_kl > hp["target_kl"]:
                break
        # The stop rule: once per whole update, on the last `window` finished episodes.
        mean = mean_return()
        if update % 50 == 0:
            peer_common.log(f"  seed {seed}: update {update}, {step} env steps, {len(returns)} episodes, "
                            f"mean return {mean}, {time.perf_counter() - start:.1f} s")
        if target is not None and mean is not None and mean >= target:
            seconds = time.perf_counter() - start
            return {"seed": seed, "solved": True, "seconds": seconds, "updates": update, "env_steps": step,
                    "episodes": len(returns), "mean_return": mean}
    return {"seed": seed, "solved": False, "seconds": time.perf_counter() - start, "updates": updates,
            "env_steps": step, "episodes": len(returns), "mean_return": mean_return()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("seeds", type=int, nargs="+")
    parser.add_argument("--recipe", default=str(RECIPE), help="rein's PPO recipe (default ppo-cartpole.toml)")
    peer_common.add_threads_argument(parser)
    args = parser.parse_args()
    out = peer_common.Stdout()
    peer_common.configure_torch(torch, args.threads)
    hp = hyperparameters(args.recipe)
    peer_common.log(f"{LABEL}: {hp}")
    runs = []
    for seed in args.seeds:
        result = run(seed, hp)
        peer_common.log(result)
        runs.append(result)
    out.emit({
        "label": LABEL,
        "stop_rule": f"after each whole update: mean return of the last {hp['return_window']} finished "
                     f"training episodes >= {hp['stop_at_return']}",
        "hyperparameters": hp,
        "threads": args.threads,
        "blas": peer_common.torch_blas(torch),
        "versions": peer_common.versions(torch, gym, np),
        "runs": runs,
    })


if __name__ == "__main__":
    main()
