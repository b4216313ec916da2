"""fd.jit against eager and torch.compile: the targets of issue 23, one run.

Rows (each timed call builds its TensorDict, grad mode on, BENCH_THREADS=2 torch
threads; best of BENCH_ROUNDS interleaved medians of this process's CPU time,
BENCH_CLOCK=wall for wall time):

1. the tutorial block (benchmarks/tutorial_block.py: 3 -> 128 -> 128 -> 3) at
   batch 1 and 256: the hand-written F.* function eager and under
   ``torch.compile``, functd's Sequential eager and under ``fd.jit``;
2. a whole Adam step of that block at batch 256: ``nn.Module`` + ``torch.optim.Adam``
   eager, ``fd.train_step`` eager, under ``fd.jit``, and under ``fd.jit`` with the
   params and the optimizer state donated; params are checked against the eager
   functd step;
3. the GRU policy with RANDOM draws (benchmarks/policy.py) at batch 1 and 256:
   functd eager against ``fd.jit``; the draws are checked against eager;
4. signatures: compilations for batch sizes 1..24 with new values, then a new key set;
5. cold compile: the first call of ``fd.jit(block)`` against the first call of
   ``torch.compile(hand-written)``, each in a fresh process with an empty inductor
   cache (BENCH_COLD=0 skips it).

Then the targets, and per-call profiles (Python frames and C calls of one call,
``sys.setprofile``; where the microseconds of a jitted call go).

BENCH_DEVICE=cuda (``make gpu-check``): the block and the policy on the GPU, wall
time, with ``fd.jit(..., cuda_graph=True)`` rows. BENCH_QUICK=1 runs only these rows
(on BENCH_DEVICE; the CPU's rows of ``cuda_graph=True`` are compiled calls without
a graph), at batch 1.

Run: .venv/bin/python benchmarks/jit.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
from torch import distributions as D

sys.path.insert(0, os.path.dirname(__file__))
from _common import CLOCK, DEVICE, ON_GPU, clock_us, machine, table
from tutorial_block import ResidualBlock, functd_block, pure_block

import functd as fd
from functd.testing import count_compiles

THREADS = int(os.environ.get("BENCH_THREADS", "2"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
RUN_TIME = float(os.environ.get("BENCH_MIN_RUN_TIME", "0.1"))
COLD = os.environ.get("BENCH_COLD", "1") == "1"
QUICK = os.environ.get("BENCH_QUICK", "0") == "1"


def interleaved(fns: dict) -> dict:
    """Best of ROUNDS medians per function, measured in turn (a shared machine drifts)."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            best[name] = min(best[name], clock_us(fn, min_run_time=RUN_TIME))
    return best


def warm(fns: dict) -> None:
    for fn in fns.values():
        for _ in range(3):
            fn()


# ------------------------------------------------------------------ 1. the block
def block_rows(batch: int) -> dict:
    torch.manual_seed(0)
    ref = ResidualBlock()
    x = torch.randn(batch, 3)
    flat = {k: v.detach() for k, v in ref.state_dict().items()}
    block, params = functd_block(ref)
    jblock = fd.jit(block)
    chand = torch.compile(pure_block)
    fns = {
        "hand-written F.* eager": lambda: pure_block(flat, x),
        "hand-written, torch.compile": lambda: chand(flat, x),
        "functd Sequential eager": lambda: block(params, fd.TensorDict({"x": x}, [batch])),
        "fd.jit(block)": lambda: jblock(params, fd.TensorDict({"x": x}, [batch])),
    }
    warm(fns)
    out = jblock(params, fd.TensorDict({"x": x}, [batch]))["y"]
    torch.testing.assert_close(out, pure_block(flat, x), rtol=1e-5, atol=1e-6)
    return interleaved(fns)


