"""PPO agents in one program: N independent CartPole runs as one fd.vmap of a pure function.

One agent's whole training run is a pure function ``train(key, lr) -> (params, metrics)``
(PureJaxRL's design): the update loop, the rollout and the minibatch epochs are written
with ``fd.scan``, the environment is the pure CartPole of
``examples/cartpole.py``, randomness comes from explicit ``fd.random`` keys, and the
optimizer is ``fd.optim`` (Adam after ``clip_by_global_norm``; the learning rate lives in
the optimizer state through ``inject_hyperparams``, so each agent may have its own). N
agents are ``fd.vmap(train)(keys, lrs)`` with ``keys[i] = fold_in(key(seed), i)``: agent
``i`` is the same agent whatever N is, and there is no Python loop over agents.

The hyperparameters are PureJaxRL's CartPole ones (4 envs, 128 steps, 4 epochs, 4
minibatches, lr 2.5e-4, 64 tanh units, gamma 0.99, lambda 0.95, clip 0.2, value coef 0.5,
entropy coef 0.01, max grad norm 0.5, Adam eps 1e-5, orthogonal init), the linear
learning-rate anneal off by default (``--anneal-lr``).

The command line runs the same pieces update by update (``fd.vmap(update)`` over the
agents, in a Python loop over updates for the progress bar); ``--jit`` compiles that
update, ``fd.jit(fd.vmap(update))``, into one graph (see notes/ppo.md)::

    python examples/ppo_agents.py --agents 16 --steps 16384 --seed 0 --json out.json

With ``--jit`` the command line shows functd's compile log (``logging.getLogger("functd")``
at INFO): a line when the compile starts and one when it ends, with its seconds and
whether inductor's cache on disk answered (a second run of the same command).

Nothing is written into the current folder unless asked (``--json``, ``--save``,
``--plot``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import logging
import math
import pathlib
import sys
import time
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import distributions as D

import functd as fd


def _load_cartpole() -> types.ModuleType:
    name = "cartpole_example"
    if name not in sys.modules:
        path = pathlib.Path(__file__).resolve().parent / "cartpole.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None, path
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


cp = _load_cartpole()


scan = fd.scan  # jax.lax.scan semantics; under fd.jit one loop op


# ---------------------------------------------------------------- configuration
@dataclasses.dataclass(frozen=True)
class Config:
    """PureJaxRL's CartPole hyperparameters; ``steps`` is env steps per agent."""

    steps: int = 16_384
    num_envs: int = 4
    num_steps: int = 128
    epochs: int = 4
    minibatches: int = 4
    lr: float = 2.5e-4
    anneal_lr: bool = False
    hidden: int = 64
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5
    dtype: torch.dtype = torch.float32

    @property
    def num_updates(self) -> int:
        return self.steps // (self.num_envs * self.num_steps)

    def __post_init__(self) -> None:
        batch = self.num_envs * self.num_steps
        if self.steps < batch:
            raise ValueError(
                f"ppo_agents: steps={self.steps} is less than one update's "
                f"{batch} env steps (num_envs * num_steps); ask for at least {batch}."
            )
        if batch % self.minibatches:
            raise ValueError(
                f"ppo_agents: minibatches={self.minibatches} does not divide the "
                f"batch of {batch} env steps."
            )


# ---------------------------------------------------------------- the agent
def _mlp(n_in: int, hidden: int, n_out: int, inp: str, out: str) -> list[fd.Module]:
    # functd's pure layers (an nn.Linear would draw from torch's generator when built)
    return [
        fd.Module(fd.nn.Linear(n_in, hidden), [inp], ["h0"]),
        fd.Module(fd.nn.Tanh(), ["h0"], ["z0"]),
        fd.Module(fd.nn.Linear(hidden, hidden), ["z0"], ["h1"]),
        fd.Module(fd.nn.Tanh(), ["h1"], ["z1"]),
        fd.Module(fd.nn.Linear(hidden, n_out), ["z1"], [out]),
    ]


@functools.lru_cache(maxsize=8)
def networks(hidden: int = 64) -> tuple[fd.ProbabilisticSequential, fd.Sequential]:
    """(actor, critic): the actor writes ``logits`` and draws ``action`` (Categorical,
    with ``action_log_prob``); the critic writes ``value`` ([..., 1])."""
    actor = fd.ProbabilisticSequential(
        *_mlp(cp.OBS_SIZE, hidden, cp.NUM_ACTIONS, "observation", "logits"),
        fd.Probabilistic(
            in_keys=["logits"],
            out_keys=["action"],
            distribution_class=D.Categorical,
            return_log_prob=True,
        ),
    )
    critic = fd.Sequential(*_mlp(cp.OBS_SIZE, hidden, 1, "observation", "value"))
    return actor, critic


