"""The usual single-agent PyTorch PPO on CartPole: the baseline of benchmarks/ppo_agents.py.

Written the way a PyTorch user writes it: ``nn.Module`` actor and critic, ``torch.optim.Adam``
with ``clip_grad_norm_``, Python loops, ``torch.distributions.Categorical``, torch's global
generator. Same hyperparameters as ``examples/ppo_agents.py`` (PureJaxRL's CartPole config)
and the same physics: CartPole-v1's Euler step written in plain torch on a batch of 4 envs
(auto-reset on termination or 500 steps, as the pure env).

Run: ``python benchmarks/ppo_baseline.py [--steps 16384] [--seed 0] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn

GRAVITY, MASSCART, MASSPOLE, LENGTH, FORCE_MAG, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
TOTAL_MASS, POLEMASS_LENGTH = MASSPOLE + MASSCART, MASSPOLE * LENGTH
THETA_LIMIT, X_LIMIT, MAX_STEPS = 12 * 2 * math.pi / 360, 2.4, 500


class CartPole:
    """A batch of CartPole-v1 envs on one tensor (x, x_dot, theta, theta_dot), auto-reset."""

    def __init__(self, n: int):
        self.n = n
        self.state = torch.empty(n, 4).uniform_(-0.05, 0.05)
        self.t = torch.zeros(n, dtype=torch.int64)

    def obs(self) -> torch.Tensor:
        return self.state.clone()

    def step(self, action: torch.Tensor):
        x, x_dot, theta, theta_dot = self.state.unbind(-1)
        force = torch.where(action == 1, FORCE_MAG, -FORCE_MAG)
        cos, sin = torch.cos(theta), torch.sin(theta)
        temp = (force + POLEMASS_LENGTH * theta_dot**2 * sin) / TOTAL_MASS
        thetaacc = (GRAVITY * sin - cos * temp) / (
            LENGTH * (4.0 / 3.0 - MASSPOLE * cos**2 / TOTAL_MASS)
        )
        xacc = temp - POLEMASS_LENGTH * thetaacc * cos / TOTAL_MASS
        self.state = torch.stack(
            [
                x + TAU * x_dot,
                x_dot + TAU * xacc,
                theta + TAU * theta_dot,
                theta_dot + TAU * thetaacc,
            ],
            -1,
        )
        self.t = self.t + 1
        x, theta = self.state[:, 0], self.state[:, 2]
        done = (x.abs() > X_LIMIT) | (theta.abs() > THETA_LIMIT) | (self.t >= MAX_STEPS)
        if done.any():
            fresh = torch.empty(self.n, 4).uniform_(-0.05, 0.05)
            self.state = torch.where(done[:, None], fresh, self.state)
            self.t = torch.where(done, 0, self.t)
        return self.obs(), torch.ones(self.n), done


def mlp(n_out: int, gain: float, hidden: int = 64) -> nn.Sequential:
    net = nn.Sequential(
        nn.Linear(4, hidden),
        nn.Tanh(),
        nn.Linear(hidden, hidden),
        nn.Tanh(),
        nn.Linear(hidden, n_out),
    )
    for layer, g in zip(net[::2], (math.sqrt(2), math.sqrt(2), gain), strict=True):
        nn.init.orthogonal_(layer.weight, g)
        nn.init.zeros_(layer.bias)
    return net


class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.actor, self.critic = mlp(2, 0.01), mlp(1, 1.0)

    def forward(self, obs):
        return torch.distributions.Categorical(logits=self.actor(obs)), self.critic(obs)[..., 0]


def train(steps: int = 16_384, seed: int = 0, lr: float = 2.5e-4, log=None) -> dict:
    """One agent, PureJaxRL's hyperparameters -> {"train_s", "warmup_s", "final_return"}.

    The first update is timed apart as the warm-up (the issue's "+3.2 s warm-up")."""
    num_envs, num_steps, epochs, minibatches = 4, 128, 4, 4
    gamma, lam, clip, vf_coef, ent_coef, max_norm = 0.99, 0.95, 0.2, 0.5, 0.01, 0.5
    torch.manual_seed(seed)
    env, model = CartPole(num_envs), ActorCritic()
    opt = torch.optim.Adam(model.parameters(), lr=lr, eps=1e-5)
    obs, ep_ret, finished = env.obs(), torch.zeros(num_envs), []
    updates = steps // (num_envs * num_steps)
    batch = num_envs * num_steps
    t_start = time.perf_counter()
    warmup_s = 0.0
    for u in range(updates):
        if u == 1:
            warmup_s = time.perf_counter() - t_start
            t_start = time.perf_counter()
        buf = {k: [] for k in ("obs", "action", "log_prob", "value", "reward", "done")}
        with torch.no_grad():
            for _ in range(num_steps):
                dist, value = model(obs)
                action = dist.sample()
                buf["obs"].append(obs)
                buf["action"].append(action)
                buf["log_prob"].append(dist.log_prob(action))
                buf["value"].append(value)
                obs, reward, done = env.step(action)
                buf["reward"].append(reward)
                buf["done"].append(done)
                ep_ret += reward
                finished += ep_ret[done].tolist()
                ep_ret[done] = 0.0
            _, next_value = model(obs)
            traj = {k: torch.stack(v) for k, v in buf.items()}
            adv = torch.zeros_like(traj["reward"])
            running = torch.zeros(num_envs)
            for t in reversed(range(num_steps)):
                nonterminal = 1.0 - traj["done"][t].float()
                delta = traj["reward"][t] + gamma * next_value * nonterminal - traj["value"][t]
                running = delta + gamma * lam * nonterminal * running
                adv[t] = running
                next_value = traj["value"][t]
            traj["advantage"], traj["target"] = adv, adv + traj["value"]
        flat = {k: v.reshape(batch, *v.shape[2:]) for k, v in traj.items()}
        for _ in range(epochs):
            perm = torch.randperm(batch)
            for idx in perm.view(minibatches, -1):
                mb = {k: v[idx] for k, v in flat.items()}
                dist, value = model(mb["obs"])
                ratio = (dist.log_prob(mb["action"]) - mb["log_prob"]).exp()
                a = mb["advantage"]
                a = (a - a.mean()) / (a.std(correction=0) + 1e-8)
                actor_loss = -torch.min(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a).mean()
                v_clip = mb["value"] + (value - mb["value"]).clamp(-clip, clip)
                value_loss = (
                    0.5
                    * torch.max((value - mb["target"]) ** 2, (v_clip - mb["target"]) ** 2).mean()
                )
                loss = actor_loss + vf_coef * value_loss - ent_coef * dist.entropy().mean()
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                opt.step()
        if log is not None:
            log(u, finished[-10:])
    train_s = time.perf_counter() - t_start
    last = finished[-10:]
    return {
        "train_s": train_s,
        "warmup_s": warmup_s,
        "timed_updates": updates - 1 if updates > 1 else updates,
        "final_return": sum(last) / len(last) if last else math.nan,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=16_384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    r = train(args.steps, args.seed)
    rate = r["timed_updates"] * 512 / r["train_s"]
    print(
        f"PyTorch PPO, 1 agent, {args.steps} env steps: {rate:,.0f} env steps/s after the "
        f"first update ({r['warmup_s']:.2f} s), final return {r['final_return']:.1f}"
    )


if __name__ == "__main__":
    main()
