"""Train the tensordict tutorial's GRU policy with REINFORCE on a toy bandit task.

The policy is the one of `examples/probabilistic_policy.py`: a GRU cell writes a
hidden state, NormalParamExtractor splits it into "loc" and "scale", and a
Normal head draws "action". The task is a few-step contextual bandit: every step
of an episode shows a fresh observation `obs` (4 numbers in [-1, 1]) and pays
the reward `-mean((action - target(obs))**2)` for a fixed `target`; the hidden
state is carried from step to step. The objective is REINFORCE with a baseline:
`-(G_t - b_t) * log pi(a_t | history)`, with `G_t` the return from step `t` on
and `b_t` its mean over the batch of episodes.

Everything is explicit: the episodes are drawn with `fd.random` keys (one per
iteration, `fold_in(key, i)`, split into an observation key and an action key),
the actions with `interaction=fd.InteractionType.RANDOM, key=...`, and one
update is the pure `fd.train_step(loss_fn, fd.optim.adam(...))`. The loss
re-runs the recurrence from the stored observations, so the gradient of
`log pi(a_t | history)` flows through the hidden states of earlier steps.

Prints the average reward and the deterministic policy's error as a text curve
and fails if the policy did not improve. Run: `python examples/train_policy.py`
(QUICK=1: a short run).
"""

from __future__ import annotations

import os
import time

import torch
from torch import distributions as dist
from torch import nn

import functd as fd

QUICK = os.environ.get("QUICK", "0") == "1"
ITERS = 150 if QUICK else 500
LR = 1e-2
EPISODES, STEPS = 128, 3  # a batch of 128 episodes of 3 steps per update
OBS, HIDDEN = 4, 8  # the tutorial's GRUCell(4, 8): actions have 4 dims


def target(obs: torch.Tensor) -> torch.Tensor:
    """The best action for an observation (a fixed function, within reach of loc)."""
    return 0.6 * torch.tanh(2.0 * obs.roll(1, dims=-1))


def build_policy() -> fd.ProbabilisticSequential:
    return fd.ProbabilisticSequential(
        fd.Module(nn.GRUCell(OBS, HIDDEN), in_keys=["input", "hidden"], out_keys=["hidden"]),
        fd.Module(fd.NormalParamExtractor(), in_keys=["hidden"], out_keys=["loc", "scale"]),
        fd.Probabilistic(
            in_keys=["loc", "scale"],
            out_keys=["action"],
            distribution_class=dist.Normal,
            return_log_prob=True,
        ),
    )


POLICY = build_policy()
OPTIMIZER = fd.optim.adam(LR)


def rollout(params: fd.TensorDict, key: torch.Tensor, episodes: int = EPISODES) -> fd.TensorDict:
    """Play a batch of episodes with the random policy -> TensorDict of size [episodes, STEPS].

    Entries: "input" (the observations), "action", "reward" and "return" (the
    reward of this step and the later ones). Pure: a function of params and key.
    """
    k_obs, k_act = fd.random.split(key)
    obs = fd.random.uniform(k_obs, (episodes, STEPS, OBS), minval=-1.0, maxval=1.0)
    hidden = torch.zeros(episodes, HIDDEN)
    actions = []
    with torch.no_grad():  # acting: no gradient needed
        for t in range(STEPS):
            td = fd.TensorDict({"input": obs[:, t], "hidden": hidden}, [episodes])
            out = POLICY(
                params,
                td,
                key=fd.random.fold_in(k_act, t),
                interaction=fd.InteractionType.RANDOM,
            )
            actions.append(out.get_tensor("action"))
            hidden = out.get_tensor("hidden")
    action = torch.stack(actions, 1)
    reward = -((action - target(obs)) ** 2).mean(-1)  # [episodes, STEPS]
    ret = reward.flip(1).cumsum(1).flip(1)  # return from step t on
    return fd.TensorDict(
        {"input": obs, "action": action, "reward": reward, "return": ret}, [episodes, STEPS]
    )


def log_probs(params: fd.TensorDict, episodes: fd.TensorDict) -> torch.Tensor:
    """log pi(a_t | o_1..o_t) of the stored actions, [episodes, STEPS], differentiable."""
    n = episodes.batch_size[0]
    hidden = torch.zeros(n, HIDDEN)
    head = POLICY.modules[-1]
    out = []
    for t in range(STEPS):
        step = episodes[:, t]
        td = POLICY(params, fd.TensorDict({"input": step["input"], "hidden": hidden}, [n]))
        # the head scores the stored action under Normal(loc, scale) of this step
        out.append(head.log_prob(None, td.set("action", step["action"])).sum(-1))
        hidden = td.get_tensor("hidden")
    return torch.stack(out, 1)