def orthogonal(
    key: torch.Tensor, shape: tuple[int, int], gain: float, dtype: torch.dtype
) -> torch.Tensor:
    """An orthogonal matrix times ``gain`` (flax's ``orthogonal`` initializer), from ``key``."""
    rows, cols = shape
    a = fd.random.normal(key, (max(rows, cols), min(rows, cols)), dtype)
    q, r = torch.linalg.qr(a)
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    out: torch.Tensor = gain * (q.mT if rows < cols else q)
    return out


def init_params(key: torch.Tensor, cfg: Config) -> fd.TensorDict:
    """PureJaxRL's init: orthogonal weights (gain sqrt(2); 0.01 for the logits, 1 for
    the value), zero biases -> ``{"actor": ..., "critic": ...}``."""
    actor, critic = networks(cfg.hidden)
    out = {}
    for name, net, last_gain, k in zip(
        ("actor", "critic"), (actor, critic), (0.01, 1.0), fd.random.split(key), strict=True
    ):
        p = net.init(k, dtype=cfg.dtype)
        for j, gain in (("0", math.sqrt(2)), ("2", math.sqrt(2)), ("4", last_gain)):
            rows, cols = p.get_tensor((j, "weight")).shape
            w = orthogonal(fd.random.fold_in(k, int(j)), (rows, cols), gain, cfg.dtype)
            bias = torch.zeros_like(p.get_tensor((j, "bias")))
            p = p.set((j, "weight"), w).set((j, "bias"), bias)
        out[name] = p
    return fd.TensorDict(out)


def make_optimizer(cfg: Config) -> fd.optim.GradientTransformation:
    """clip_by_global_norm then Adam (eps 1e-5, as optax in PureJaxRL), lr in the state."""
    adam = fd.optim.inject_hyperparams(fd.optim.adam)(lr=cfg.lr, eps=1e-5)
    return fd.optim.chain(fd.optim.clip_by_global_norm(cfg.max_grad_norm), adam)


LR_PATH = ("1", "hyperparams", "lr")  # where the chain's Adam keeps its learning rate


# ---------------------------------------------------------------- one update
def init_runner(key: torch.Tensor, lr: torch.Tensor, cfg: Config) -> dict[str, Any]:
    """An agent's starting state: params, optimizer state (its ``lr``), envs, key."""
    k_params, k_env, k_run = fd.random.split(key, 3)
    params = init_params(k_params, cfg)
    opt_state = make_optimizer(cfg).init(params)
    lr = torch.as_tensor(lr, dtype=cfg.dtype)
    opt_state = opt_state.set(LR_PATH, lr)
    env_params = cp.default_params(cfg.dtype)
    keys = fd.random.split(k_env, cfg.num_envs)
    env_state, obs = fd.vmap(cp.reset, in_dims=(0, None))(keys, env_params)
    return {
        "params": params,
        "opt_state": opt_state,
        "lr": lr,
        "env_state": env_state,
        "env_params": env_params,
        "obs": obs,
        "ep_return": torch.zeros(cfg.num_envs, dtype=cfg.dtype),
        "last10": torch.zeros(10, dtype=cfg.dtype),  # the last 10 finished episodes' returns
        "last10_valid": torch.zeros(10, dtype=torch.bool),
        "update": torch.zeros((), dtype=torch.int64),
        "key": k_run,
    }


_vstep = fd.vmap(cp.step, in_dims=(0, 0, 0, None))


def env_step(runner: dict[str, Any], _: Any, cfg: Config) -> tuple[dict[str, Any], fd.TensorDict]:
    """One step of the agent's envs with the current policy -> (runner, transition [E])."""
    actor, critic = networks(cfg.hidden)
    key, k_act, k_env = fd.random.split(runner["key"], 3).unbind(-2)
    params, obs = runner["params"], runner["obs"]
    td = fd.TensorDict({"observation": obs}, [cfg.num_envs])
    act = actor(params["actor"], td, key=k_act, interaction=fd.InteractionType.RANDOM)
    value = critic(params["critic"], td)["value"][..., 0]
    keys = fd.random.split(k_env, cfg.num_envs)
    env_state, next_obs, reward, done = _vstep(
        keys, runner["env_state"], act["action"], runner["env_params"]
    )
    ret = runner["ep_return"] + reward
    transition = fd.TensorDict(
        {
            "observation": obs,
            "action": act["action"],
            "log_prob": act["action_log_prob"],
            "value": value,
            "reward": reward,
            "done": done,
            "finished_return": torch.where(done, ret, torch.zeros_like(ret)),
        },
        [cfg.num_envs],
    )
    new = dict(runner, key=key, env_state=env_state, obs=next_obs)
    new["ep_return"] = torch.where(done, torch.zeros_like(ret), ret)
    return new, transition


