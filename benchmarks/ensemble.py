"""Ensembles of the tutorial block: functd fd.vmap against a Python loop over
nn.Modules and against torch.func.stack_module_state + vmap(functional_call).

Ensembles of 4, 16 and 64 members at batch 64 on shared data; forward, and
forward + backward (the gradient of the summed member losses with respect to
every member's weights). Eager and torch.compile'd (inductor), one run.

Targets (issue 5, tightened by issue 11): functd <= 1.05x stack_module_state at
every size, forward and forward+backward, never
slower than the loop, and compiled functd ahead of both eager peers.

Run: .venv/bin/python benchmarks/ensemble.py. It takes about 3 minutes of CPU
time, most of it inductor compiling 12 graphs; BENCH_COMPILE=0 skips compiling
(~20 s), BENCH_QUICK=1 only measures 4 and 64 members. Times are the CPU time
of this process (BENCH_CLOCK=process, BENCH_THREADS=1): on a shared machine
wall-clock times swing several-fold with the others' load, CPU time of one
thread does not; BENCH_CLOCK=wall BENCH_THREADS=2 gives wall-clock times. The versions are measured
in BENCH_ROUNDS=5 interleaved rounds of BENCH_MIN_RUN_TIME=0.1 s each and each
version keeps its best median: on a shared machine the load changes by the
minute, and a single long measurement per version compares different loads.
"""

from __future__ import annotations

import copy
import os
import sys

import torch
from torch.func import functional_call, stack_module_state

sys.path.insert(0, os.path.dirname(__file__))
from _common import CLOCK, DEVICE, clock_us, machine, table
from tutorial_block import ResidualBlock, functd_block

import functd as fd

COMPILE = os.environ.get("BENCH_COMPILE", "1") == "1"
SIZES = (4, 64) if os.environ.get("BENCH_QUICK", "0") == "1" else (4, 16, 64)
BATCH = 64
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
RUN_TIME = float(os.environ.get("BENCH_MIN_RUN_TIME", "0.1"))  # per measurement and round
THREADS = int(os.environ.get("BENCH_THREADS", "1"))
# "process": CPU time; "wall": median_us (always on the GPU, BENCH_DEVICE=cuda)


def cases(n: int):
    """name -> (forward fn, forward+backward fn), all on the same weights and data."""
    torch.manual_seed(0)
    nets = [ResidualBlock().to(DEVICE) for _ in range(n)]
    x = torch.randn(BATCH, 3, device=DEVICE)
    td = fd.TensorDict({"x": x}, [BATCH])

    # Python loop over nn.Modules
    loop_params = [p for net in nets for p in net.parameters()]

    def loop_fwd():
        return torch.stack([net(x) for net in nets])

    def loop_bwd():
        loss = sum(net(x).pow(2).mean() for net in nets)
        return torch.autograd.grad(loss, loop_params)

    # torch.func.stack_module_state + vmap(functional_call)
    params, buffers = stack_module_state(nets)
    base = copy.deepcopy(nets[0]).to("meta")

    def member(p, b, x):
        return functional_call(base, (p, b), (x,))

    sms_map = torch.func.vmap(member, in_dims=(0, 0, None))

    def sms_fwd(p=params):
        return sms_map(p, buffers, x)

    def sms_loss(p):
        return sms_map(p, buffers, x).pow(2).mean((1, 2)).sum()

    sms_grad = torch.func.grad(sms_loss)

    def sms_bwd():
        return sms_grad(params)

    # functd
    block, _ = functd_block(nets[0])
    ens = fd.stack([functd_block(net)[1] for net in nets])
    fd_map = fd.vmap(block, in_dims=(0, None))

    def fd_fwd_fn(ens, td):
        return fd_map(ens, td)["y"]

    def fd_loss(ens, td):
        return fd_map(ens, td)["y"].pow(2).mean((1, 2)).sum()

    fd_grad = fd.grad(fd_loss)

    with torch.no_grad():
        ref = loop_fwd()
        torch.testing.assert_close(sms_fwd(), ref)
        torch.testing.assert_close(fd_fwd_fn(ens, td), ref)
    g = fd_grad(ens, td)
    torch.testing.assert_close(g["0", "weight"], sms_bwd()["linear0.weight"])

    out = {
        "loop over nn.Modules": (loop_fwd, loop_bwd),
        "stack_module_state + vmap": (sms_fwd, sms_bwd),
        "functd fd.vmap": (lambda: fd_fwd_fn(ens, td), lambda: fd_grad(ens, td)),
    }
    if COMPILE:
        # fullgraph: a graph break inside a vmap makes dynamo run the whole vmap eagerly
        # (torch 2.11 broke in TensorDict's constructor: the H200 row measured eager code)
        c_sms_fwd = torch.compile(lambda p: sms_map(p, buffers, x), fullgraph=True)
        c_sms_bwd = torch.compile(sms_grad, fullgraph=True)
        c_fd_fwd = torch.compile(fd_fwd_fn, fullgraph=True)
        c_fd_bwd = torch.compile(fd_grad, fullgraph=True)
        out["compiled stack_module_state + vmap"] = (
            lambda: c_sms_fwd(params),
            lambda: c_sms_bwd(params),
        )
        out["compiled functd fd.vmap"] = (lambda: c_fd_fwd(ens, td), lambda: c_fd_bwd(ens, td))
        with torch.no_grad():
            torch.testing.assert_close(c_fd_fwd(ens, td), ref)
        torch.testing.assert_close(c_fd_bwd(ens, td)["0", "weight"], g["0", "weight"])
    return out