# ------------------------------------------------------------------ 2. Adam step
def adam_rows(batch: int = 256) -> tuple[dict, float]:
    torch.manual_seed(0)
    ref = ResidualBlock()
    x, t = torch.randn(batch, 3), torch.randn(batch, 3)
    block, params0 = functd_block(ref)
    torch_opt = torch.optim.Adam(ref.parameters(), lr=1e-3)

    def torch_step():
        torch_opt.zero_grad()
        loss = ((ref(x) - t) ** 2).mean()
        loss.backward()
        torch_opt.step()

    def loss_fn(p, b, key):
        return ((block(p, b)["y"] - b["t"]) ** 2).mean()

    opt = fd.optim.adam(1e-3)
    step = fd.train_step(loss_fn, opt)
    jstep = fd.jit(step)
    dstep = fd.jit(step, donate_argnums=(0, 1))
    state = {"eager": (params0, opt.init(params0)), "jit": (params0, opt.init(params0))}
    state["donated"] = (params0.clone(), opt.init(params0))

    def run(name, f):
        def call():
            p, s = state[name]
            p, s, _ = f(p, s, fd.TensorDict({"x": x, "t": t}, [batch]), None)
            state[name] = (p, s)

        return call

    # equality first: three steps from the same start, eager functd vs jitted
    for name, f in (("eager", step), ("jit", jstep), ("donated", dstep)):
        for _ in range(3):
            run(name, f)()
    diff = max(
        (a - b).abs().max().item()
        for name in ("jit", "donated")
        for a, b in zip(fd.tree.leaves(state[name][0]), fd.tree.leaves(state["eager"][0]))
    )
    fns = {
        "nn.Module + torch.optim.Adam eager": torch_step,
        "fd.train_step eager": run("eager", step),
        "fd.jit(train_step)": run("jit", jstep),
        "fd.jit(train_step, donate_argnums=(0, 1))": run("donated", dstep),
    }
    warm(fns)
    return interleaved(fns), diff


# ------------------------------------------------------------------ 3. policy
def _policy() -> fd.ProbabilisticSequential:
    return fd.ProbabilisticSequential(
        fd.Module(nn.GRUCell(4, 8), in_keys=["input", "hidden"], out_keys=["hidden"]),
        fd.Module(fd.NormalParamExtractor(), in_keys=["hidden"], out_keys=["loc", "scale"]),
        fd.Probabilistic(["loc", "scale"], ["action"], D.Normal, return_log_prob=True),
    )


def policy_rows(batch: int) -> tuple[dict, float, bool]:
    torch.manual_seed(0)
    pol = _policy()
    params = fd.from_module(pol)
    x, h = torch.randn(batch, 4), torch.randn(batch, 8)
    key = fd.random.key(0)
    rnd = fd.InteractionType.RANDOM
    jpol = fd.jit(pol)

    def call(f, k=key):
        return f(params, fd.TensorDict({"input": x, "hidden": h}, [batch]), key=k, interaction=rnd)

    diffs, bitwise = [], True
    for seed in range(3):  # the same draws as eager, for several keys (keys are inputs)
        k = fd.random.key(seed)
        a, b = call(jpol, k), call(pol, k)
        for name in ("action", "action_log_prob", "hidden"):
            # relative to the value's size: float32 rounds |v| > 1 to ~1.2e-7 |v|
            diffs.append(((a[name] - b[name]).abs() / b[name].abs().clamp_min(1)).max().item())
            bitwise = bitwise and torch.equal(a[name], b[name])
    fns = {
        "functd eager (RANDOM)": lambda: call(pol),
        "fd.jit(policy) (RANDOM)": lambda: call(jpol),
    }
    warm(fns)
    return interleaved(fns), max(diffs), bitwise


# ------------------------------------------------------------------ 4. signatures
def signatures() -> tuple[int, int]:
    torch.manual_seed(0)
    block, params = functd_block(ResidualBlock())
    j = fd.jit(block)
    with count_compiles() as c:
        for n in range(1, 25):
            j(params, fd.TensorDict({"x": torch.randn(n, 3)}, [n]))
    with count_compiles() as more:
        for n in (3, 11, 24):
            j(params, fd.TensorDict({"x": torch.randn(n, 3), "extra": torch.zeros(n)}, [n]))
    return c.jit, more.jit


# ------------------------------------------------------------------ 5. cold compile
def _cold_child(kind: str) -> None:
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    ref = ResidualBlock()
    x = torch.randn(1, 3)
    t0 = time.perf_counter()
    if kind == "jit":
        block, params = functd_block(ref)
        fd.jit(block)(params, fd.TensorDict({"x": x}, [1]))
    else:
        flat = {k: v.detach() for k, v in ref.state_dict().items()}
        torch.compile(pure_block)(flat, x)
    print(time.perf_counter() - t0)


