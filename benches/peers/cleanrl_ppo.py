"""PPO written the way CleanRL's single-file `ppo.py` is (PyTorch, Gymnasium's SyncVectorEnv,
orthogonal init, GAE, clipped surrogate and value loss, advantage normalisation, global
gradient clipping), with the hyperparameters of rein's `recipes/ppo-cartpole.toml`, for
`cargo xtask bench ppo`: seconds until the mean return of the last 20 episodes reaches 475.

The clock starts after the environments and the network exist, as rein's does.

Usage: cleanrl_ppo.py SEED [SEED ...]   prints one JSON object per line
"""

import json
import random
import sys
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn

NUM_ENVS, NUM_STEPS, TOTAL_STEPS = 8, 32, 300_000
GAMMA, GAE_LAMBDA, UPDATE_EPOCHS, NUM_MINIBATCHES = 0.98, 0.8, 10, 1
LR, CLIP, ENT_COEF, VF_COEF, MAX_GRAD_NORM = 1e-3, 0.2, 0.0, 0.5, 0.5
TARGET, WINDOW = 475.0, 20


def layer(i, o, std=np.sqrt(2)):
    linear = nn.Linear(i, o)
    nn.init.orthogonal_(linear.weight, std)
    nn.init.constant_(linear.bias, 0.0)
    return linear


class Agent(nn.Module):
    def __init__(self, obs_dim, actions):
        super().__init__()
        self.critic = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, 1.0))
        self.actor = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, actions, 0.01))

    def value(self, x):
        return self.critic(x)

    def act(self, x, action=None):
        dist = torch.distributions.Categorical(logits=self.actor(x))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(x)


def run(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    envs = gym.vector.SyncVectorEnv([lambda: gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))
                                     for _ in range(NUM_ENVS)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    agent = Agent(4, 2)
    optimizer = torch.optim.Adam(agent.parameters(), lr=LR, eps=1e-5)
    obs_buf = torch.zeros((NUM_STEPS, NUM_ENVS, 4))
    act_buf, logp_buf, rew_buf, done_buf, val_buf = (torch.zeros((NUM_STEPS, NUM_ENVS)) for _ in range(5))
    batch = NUM_ENVS * NUM_STEPS
    updates = TOTAL_STEPS // batch
    returns, step = [], 0

    start = time.perf_counter()
    obs, _ = envs.reset(seed=seed)
    obs, done = torch.tensor(obs, dtype=torch.float32), torch.zeros(NUM_ENVS)
    for update in range(updates):
        optimizer.param_groups[0]["lr"] = LR * (1.0 - update / updates)
        for t in range(NUM_STEPS):
            step += NUM_ENVS
            obs_buf[t], done_buf[t] = obs, done
            with torch.no_grad():
                action, logp, _, value = agent.act(obs)
            act_buf[t], logp_buf[t], val_buf[t] = action, logp, value.flatten()
            obs, reward, term, trunc, infos = envs.step(action.numpy())
            rew_buf[t] = torch.tensor(reward, dtype=torch.float32)
            obs = torch.tensor(obs, dtype=torch.float32)
            done = torch.tensor(np.logical_or(term, trunc), dtype=torch.float32)
            # Same-step autoreset moves the finished episodes' infos to "final_info".
            finished = infos.get("final_info", infos)
            if "episode" in finished:
                returns.extend(finished["episode"]["r"][finished["_episode"]].tolist())
                recent = returns[-WINDOW:]
                if len(recent) == WINDOW and sum(recent) / WINDOW >= TARGET:
                    return {"seed": seed, "solved": True, "seconds": time.perf_counter() - start, "steps": step}
        with torch.no_grad():
            next_value = agent.value(obs).flatten()
            adv = torch.zeros_like(rew_buf)
            last = 0.0
            for t in reversed(range(NUM_STEPS)):
                not_done = 1.0 - (done if t == NUM_STEPS - 1 else done_buf[t + 1])
                nxt = next_value if t == NUM_STEPS - 1 else val_buf[t + 1]
                delta = rew_buf[t] + GAMMA * nxt * not_done - val_buf[t]
                adv[t] = last = delta + GAMMA * GAE_LAMBDA * not_done * last
            ret = adv + val_buf
        b_obs, b_act, b_logp = obs_buf.reshape(-1, 4), act_buf.reshape(-1), logp_buf.reshape(-1)
        b_adv, b_ret, b_val = adv.reshape(-1), ret.reshape(-1), val_buf.reshape(-1)
        size = batch // NUM_MINIBATCHES
        for _ in range(UPDATE_EPOCHS):
            order = np.random.permutation(batch)
            for s in range(0, batch, size):
                mb = order[s:s + size]
                _, logp, entropy, value = agent.act(b_obs[mb], b_act[mb].long())
                ratio = (logp - b_logp[mb]).exp()
                mb_adv = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio, -mb_adv * ratio.clamp(1 - CLIP, 1 + CLIP)).mean()
                value = value.flatten()
                clipped = b_val[mb] + (value - b_val[mb]).clamp(-CLIP, CLIP)
                v_loss = 0.5 * torch.max((value - b_ret[mb]) ** 2, (clipped - b_ret[mb]) ** 2).mean()
                loss = pg_loss - ENT_COEF * entropy.mean() + VF_COEF * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), MAX_GRAD_NORM)
                optimizer.step()
    return {"seed": seed, "solved": False, "seconds": time.perf_counter() - start, "steps": step}


if __name__ == "__main__":
    torch.set_num_threads(2)
    print(json.dumps({"versions": {"torch": torch.__version__, "gymnasium": gym.__version__}}), flush=True)
    for seed in sys.argv[1:]:
        print(json.dumps(run(int(seed))), flush=True)