def main():
    torch.set_num_threads(THREADS)
    clock = "CPU time (process clock)" if CLOCK == "process" else "wall time"
    print(
        f"# ensembles of the tutorial block, batch {BATCH}, shared data ({machine()}); "
        f"{clock}, best median of {ROUNDS} interleaved rounds\n"
    )
    all_cases = {n: cases(n) for n in SIZES}
    for fns in all_cases.values():  # warm up (and compile) everything first
        for fwd, bwd in fns.values():
            with torch.no_grad():
                for _ in range(3):
                    fwd()
            for _ in range(3):
                bwd()
    # the machine is shared: interleave the versions and keep each one's best median
    results: dict = {}
    for _ in range(ROUNDS):
        for n, fns in all_cases.items():
            for name, (fwd, bwd) in fns.items():
                with torch.no_grad():
                    t_fwd = clock_us(fwd, RUN_TIME)
                t_bwd = clock_us(bwd, RUN_TIME)
                old = results.get((name, n), (float("inf"), float("inf")))
                results[(name, n)] = (min(old[0], t_fwd), min(old[1], t_bwd))
    rows = []
    for n in SIZES:
        sf, sb = results[("stack_module_state + vmap", n)]
        lf, lb = results[("loop over nn.Modules", n)]
        for (name, m), (f, b) in results.items():
            if m == n:
                rows.append([name, n, f / 1e3, b / 1e3, f / sf, b / sb, lf / f, lb / b])
    print(
        table(
            [
                "version",
                "members",
                "fwd ms",
                "fwd+bwd ms",
                "fwd / sms",
                "fwd+bwd / sms",
                "loop / fwd",
                "loop / fwd+bwd",
            ],
            rows,
        )
    )
    print("\ntargets:")
    for n in SIZES:
        ff, fb = results[("functd fd.vmap", n)]
        sf, sb = results[("stack_module_state + vmap", n)]
        lf, lb = results[("loop over nn.Modules", n)]
        ok1 = ff <= 1.05 * sf and fb <= 1.05 * sb
        ok2 = ff <= lf and fb <= lb
        print(
            f"  {n:>2} members: functd/sms fwd {ff / sf:.2f}x, fwd+bwd {fb / sb:.2f}x (<= 1.05x: "
            f"{'met' if ok1 else 'MISSED'}); loop/functd fwd {lf / ff:.2f}x, fwd+bwd {lb / fb:.2f}x "
            f"(never slower: {'met' if ok2 else 'MISSED'})"
        )
        if COMPILE:
            cf, cb = results[("compiled functd fd.vmap", n)]
            ok3 = cf < min(sf, lf) and cb < min(sb, lb)
            print(
                f"      compiled functd fwd {cf / 1e3:.3f} ms, fwd+bwd {cb / 1e3:.3f} ms vs best eager "
                f"peer {min(sf, lf) / 1e3:.3f} / {min(sb, lb) / 1e3:.3f} ms (ahead of both: "
                f"{'met' if ok3 else 'MISSED'})"
            )


if __name__ == "__main__":
    main()