def rollout(runner: dict[str, Any], cfg: Config) -> tuple[dict[str, Any], fd.TensorDict]:
    """``num_steps`` env steps -> (runner, trajectory [num_steps, num_envs])."""
    return scan(functools.partial(env_step, cfg=cfg), runner, None, length=cfg.num_steps)


def gae(
    traj: fd.TensorDict, last_value: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over a [T, E] trajectory -> (advantages, targets)."""

    def body(
        carry: tuple[torch.Tensor, torch.Tensor], t: fd.TensorDict
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        adv, next_value = carry
        value = t.get_tensor("value")
        not_done = 1.0 - t.get_tensor("done").to(value.dtype)
        delta = t.get_tensor("reward") + gamma * next_value * not_done - value
        adv = delta + gamma * lam * not_done * adv
        return (adv, value), adv

    xs = traj.select("reward", "value", "done")
    _, adv = scan(body, (torch.zeros_like(last_value), last_value), xs, reverse=True)
    return adv, adv + traj.get_tensor("value")


def ppo_loss(
    params: fd.TensorDict, batch: fd.TensorDict, cfg: Config
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped objective (PureJaxRL's form) -> (total loss, its parts)."""
    actor, critic = networks(cfg.hidden)
    td = batch.select("observation")
    dist = actor.get_dist(params.get_tensordict("actor"), td)
    log_prob = dist.log_prob(batch.get_tensor("action"))
    entropy = dist.entropy().mean()
    value = critic(params.get_tensordict("critic"), td).get_tensor("value")[..., 0]
    old_value, target = batch.get_tensor("value"), batch.get_tensor("target")
    eps = cfg.clip_eps
    value_clipped = old_value + (value - old_value).clamp(-eps, eps)
    value_loss = 0.5 * torch.maximum((value - target) ** 2, (value_clipped - target) ** 2).mean()
    ratio = torch.exp(log_prob - batch.get_tensor("log_prob"))
    adv = batch.get_tensor("advantage")
    adv = (adv - adv.mean()) / (adv.std(correction=0) + 1e-8)
    actor_loss = -torch.minimum(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv).mean()
    total = actor_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy
    return total, {"actor_loss": actor_loss, "value_loss": value_loss, "entropy": entropy}


def minibatch_step(
    carry: tuple[fd.TensorDict, fd.TensorDict], mb: fd.TensorDict, cfg: Config
) -> tuple[tuple[fd.TensorDict, fd.TensorDict], torch.Tensor]:
    """One Adam step on one minibatch -> ((params, opt_state), loss)."""
    params, opt_state = carry
    grads, parts = fd.grad(functools.partial(ppo_loss, cfg=cfg), has_aux=True)(params, mb)
    updates, opt_state = make_optimizer(cfg).update(grads, opt_state, params)
    return (fd.optim.apply_updates(params, updates), opt_state), parts["value_loss"]


def _last10(
    buf: torch.Tensor, valid: torch.Tensor, returns: torch.Tensor, done: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The last 10 finished episodes' returns, oldest first: ``buf`` then this update's."""
    vals = torch.cat([buf, returns.reshape(-1)])
    ok = torch.cat([valid, done.reshape(-1)])
    rank = ok.flip(0).to(torch.int64).cumsum(0).flip(0)  # 1 = the latest finished episode
    keep = ok & (rank <= 10)
    slot = torch.where(keep, 10 - rank, torch.full_like(rank, 10))  # slot 10: dropped
    new = torch.zeros(11, dtype=vals.dtype).scatter_add(0, slot, torch.where(keep, vals, 0.0))
    new_ok = torch.zeros(11, dtype=torch.int64).scatter_add(0, slot, keep.to(torch.int64))
    return new[:10], new_ok[:10] > 0


def prepare(
    runner: dict[str, Any], traj: fd.TensorDict, cfg: Config
) -> tuple[dict[str, Any], fd.TensorDict, dict[str, torch.Tensor]]:
    """What learning needs from a trajectory -> (runner, minibatches, metrics).

    GAE, the shuffled minibatches of every epoch (``[epochs, minibatches, size]``: epoch
    ``i`` shuffles with ``split(key, epochs)[i]``), the annealed lr, the episode statistics."""
    _, critic = networks(cfg.hidden)
    obs = fd.TensorDict({"observation": runner["obs"]}, [cfg.num_envs])
    params: fd.TensorDict = runner["params"]
    last_value = critic(params.get_tensordict("critic"), obs).get_tensor("value")[..., 0]
    adv, target = gae(traj, last_value, cfg.gamma, cfg.gae_lambda)
    batch = traj.set("advantage", adv).set("target", target).reshape(-1)
    opt_state = runner["opt_state"]
    if cfg.anneal_lr:  # PureJaxRL's linear anneal, one value per update
        frac = 1.0 - runner["update"].to(cfg.dtype) / cfg.num_updates
        opt_state = opt_state.set(LR_PATH, runner["lr"] * frac)
    key, k_epochs = fd.random.split(runner["key"]).unbind(-2)
    n = batch.batch_size[0]

    def shuffle(carry: None, k: torch.Tensor) -> tuple[None, torch.Tensor]:
        return carry, fd.random.permutation(k, n)

    _, perms = scan(shuffle, None, fd.random.split(k_epochs, cfg.epochs))
    minibatches = batch[perms.reshape(-1)].reshape(cfg.epochs, cfg.minibatches, -1)
    finished = traj.get_tensor("finished_return")
    last10, valid = _last10(
        runner["last10"], runner["last10_valid"], finished, traj.get_tensor("done")
    )
    metrics = {"return_sum": finished.sum(), "episodes": traj.get_tensor("done").sum()}
    new = dict(runner, opt_state=opt_state, key=key, update=runner["update"] + 1)
    new.update(last10=last10, last10_valid=valid)
    return new, minibatches, metrics


def learn(
    runner: dict[str, Any], traj: fd.TensorDict, cfg: Config
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """GAE, then ``epochs`` passes of shuffled minibatches -> (runner, metrics)."""
    runner, minibatches, metrics = prepare(runner, traj, cfg)
    step = functools.partial(minibatch_step, cfg=cfg)

    def epoch(
        carry: tuple[fd.TensorDict, fd.TensorDict], epoch_minibatches: fd.TensorDict
    ) -> tuple[tuple[fd.TensorDict, fd.TensorDict], torch.Tensor]:  # a scan over minibatches
        carry, losses = scan(step, carry, epoch_minibatches)
        return carry, losses.mean()

    init = (runner["params"], runner["opt_state"])
    (params, opt_state), losses = scan(epoch, init, minibatches)
    new = dict(runner, params=params, opt_state=opt_state)
    return new, dict(metrics, value_loss=losses[-1])


def update(runner: dict[str, Any], cfg: Config) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """One PPO update: a rollout, then learning from it -> (runner, metrics)."""
    runner, traj = rollout(runner, cfg)
    return learn(runner, traj, cfg)


def final_return(runner: dict[str, Any]) -> torch.Tensor:
    """Mean return of the last 10 finished episodes (nan before any)."""
    valid = runner["last10_valid"]
    count = valid.sum()
    total = torch.where(valid, runner["last10"], 0.0).sum()
    return torch.where(count > 0, total / count.clamp_min(1), math.nan)


def make_train(
    cfg: Config,
) -> Callable[[torch.Tensor, torch.Tensor], tuple[fd.TensorDict, dict[str, torch.Tensor]]]:
    """``train(key, lr) -> (params, metrics)``: one agent's whole run, a pure function.

    ``metrics``: per update ``return_sum``/``episodes`` (finished episodes' returns),
    ``value_loss``, and ``final_return`` (mean of the last 10 finished episodes).

    Example:
        >>> train = make_train(Config(steps=512))
        >>> keys = fd.random.fold_in(fd.random.key(0), torch.arange(3))
        >>> params, metrics = fd.vmap(train)(keys, torch.full((3,), 2.5e-4))
    """

    def train(key: torch.Tensor, lr: torch.Tensor) -> tuple[fd.TensorDict, dict[str, torch.Tensor]]:
        runner = init_runner(key, lr, cfg)
        one = functools.partial(update, cfg=cfg)
        runner, metrics = scan(lambda r, _: one(r), runner, None, length=cfg.num_updates)
        return runner["params"], dict(metrics, final_return=final_return(runner))

    return train


def agent_keys(seed: int, n: int) -> torch.Tensor:
    """``keys[i] = fold_in(key(seed), i)``: agent i's stream does not depend on n."""
    return fd.random.fold_in(fd.random.key(seed), torch.arange(n))


# ---------------------------------------------------------------- the driver
def make_driver(
    cfg: Config, jit: bool = False
) -> tuple[Callable[..., dict[str, Any]], Callable[..., tuple[dict[str, Any], dict[str, Any]]]]:
    """(init, update) over a batch of agents: ``fd.vmap`` of the pure pieces, and with
    ``jit`` the whole update compiled, ``fd.jit(fd.vmap(update))``: one graph whose
    rollout, GAE, shuffles and minibatch epochs are torch's scan op (one per loop, not
    unrolled). The Python loop over updates stays for the progress bar (a call per
    update: 32 for 16,384 steps)."""
    vinit = fd.vmap(functools.partial(init_runner, cfg=cfg))

    def init(keys: torch.Tensor, lrs: torch.Tensor) -> dict[str, Any]:
        runner: dict[str, Any] = standard_strides(vinit(keys, lrs))
        return runner

    def one_update(runner: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        runner, metrics = update(runner, cfg)
        return standard_strides(runner), metrics

    step = fd.vmap(one_update)
    return init, fd.jit(step) if jit else step


def standard_strides(tree: Any) -> Any:
    """Every tensor of ``tree`` copied with the standard (row-major) strides. Strides
    are part of fd.jit's signature, and the runner's leaves come out of init and of an
    update with different ones (a leaf the same for every agent expanded with stride
    0; a slice of a split key with its parent's strides): in one layout, one compile
    serves the first update and every later one. The copies are a few kB an update."""
    return fd.tree.map(lambda t: t.clone(memory_format=torch.contiguous_format), tree)


def run(
    cfg: Config,
    agents: int,
    seed: int,
    lrs: torch.Tensor,
    jit: bool,
    progress: bool,
    driver: tuple[Callable[..., Any], Callable[..., Any]] | None = None,
) -> tuple[dict[str, Any], dict[str, torch.Tensor], float, float]:
    """Train ``agents`` agents -> (runner, per-update metrics [agents, updates], compile
    or warm-up seconds, train seconds). ``driver``: a ``make_driver`` result to reuse
    (its compiled code serves other agent counts)."""
    init, step = driver or make_driver(cfg, jit)
    runner = init(agent_keys(seed, agents), lrs)
    t0 = time.perf_counter()
    # warm-up (under --jit: the one compile); the run below starts from the same runner
    _synchronize(step(runner))
    compile_s = time.perf_counter() - t0
    history = []
    bar = _progress(cfg.num_updates, progress)
    t0 = time.perf_counter()
    for _ in range(cfg.num_updates):
        runner, metrics = step(runner)
        history.append(metrics)
        bar.update(1, runner)
    _synchronize(runner)
    train_s = time.perf_counter() - t0
    bar.close()
    hist = {k: torch.stack([m[k] for m in history], 1) for k in history[0]}
    return runner, hist, compile_s, train_s


def _synchronize(tree: Any) -> None:
    """Wait for the GPU when ``tree`` lives there (CUDA calls return before the work
    is done, so a timer read without this measures the launches)."""
    if any(t.is_cuda for t in fd.tree.leaves(tree)):
        torch.cuda.synchronize()


class _progress:
    """tqdm's bar with the agents' mean recent return, else a printed line per tenth."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.n, self.enabled = total, 0, enabled
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc="updates", unit="upd")
            except ImportError:
                pass

    def update(self, k: int, runner: dict[str, Any]) -> None:
        self.n += k
        if not self.enabled:
            return
        ret = float(final_return(runner).nanmean())
        if self.bar is not None:
            self.bar.update(k)
            self.bar.set_postfix(ret=f"{ret:.1f}")
        elif self.n % max(1, self.total // 10) == 0 or self.n == self.total:
            print(f"update {self.n}/{self.total}: mean last-10 return {ret:.1f}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def curves(hist: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean finished-episode return per update and agent ([agents, updates], nan if none)."""
    n = hist["episodes"].to(hist["return_sum"].dtype)
    return torch.where(n > 0, hist["return_sum"] / n.clamp_min(1), math.nan)


def summary(curve: torch.Tensor, width: int = 10) -> str:
    """A text learning curve: mean and spread (min..max) over agents at ~width points."""
    updates = curve.shape[1]
    rows = []
    for u in sorted(
        {min(updates - 1, round(i * (updates - 1) / (width - 1))) for i in range(width)}
    ):
        c = curve[:, u]
        c = c[~c.isnan()]
        if c.numel():
            lo, mean, hi = float(c.min()), float(c.mean()), float(c.max())
            rows.append(f"  update {u + 1:5d}: mean return {mean:7.1f}  ({lo:.1f} .. {hi:.1f})")
    return "\n".join(rows)


def plot(curve: torch.Tensor, cfg: Config, path: str) -> bool:
    """Mean and min-max band over agents vs env steps, to ``path``; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    x = [(u + 1) * cfg.num_envs * cfg.num_steps for u in range(curve.shape[1])]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(x, curve.nanmean(0).tolist(), label=f"mean of {curve.shape[0]} agents")
    ax.fill_between(x, _nanmin(curve).tolist(), _nanmax(curve).tolist(), alpha=0.3, label="range")
    ax.set(xlabel="env steps per agent", ylabel="episode return", title="PPO on CartPole-v1")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def _nanmin(c: torch.Tensor) -> torch.Tensor:
    return torch.where(c.isnan(), math.inf, c).amin(0)


def _nanmax(c: torch.Tensor) -> torch.Tensor:
    return torch.where(c.isnan(), -math.inf, c).amax(0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--agents", type=int, default=4, help="number of agents (vmapped)")
    p.add_argument("--steps", type=int, default=16_384, help="env steps per agent")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--lr", type=float, nargs="+", default=[2.5e-4], help="one lr, or one per agent")
    p.add_argument("--anneal-lr", action="store_true", help="PureJaxRL's linear lr anneal")
    p.add_argument("--jit", action="store_true", help="compile the pieces with fd.jit")
    p.add_argument("--json", help="write the figures to this JSON file")
    p.add_argument("--save", help="write the agents' params (batch [N]) with fd.save")
    p.add_argument("--plot", help="write the learning curves to this image (matplotlib)")
    p.add_argument("--quick", action="store_true", help="a tiny run (2 agents, 2 updates)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: these small matmuls lose to OpenMP's waits)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.agents, args.steps = min(args.agents, 2), min(args.steps, 1024)
    if len(args.lr) not in (1, args.agents):
        p.error(f"--lr: give one value or {args.agents} (one per agent), got {len(args.lr)}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The command line; returns what ``--json`` writes."""
    args = parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    log, shown = logging.getLogger("functd"), logging.StreamHandler(sys.stdout)
    level = log.level
    if args.jit:  # fd.jit's compile log: "compiling signature ...", "compiled ... in 41.2 s"
        log.addHandler(shown)
        log.setLevel(logging.INFO)
    try:
        return _main(args)
    finally:
        torch.set_num_threads(threads)
        log.removeHandler(shown)
        log.setLevel(level)


def _main(args: argparse.Namespace) -> dict[str, Any]:
    dtype = getattr(torch, args.dtype)
    cfg = Config(steps=args.steps, anneal_lr=args.anneal_lr, dtype=dtype)
    lrs = torch.tensor(args.lr * (args.agents if len(args.lr) == 1 else 1), dtype=dtype)
    runner, hist, compile_s, train_s = run(
        cfg, args.agents, args.seed, lrs, args.jit, not args.no_progress
    )
    steps = cfg.num_updates * cfg.num_envs * cfg.num_steps
    out = {
        "agents": args.agents,
        "steps_per_agent": steps,
        "compile_s": compile_s,
        "train_s": train_s,
        "final_return": [float(r) for r in final_return_batch(runner)],
        "env_steps_per_s": args.agents * steps / train_s,
    }
    curve = curves(hist)
    print(
        f"{args.agents} agents x {steps} env steps: train {train_s:.2f} s "
        f"(+{compile_s:.2f} s {'compile' if args.jit else 'warm-up'}), "
        f"{out['env_steps_per_s']:,.0f} env steps/s"
    )
    if not (args.plot and plot(curve, cfg, args.plot)):
        print(summary(curve))
    print(
        "final return per agent (mean of its last 10 episodes):",
        " ".join(f"{r:.1f}" for r in out["final_return"]),
    )
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(out, indent=2))
    if args.save:
        fd.save(runner["params"], args.save)
    return out


def final_return_batch(runner: dict[str, Any]) -> torch.Tensor:
    """``final_return`` per agent of a batched runner."""
    return fd.vmap(final_return)(runner)


if __name__ == "__main__":
    main()