def cold(kind: str) -> float:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "BENCH_COLD_CHILD": kind}
        out = subprocess.run(
            [sys.executable, __file__], env=env, capture_output=True, text=True, check=True
        )
    return float(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ profiles
def calls_per_call(fn) -> tuple[int, int]:
    """(Python frames, C calls) of one call of ``fn``."""
    counts = [0, 0]

    def prof(frame, event, arg):
        if event == "call":
            counts[0] += 1
        elif event == "c_call":
            counts[1] += 1

    fn()
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return counts[0] - 1, counts[1] - 1  # without the profiler's own setprofile(None)


def profile_block(batch: int = 1) -> list[list]:
    """Where the microseconds of ``fd.jit(block)(params, td)`` go at ``batch``."""
    torch.manual_seed(0)
    ref = ResidualBlock()
    x = torch.randn(batch, 3)
    flat = {k: v.detach() for k, v in ref.state_dict().items()}
    block, params = functd_block(ref)
    jblock = fd.jit(block)
    td = fd.TensorDict({"x": x}, [batch])
    jblock(params, td)
    jblock(params, td)  # the argument check is generated on a signature's second call
    entry, match, _ = jblock._fast
    ins = match((params, td), {})
    chand = torch.compile(pure_block)
    parts = {
        "build the TensorDict": lambda: fd.TensorDict({"x": x}, [batch]),
        "argument check (generated)": lambda: match((params, fd.TensorDict({"x": x}, [batch])), {}),
        "compiled code (C++ wrapper)": lambda: entry.run(list(ins)),
        "compiled code + output TensorDict": lambda: entry.outputs(ins),
        "whole fd.jit call": lambda: jblock(params, fd.TensorDict({"x": x}, [batch])),
        "hand-written F.* eager": lambda: pure_block(flat, x),
        "torch.compile(hand-written)": lambda: chand(flat, x),
    }
    warm(parts)
    t = interleaved(parts)
    rows = []
    for name, fn in parts.items():
        frames, ccalls = calls_per_call(fn)
        rows.append([name, t[name], frames, ccalls])
    return rows


# ------------------------------------------------------------------ GPU
def gpu_rows(batch: int) -> list[list]:
    """The block and the RANDOM policy on ``DEVICE``: eager, compiled, jitted, graphed."""
    torch.manual_seed(0)
    ref = ResidualBlock().to(DEVICE)
    x = torch.randn(batch, 3, device=DEVICE)
    flat = {k: v.detach() for k, v in ref.state_dict().items()}
    block, params = functd_block(ref)
    chand = torch.compile(pure_block)
    jblock, gblock = fd.jit(block), fd.jit(block, cuda_graph=True)
    fns = {
        "block: hand-written F.* eager": lambda: pure_block(flat, x),
        "block: hand-written, torch.compile": lambda: chand(flat, x),
        "block: functd Sequential eager": lambda: block(params, fd.TensorDict({"x": x}, [batch])),
        "block: fd.jit(block)": lambda: jblock(params, fd.TensorDict({"x": x}, [batch])),
        "block: fd.jit(block, cuda_graph=True)": lambda: gblock(
            params, fd.TensorDict({"x": x}, [batch])
        ),
    }
    pol = _policy()
    pparams = fd.from_module(pol).to(DEVICE)
    inp, hid = torch.randn(batch, 4, device=DEVICE), torch.randn(batch, 8, device=DEVICE)
    key, rnd = fd.random.key(0).to(DEVICE), fd.InteractionType.RANDOM
    jpol, gpol = fd.jit(pol), fd.jit(pol, cuda_graph=True)

    def act(f):
        td = fd.TensorDict({"input": inp, "hidden": hid}, [batch])
        return f(pparams, td, key=key, interaction=rnd)

    fns["policy RANDOM: functd eager"] = lambda: act(pol)
    fns["policy RANDOM: fd.jit(policy)"] = lambda: act(jpol)
    fns["policy RANDOM: fd.jit(policy, cuda_graph=True)"] = lambda: act(gpol)
    warm(fns)
    for f in (jblock, gblock):
        got = f(params, fd.TensorDict({"x": x}, [batch]))["y"]
        torch.testing.assert_close(got, pure_block(flat, x), rtol=1e-4, atol=1e-5)
    for f in (jpol, gpol):
        torch.testing.assert_close(act(f)["action"], act(pol)["action"], rtol=1e-5, atol=1e-6)
    t = interleaved(fns)
    hand, eager_pol = t["block: hand-written F.* eager"], t["policy RANDOM: functd eager"]
    return [
        [batch, name, us, us / (hand if name.startswith("block") else eager_pol)]
        for name, us in t.items()
    ]


def main_gpu() -> None:
    clock = "wall time" if CLOCK == "wall" else "CPU time (process clock)"
    print(f"# fd.jit on {DEVICE} ({machine()}; {clock})\n")
    rows = []
    for batch in (1,) if QUICK else (1, 256):
        rows += gpu_rows(batch)
    print(table(["batch", "version", "µs", "ratio to eager (hand / functd)"], rows))


# ------------------------------------------------------------------ main
def _ok(met: bool) -> str:
    return "met" if met else "MISSED"


def main() -> None:
    torch.set_num_threads(THREADS)
    clock = "CPU time (process clock)" if CLOCK == "process" else "wall time"
    print(f"# fd.jit ({machine()}; {clock})\n")
    rows, targets = [], []
    for batch in (1, 256):
        t = block_rows(batch)
        hand, comp, jit = (
            t["hand-written F.* eager"],
            t["hand-written, torch.compile"],
            t["fd.jit(block)"],
        )
        for name, us in t.items():
            rows.append([f"tutorial block, batch {batch}", name, us, us / hand])
        limit = 1.2 if batch == 1 else 1.0
        targets.append(
            f"block batch {batch}: fd.jit / hand eager {jit / hand:.2f}x <= {limit}x: {_ok(jit <= limit * hand)}"
        )
        if batch == 1:
            targets.append(
                f"block batch 1: fd.jit / torch.compile(hand) {jit / comp:.2f}x <= 0.3x: {_ok(jit <= 0.3 * comp)}"
            )
    t, diff = adam_rows()
    base = t["nn.Module + torch.optim.Adam eager"]
    for name, us in t.items():
        rows.append(["Adam step, batch 256", name, us, us / base])
    best = min(t["fd.jit(train_step)"], t["fd.jit(train_step, donate_argnums=(0, 1))"])
    targets.append(
        f"Adam step: fd.jit / torch eager {t['fd.jit(train_step)'] / base:.2f}x (donated {t['fd.jit(train_step, donate_argnums=(0, 1))'] / base:.2f}x) <= 0.5x: {_ok(best <= 0.5 * base)}"
    )
    targets.append(
        f"Adam step: params vs eager functd step, max |diff| {diff:.1e} <= 1e-6: {_ok(diff <= 1e-6)}"
    )
    for batch in (1, 256):
        t, pdiff, bitwise = policy_rows(batch)
        eager = t["functd eager (RANDOM)"]
        for name, us in t.items():
            rows.append([f"GRU policy RANDOM, batch {batch}", name, us, us / eager])
        jit = t["fd.jit(policy) (RANDOM)"]
        targets.append(
            f"policy batch {batch}: fd.jit / functd eager {jit / eager:.2f}x <= 0.5x: {_ok(jit <= 0.5 * eager)}"
        )
        targets.append(
            f"policy batch {batch}: same draws as eager: bitwise {bitwise}, max |diff| {pdiff:.1e} <= 1e-6: {_ok(pdiff <= 1e-6)}"
        )
    print(table(["case", "version", "µs", "ratio to first row"], rows))
    n24, nkeys = signatures()
    targets.append(
        f"signatures: batch sizes 1..24 compiled {n24}x <= 2: {_ok(n24 <= 2)}; a new key set {nkeys}x == 1: {_ok(nkeys == 1)}"
    )
    if COLD:
        times = {"jit": [], "compile": []}
        for _ in range(2):  # interleaved, the best of two each
            for kind in times:
                times[kind].append(cold(kind))
        j, c = min(times["jit"]), min(times["compile"])
        print(
            f"\ncold compile, fresh process and inductor cache (s): fd.jit(block) {times['jit']}, torch.compile(hand-written) {times['compile']}"
        )
        targets.append(
            f"cold compile: fd.jit / torch.compile {j / c:.2f}x <= 1.5x: {_ok(j <= 1.5 * c)}"
        )
    for batch in (1, 256):
        print(
            f"\nper-call profile, tutorial block batch {batch} (µs; Python frames and C calls "
            "of one call):\n"
        )
        print(table(["part", "µs", "Python frames", "C calls"], profile_block(batch)))
    print("\ntargets:")
    for line in targets:
        print("  " + line)


if __name__ == "__main__":
    if os.environ.get("BENCH_COLD_CHILD"):
        _cold_child(os.environ["BENCH_COLD_CHILD"])
    elif ON_GPU or QUICK:
        main_gpu()
    else:
        main()