def loss_fn(
    params: fd.TensorDict, episodes: fd.TensorDict, key: torch.Tensor | None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """REINFORCE with the batch-mean baseline (advantages scaled by their std)."""
    ret = episodes.get_tensor("return")
    adv = (ret - ret.mean(0)) / (ret.std(0) + 1e-6)
    loss = -(adv * log_probs(params, episodes)).mean()
    return loss, {"reward": episodes.get_tensor("reward").mean()}


def policy_error(params: fd.TensorDict, key: torch.Tensor, episodes: int = 256) -> float:
    """Mean squared error of the deterministic policy (action = loc) against the target."""
    obs = fd.random.uniform(key, (episodes, STEPS, OBS), minval=-1.0, maxval=1.0)
    hidden, err = torch.zeros(episodes, HIDDEN), 0.0
    for t in range(STEPS):
        td = POLICY(params, fd.TensorDict({"input": obs[:, t], "hidden": hidden}, [episodes]))
        err += float(((td.get_tensor("action") - target(obs[:, t])) ** 2).mean()) / STEPS
        hidden = td.get_tensor("hidden")
    return err


def train(
    iters: int = ITERS, seed: int = 0, log_every: int | None = None
) -> tuple[fd.TensorDict, list[tuple[int, float, float]]]:
    """Train from scratch; returns (params, history) with history a list of
    (iteration, mean reward, deterministic error) rows, printed every log_every."""
    log_every = log_every or max(1, iters // 10)
    k_init, k_train, k_eval = fd.random.split(fd.random.key(seed), 3)
    params = POLICY.init(k_init)
    opt_state = OPTIMIZER.init(params)
    # The episodes depend on the current params, so fd.fit (a fixed list of batches)
    # does not fit; the update itself is the pure fd.train_step. The loss takes no
    # key: the randomness is all in the episodes, drawn with the iteration's key.
    step = fd.train_step(loss_fn, OPTIMIZER)
    history: list[tuple[int, float, float]] = []
    rewards: list[float] = []
    for i in range(iters):
        episodes = rollout(params, fd.random.fold_in(k_train, i))
        params, opt_state, metrics = step(params, opt_state, episodes, None)
        rewards.append(float(metrics["reward"]))
        if i % log_every == 0 or i == iters - 1:
            recent = sum(rewards[-log_every:]) / len(rewards[-log_every:])
            history.append((i + 1, recent, policy_error(params, k_eval)))
    return params, history


def text_curve(history: list[tuple[int, float, float]], width: int = 40) -> str:
    lo, hi = min(r for _, r, _ in history), max(r for _, r, _ in history)
    lines = ["   iter   reward   det. error"]
    for i, r, e in history:
        frac = (r - lo) / (hi - lo) if hi > lo else 1.0
        lines.append(f"  {i:5d}  {r:7.4f}   {e:8.4f}   " + "#" * max(1, round(frac * width)))
    return "\n".join(lines)


def fmt(x: torch.Tensor) -> str:
    return "[" + " ".join(f"{v:+.2f}" for v in x.tolist()) + "]"


def main() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: a second thread's OpenMP waits cost more
    try:
        _main()
    finally:
        torch.set_num_threads(threads)


def _main() -> None:
    start = time.perf_counter()
    params, history = train()
    print(f"REINFORCE on a {STEPS}-step contextual bandit, {EPISODES} episodes per update")
    print("(reward: mean over the last updates' episodes; det. error: MSE of action=loc)")
    print(text_curve(history))
    # the GRU's hidden state lies in (-1, 1), so the scale has a floor: exploration
    # noise costs at least scale_min**2 per step, the best reachable average reward
    scale_min = float(fd.NormalParamExtractor()(torch.tensor([0.0, -1.0]))[1])
    print(f"best reachable reward: {-(scale_min**2):.4f} (scale >= {scale_min:.3f})")
    print(f"{ITERS} updates in {time.perf_counter() - start:.1f}s")

    obs = fd.random.uniform(fd.random.key(7), (3, OBS), minval=-1.0, maxval=1.0)
    out = POLICY(params, fd.TensorDict({"input": obs, "hidden": torch.zeros(3, HIDDEN)}, [3]))
    print("\nthe trained policy on 3 new observations (first step):")
    for t, loc, scale in zip(target(obs), out["loc"], out["scale"]):
        print(f"  target {fmt(t)}  loc {fmt(loc)}  scale {fmt(scale)}")
    (_, r0, e0), (_, r1, e1) = history[0], history[-1]
    # rewards are negative: the cost -reward should at least halve, the error drop 5x
    assert r1 > r0 / 2, f"the average reward should have risen: {r0:.3f} -> {r1:.3f}"
    assert e1 < e0 / 5, f"the deterministic error should have dropped: {e0:.4f} -> {e1:.4f}"


if __name__ == "__main__":
    main()
