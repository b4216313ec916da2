"""PPO agents in one program against the usual PyTorch PPO agent (issue 24's table).

In one run: the single-agent PyTorch baseline (``benchmarks/ppo_baseline.py``: nn.Module,
torch.optim, Python loop), then functd's ``examples/ppo_agents.py`` at each agent count
(``fd.vmap`` over agents; eager, and with ``--mode jit`` the update compiled by fd.jit), all with
PureJaxRL's CartPole hyperparameters and ``--steps`` env steps per agent. Train time is the
wall time after the warm-up/compile (a first update, timed apart). Prints the table: train
time, compile (or warm-up) time, aggregate env steps/s, and the ratio of that throughput
to the baseline's.

Run: ``python benchmarks/ppo_agents.py [--agents 1,16,64,256] [--steps 16384] [--mode
eager|jit|both] [--quick] [--pieces] [--jax-python PATH]``. ``--pieces``: each piece of one
update (env step, rollout, prepare, learn) compiled against eager, one agent. Threads:
BENCH_THREADS (1 by default; see benchmarks/_common.py). ``BENCH_DEVICE=cuda``: functd's rows
on the GPU (the baseline stays the usual CPU agent). ``--jax-python``: a Python that
has jax and optax (never a dependency of functd) runs ``benchmarks/ppo_jax.py``, the
same algorithm jitted and vmapped in JAX, at the same agent counts and threads, after
functd's rows: the JAX column on the same machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import subprocess
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import ppo_baseline
from _common import DEVICE, ON_GPU, THREADS, machine, table

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _example():
    name = "ppo_agents_example"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / "ppo_agents.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def pieces(P) -> None:
    """One agent: each piece of an update, ``fd.jit(fd.vmap(piece))`` against the same
    ``fd.vmap(piece)`` eager (ms a call, mean of 3 after one warm call)."""
    import functools
    import time

    import functd as fd

    cfg = P.Config(steps=512)
    runner = fd.vmap(functools.partial(P.init_runner, cfg=cfg))(
        P.agent_keys(0, 1), torch.full((1,), cfg.lr)
    )
    after, traj = fd.vmap(functools.partial(P.rollout, cfg=cfg))(runner)
    cases = {
        "env step": (functools.partial(P.env_step, _=None, cfg=cfg), (runner,)),
        "rollout": (functools.partial(P.rollout, cfg=cfg), (runner,)),
        "prepare": (functools.partial(P.prepare, cfg=cfg), (after, traj)),
        "learn": (functools.partial(P.learn, cfg=cfg), (after, traj)),
    }
    rows = []
    for name, (fn, args) in cases.items():
        eager = fd.vmap(fn)
        jitted = fd.jit(eager)
        t0 = time.perf_counter()
        jitted(*args)
        compile_s = time.perf_counter() - t0

        def ms(f, args=args):
            f(*args)
            t0 = time.perf_counter()
            for _ in range(3):
                f(*args)
            return (time.perf_counter() - t0) / 3 * 1e3

        rows.append([name, f"{compile_s:.0f}", f"{ms(jitted):.1f}", f"{ms(eager):.1f}"])
        print(rows[-1], flush=True)
    print(table(["piece", "compile s", "compiled ms", "eager ms"], rows))


def jax_rows(python: str, agents: str, steps: int, base_rate: float) -> list[list]:
    """``benchmarks/ppo_jax.py`` run by ``python``: one row per agent count."""
    cmd = [python, str(ROOT / "benchmarks" / "ppo_jax.py"), "--agents", agents]
    cmd += ["--steps", str(steps), "--threads", str(THREADS)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        print(line, flush=True)
        if line.startswith("jax agents="):
            f = dict(kv.split("=") for kv in line.split()[1:])
            rate = float(f["env_steps_per_s"].replace(",", ""))
            label = f"JAX, jit(vmap(train)) ({THREADS} thread(s))"
            rows.append(
                [
                    label,
                    int(f["agents"]),
                    float(f["train_s"]),
                    float(f["compile_s"]),
                    rate,
                    rate / base_rate,
                ]
            )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--agents", default="1,16,64,256", help="comma-separated agent counts")
    p.add_argument("--steps", type=int, default=16_384, help="env steps per agent")
    p.add_argument("--mode", choices=["eager", "jit", "both"], default="eager")
    p.add_argument("--quick", action="store_true", help="1,4 agents x 2048 steps")
    p.add_argument(
        "--pieces", action="store_true", help="each piece of one update, compiled vs eager"
    )
    p.add_argument("--jax-python", help="a Python with jax and optax: adds the JAX rows")
    args = p.parse_args()
    if args.pieces:
        torch.set_num_threads(THREADS)
        return pieces(_example())
    if args.quick:
        args.agents, args.steps = "1,4", 2048
    counts = [int(a) for a in args.agents.split(",")]
    torch.set_num_threads(THREADS)
    P = _example()
    cfg = P.Config(steps=args.steps)
    steps = cfg.num_updates * cfg.num_envs * cfg.num_steps
    print(f"# PPO on CartPole-v1, {steps} env steps per agent ({machine()})")

    base = ppo_baseline.train(steps, seed=0)
    base_rate = base["timed_updates"] * cfg.num_envs * cfg.num_steps / base["train_s"]
    base_train = steps / base_rate  # the whole run at the timed updates' rate
    rows = [["PyTorch, nn.Module + torch.optim", 1, base_train, base["warmup_s"], base_rate, 1.0]]
    print(f"baseline: {base_train:.2f} s, {base_rate:,.0f} env steps/s", flush=True)
    modes = ["eager", "jit"] if args.mode == "both" else [args.mode]
    for mode in modes:
        # eager: one driver; jit: a fresh compile per agent count, as the command line
        # gets it (one driver reused across counts recompiles with the agent dim symbolic)
        shared = None if mode == "jit" else P.make_driver(cfg, jit=False)
        for n in counts:
            driver = shared or P.make_driver(cfg, jit=True)
            with DEVICE:  # every tensor the run makes, on BENCH_DEVICE (the baseline: CPU)
                lrs = torch.full((n,), cfg.lr)
                _, _, warm, train_s = P.run(cfg, n, 0, lrs, mode == "jit", False, driver)
            rate = n * steps / train_s
            label = "functd, fd.vmap" + (" + fd.jit" if mode == "jit" else " (eager)")
            label += ", GPU" if ON_GPU else ""
            rows.append([label, n, train_s, warm, rate, rate / base_rate])
            print(f"{label}, {n} agents: {train_s:.2f} s (+{warm:.2f} s)", flush=True)
    if args.jax_python:
        rows += jax_rows(args.jax_python, args.agents, args.steps, base_rate)
    header = ["implementation", "agents", "train s", "compile/warm-up s", "env steps/s", "x base"]
    print(table(header, [[*r[:4], f"{r[4]:,.0f}", f"{r[5]:.1f}"] for r in rows]))


if __name__ == "__main__":
    main()
