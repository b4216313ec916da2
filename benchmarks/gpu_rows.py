"""The measured rows of ``make gpu-check`` (benchmarks/gpu_check.py runs each step here in
its own process, with its own time limit).

``python benchmarks/gpu_rows.py STEP OUT.jsonl [--tiny]``: runs one step on BENCH_DEVICE
(cuda by default) and appends one JSON line per row to OUT.jsonl as soon as it is
measured, so a step that hangs later keeps the rows it has. A row: ``id`` (stable, the
targets name it), ``label``, ``value``, ``unit``, and ``ref`` (the id of the row it is
compared with, or None). Times are medians of torch's Timer (it synchronises CUDA): the
cost of one call when calls follow each other, as a training loop makes them.

Steps (issue 40's table): ``prng`` (eager draws against torch.randn/rand, split,
fold_in), ``policy`` (the RANDOM GRU policy eager and under fd.jit), ``ensemble`` (the
tutorial block's ensemble forward, 64 and 4 members, compiled fd.vmap against compiled
stack_module_state + vmap), ``block`` (tutorial block b1: hand-written eager, fd.jit's
default, fd.jit(cuda_graph=False)), ``ppo_eager`` and ``ppo_jit`` (examples/ppo_agents.py,
fd.vmap over 2,048 agents; env steps/s). ``--tiny``: the same code at toy sizes, with
fd.jit's "fx" backend and no torch.compile (the plumbing, on a CPU, in seconds).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import sys
import time

import torch
from torch.func import functional_call, stack_module_state

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("BENCH_DEVICE", "cuda")
from _common import DEVICE, median_us
from tutorial_block import ResidualBlock, functd_block, pure_block

import functd as fd
import functd.random as fr

TINY = "--tiny" in sys.argv
RUN_TIME = float(os.environ.get("BENCH_MIN_RUN_TIME", "0.01" if TINY else "0.2"))
JIT = {"backend": "fx"} if TINY else {}  # fd.jit's options
# torch.compile (--tiny: not compiled at all, dynamo's trace alone takes tens of seconds)
COMPILE = (lambda f: f) if TINY else torch.compile


class Rows:
    """Appends each row to the JSONL file at once (and prints it)."""

    def __init__(self, path: str, step: str) -> None:
        self.path, self.step = path, step

    def __call__(
        self, id: str, label: str, value: float, unit: str = "µs", ref: str | None = None
    ) -> None:
        row = {"id": f"{self.step}.{id}", "label": label, "value": value, "unit": unit}
        row["ref"] = f"{self.step}.{ref}" if ref else None
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{row['id']}: {label}: {value:,.2f} {unit}", flush=True)


def timed(fn) -> float:
    for _ in range(3):
        fn()
    return median_us(fn, RUN_TIME)


# ---------------------------------------------------------------- steps
def prng(emit: Rows) -> None:
    k = fr.key(0).to(DEVICE)
    big = 2**12 if TINY else 2**24
    for n, name, tag in [
        (4, "normal", "4"),
        (4, "uniform", "4"),
        (1024, "normal", "1024"),
        (big, "normal", "big"),
    ]:
        _draw(emit, k, n, name, tag)
    emit("split", "fd.random.split(k, 2)", timed(lambda: fr.split(k, 2)))
    emit("fold_in", "fd.random.fold_in(k, 7)", timed(lambda: fr.fold_in(k, 7)))


def _draw(emit: Rows, k: torch.Tensor, n: int, name: str, tag: str) -> None:
    peer = torch.randn if name == "normal" else torch.rand
    sampler = getattr(fr, name)
    emit(
        f"torch_{name}_{tag}", f"torch.{peer.__name__}({n})", timed(lambda: peer(n, device=DEVICE))
    )
    emit(
        f"{name}_{tag}",
        f"fd.random.{name}(k, ({n},))",
        timed(lambda: sampler(k, (n,))),
        ref=f"torch_{name}_{tag}",
    )


def policy(emit: Rows) -> None:
    from jit import _policy  # benchmarks/jit.py: the GRU policy with RANDOM draws

    torch.manual_seed(0)
    pol = _policy()
    params = fd.from_module(pol).to(DEVICE)
    inp, hid = torch.randn(1, 4, device=DEVICE), torch.randn(1, 8, device=DEVICE)
    key, rnd = fr.key(0).to(DEVICE), fd.InteractionType.RANDOM
    jpol = fd.jit(pol, **JIT)

    def act(f):
        return f(
            params, fd.TensorDict({"input": inp, "hidden": hid}, [1]), key=key, interaction=rnd
        )

    torch.testing.assert_close(act(jpol)["action"], act(pol)["action"], rtol=1e-5, atol=1e-6)
    emit("eager", "random policy, batch 1: functd eager", timed(lambda: act(pol)))
    emit("jit", "random policy, batch 1: fd.jit (default)", timed(lambda: act(jpol)), ref="eager")


def ensemble(emit: Rows) -> None:
    for n in (64, 4):
        _ensemble(emit, n)


def _ensemble(emit: Rows, n: int) -> None:
    torch.manual_seed(0)
    nets = [ResidualBlock().to(DEVICE) for _ in range(n)]
    x = torch.randn(64, 3, device=DEVICE)
    td = fd.TensorDict({"x": x}, [64])
    params, buffers = stack_module_state(nets)
    base = copy.deepcopy(nets[0]).to("meta")
    sms = torch.func.vmap(lambda p, b, x: functional_call(base, (p, b), (x,)), (0, 0, None))
    block, _ = functd_block(nets[0])
    ens = fd.stack([functd_block(net)[1] for net in nets])
    fwd = fd.vmap(block, in_dims=(0, None))

    def fd_fwd(ens, td):
        return fwd(ens, td)["y"]

    c_sms = COMPILE(lambda p: sms(p, buffers, x))
    c_fd, j_fd = COMPILE(fd_fwd), fd.jit(fd_fwd, **JIT)
    with torch.no_grad():
        ref = c_sms(params)
        for f in (c_fd, j_fd):
            torch.testing.assert_close(f(ens, td), ref, rtol=1e-4, atol=1e-5)
        tag = f"{n} members"
        emit(f"sms_{n}", f"{tag}: compiled stack_module_state + vmap", timed(lambda: c_sms(params)))
        emit(f"fd_{n}", f"{tag}: compiled fd.vmap", timed(lambda: c_fd(ens, td)), ref=f"sms_{n}")
        emit(
            f"jit_{n}",
            f"{tag}: fd.jit(fd.vmap) (default)",
            timed(lambda: j_fd(ens, td)),
            ref=f"sms_{n}",
        )


def block(emit: Rows) -> None:
    torch.manual_seed(0)
    ref = ResidualBlock().to(DEVICE)
    x = torch.randn(1, 3, device=DEVICE)
    flat = {k: v.detach() for k, v in ref.state_dict().items()}
    blk, params = functd_block(ref)
    jdef, joff = fd.jit(blk, **JIT), fd.jit(blk, cuda_graph=False, **JIT)

    def call(f):
        return f(params, fd.TensorDict({"x": x}, [1]))

    for f in (jdef, joff):
        torch.testing.assert_close(call(f)["y"], pure_block(flat, x), rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        emit("hand", "block b1: hand-written F.* eager", timed(lambda: pure_block(flat, x)))
    emit("eager", "block b1: functd Sequential eager", timed(lambda: call(blk)), ref="hand")
    emit("jit", "block b1: fd.jit (default)", timed(lambda: call(jdef)), ref="hand")
    emit("jit_nograph", "block b1: fd.jit(cuda_graph=False)", timed(lambda: call(joff)), ref="hand")
    graphed = sum(type(e.outputs).__name__ == "EntryGraph" for e in jdef._lru)
    emit("graphed", "block b1: fd.jit signatures replayed as a CUDA graph", graphed, unit="count")


def _ppo(emit: Rows, jit: bool) -> None:
    import importlib.util

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(
        "ppo_agents_example", f"{root}/examples/ppo_agents.py"
    )
    P = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(P)  # type: ignore[union-attr]
    if TINY:  # the example calls fd.jit(step): the fx backend here (no C++ compile)
        P.fd = type(sys)("fd_tiny")
        P.fd.__dict__.update(fd.__dict__, jit=functools.partial(fd.jit, **JIT))
    agents = int(os.environ.get("GPU_CHECK_AGENTS", "2" if TINY else "2048"))
    cfg = P.Config(steps=int(os.environ.get("GPU_CHECK_STEPS", "512" if TINY else "2048")))
    with DEVICE:
        lrs = torch.full((agents,), cfg.lr)
        t0 = time.perf_counter()
        _, _, warm, train_s = P.run(cfg, agents, 0, lrs, jit, False)
    mode = "fd.jit(fd.vmap(update))" if jit else "fd.vmap(update), eager"
    timed_updates = cfg.num_updates * cfg.num_envs * cfg.num_steps * agents
    emit(
        "rate",
        f"PPO {agents} agents x {cfg.steps} steps, {mode}: env steps/s",
        timed_updates / train_s,
        unit="env steps/s",
    )
    emit("warm", f"PPO {mode}: {'compile' if jit else 'warm-up'} (first update)", warm, unit="s")
    emit("total", f"PPO {mode}: whole step", time.perf_counter() - t0, unit="s")


STEPS = {
    "prng": prng,
    "policy": policy,
    "ensemble": ensemble,
    "block": block,
    "ppo_eager": functools.partial(_ppo, jit=False),
    "ppo_jit": functools.partial(_ppo, jit=True),
}


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    if len(args) != 2 or args[0] not in STEPS:
        print(f"usage: gpu_rows.py {{{','.join(STEPS)}}} OUT.jsonl [--tiny]", file=sys.stderr)
        return 2
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "4")))
    STEPS[args[0]](Rows(args[1], args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
