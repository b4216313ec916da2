"""One training step (forward, backward, Adam): functd against torch.optim, one run.

Models: the tutorial's residual block (benchmarks/tutorial_block.py) and a
4-layer MLP of width 256, at batch 64, MSE loss. Rows:

- torch eager: ``nn.Module`` + ``loss.backward()`` + ``torch.optim.Adam(foreach=True)``
- torch compiled: the same with ``torch.compile(model)`` and ``torch.compile(opt.step)``
  (the recipe of the torch tutorial "Compiling the optimizer")
- functd eager: ``fd.train_step(loss_fn, fd.optim.adam(1e-3))``
- functd compiled: the whole step under ``torch.compile(fullgraph=True)``
- torchopt: only when installed.

Then an ensemble of 16 tutorial blocks: one ``torch.func.vmap`` of the functd
step (one optimizer state for all) against 16 sequential torch.optim loops.
Ratios are against the eager torch.optim step measured in the same run.

Times are the process's CPU time on one thread (BENCH_THREADS), robust on a
shared machine; BENCH_WALL=1 measures wall time instead.

BENCH_DEVICE=cuda runs every row on the GPU (wall time).

Run: .venv/bin/python benchmarks/train_step.py   (BENCH_QUICK=1: shorter; BENCH_COMPILE=0: eager only)
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
from _common import DEVICE, ON_GPU, machine, median_us, table
from tutorial_block import ResidualBlock, functd_block

import functd as fd

QUICK = os.environ.get("BENCH_QUICK", "0") == "1"
COMPILE = os.environ.get("BENCH_COMPILE", "1") == "1"
BATCH = 64
MEMBERS = 16
# process CPU time unless BENCH_WALL=1 or on the GPU (whose work the CPU clock misses)
CPU_TIME = os.environ.get("BENCH_WALL", "0") != "1" and not ON_GPU
THREADS = int(os.environ.get("BENCH_THREADS", "1"))
torch.set_num_threads(THREADS)
MIN_TIME = 0.2 if QUICK else 0.5
ROUNDS = 1 if QUICK else 3  # interleaved rounds; the best median is kept (shared machines)


def mlp(width: int = 256, depth: int = 4) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(3, width), nn.ReLU()]
    for _ in range(depth - 2):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 3))
    return nn.Sequential(*layers)


def functd_mlp(net: nn.Sequential):
    mods = []
    for i, m in enumerate(net):
        mods.append(fd.Module(m, [f"h{i}" if i else "x"], [f"h{i + 1}"]))
    seq = fd.Sequential(*mods, selected_out_keys=[f"h{len(net)}"])
    return seq, fd.from_module(seq).clone()


def torch_steps(model: nn.Module, x, y):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)

    def eager():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    out = {"torch eager": eager}
    if COMPILE:
        cmodel = torch.compile(model)
        cstep = torch.compile(opt.step)

        def compiled():
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(cmodel(x), y).backward()
            cstep()

        out["torch compiled"] = compiled
    return out


def functd_steps(block: fd.Sequential, params: fd.TensorDict, x, y):
    out_key = block.out_keys[-1]

    def loss_fn(p, batch, key):
        pred = block(p, batch)[out_key]
        return torch.nn.functional.mse_loss(pred, batch["y"])

    opt = fd.optim.adam(1e-3)
    step = fd.train_step(loss_fn, opt)
    batch = fd.TensorDict({"x": x, "y": y}, [x.shape[0]])
    state = {"p": params, "s": opt.init(params)}

    def run(f):
        def call():
            state["p"], state["s"], _ = f(state["p"], state["s"], batch, None)

        return call

    out = {"functd eager": run(step)}
    if COMPILE:
        out["functd compiled"] = run(torch.compile(step, fullgraph=True))
    return out


def torchopt_steps(model, x, y):
    try:
        import torchopt  # noqa: F401
    except ImportError:
        return {}
    return {}  # not installed here; left as a hook


def cpu_us(fn, min_run_time: float = MIN_TIME) -> float:
    """Median CPU time of ``fn()`` in µs (process time, one thread): unlike wall
    time it does not count the time the process waits for a shared core."""
    fn()
    n, t0 = 0, time.process_time()
    while time.process_time() - t0 < 0.05:
        fn()
        n += 1
    reps = []
    deadline = time.process_time() + min_run_time
    while time.process_time() < deadline or len(reps) < 5:
        t = time.process_time()
        for _ in range(n):
            fn()
        reps.append((time.process_time() - t) / n * 1e6)
    return statistics.median(reps)


def bench(cases: dict) -> dict[str, float]:
    for f in cases.values():  # warm up (compiles)
        for _ in range(3):
            f()
    timer = cpu_us if CPU_TIME else median_us
    best = {name: float("inf") for name in cases}
    for _ in range(ROUNDS):
        for name, f in cases.items():
            best[name] = min(best[name], timer(f, MIN_TIME))
    return best


def run_model(label: str, make):
    torch.manual_seed(0)
    ref, block, params = make()
    ref, params = ref.to(DEVICE), params.to(DEVICE)
    x, y = torch.randn(BATCH, 3, device=DEVICE), torch.randn(BATCH, 3, device=DEVICE)
    cases = {**torch_steps(ref, x, y), **torchopt_steps(ref, x, y)}
    cases.update(functd_steps(block, params, x, y))
    times = bench(cases)
    base = times["torch eager"]
    return [[label, name, t, t / base] for name, t in times.items()]


def make_block():
    ref = ResidualBlock()
    block, params = functd_block(ref)
    return ref, block, params.clone()


def make_mlp():
    ref = mlp()
    block, params = functd_mlp(ref)
    return ref, block, params


def run_ensemble():
    torch.manual_seed(0)
    refs = [ResidualBlock().to(DEVICE) for _ in range(MEMBERS)]
    opts = [torch.optim.Adam(r.parameters(), lr=1e-3, foreach=True) for r in refs]
    xs = torch.randn(MEMBERS, BATCH, 3, device=DEVICE)
    ys = torch.randn(MEMBERS, BATCH, 3, device=DEVICE)

    def loops():
        for r, o, x, y in zip(refs, opts, xs, ys):
            o.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(r(x), y).backward()
            o.step()

    block, _ = functd_block(refs[0])
    ens = fd.stack([functd_block(r)[1] for r in refs]).clone()

    def loss_fn(p, batch, key):
        return torch.nn.functional.mse_loss(block(p, batch)["y"], batch["y_true"])

    opt = fd.optim.adam(1e-3)
    step = torch.func.vmap(fd.train_step(loss_fn, opt), in_dims=(0, 0, 0, None))
    batch = fd.TensorDict({"x": xs, "y_true": ys}, [MEMBERS, BATCH])
    state = {"p": ens, "s": torch.func.vmap(opt.init)(ens)}

    def run(f):
        def call():
            state["p"], state["s"], _ = f(state["p"], state["s"], batch, None)

        return call

    cases = {"16 torch.optim loops": loops, "functd vmap (eager)": run(step)}
    if COMPILE:
        cases["functd vmap (compiled)"] = run(torch.compile(step, fullgraph=True))
    times = bench(cases)
    base = times["16 torch.optim loops"]
    return [[name, t, t / base] for name, t in times.items()]


def main():
    clock = "process CPU time" if CPU_TIME else "wall time"
    print(f"# training step, batch {BATCH} ({machine()}; {clock}, best of {ROUNDS} rounds)\n")
    rows = run_model("tutorial block", make_block) + run_model("MLP 4x256", make_mlp)
    print(table(["model", "step", "µs", "/ torch eager"], rows))
    for model in ("tutorial block", "MLP 4x256"):
        r = {name: ratio for m, name, _, ratio in rows if m == model}
        print(f"\ntargets ({model}):")
        print(
            f"  functd eager <= 1.1x torch eager: {r['functd eager']:.2f}x -> "
            f"{'met' if r['functd eager'] <= 1.1 else 'MISSED'}"
        )
        if COMPILE:
            print(
                f"  functd compiled <= 0.8x torch eager: {r['functd compiled']:.2f}x -> "
                f"{'met' if r['functd compiled'] <= 0.8 else 'MISSED'}"
            )
    print(f"\n## ensemble of {MEMBERS} tutorial blocks, batch {BATCH} each\n")
    erows = run_ensemble()
    print(table(["version", "µs", "/ loops"], erows))
    best = min(ratio for name, _, ratio in erows if name.startswith("functd"))
    print(f"\ntarget: vmap faster than the loops: {best:.2f}x -> {'met' if best < 1 else 'MISSED'}")


if __name__ == "__main__":
    main()
