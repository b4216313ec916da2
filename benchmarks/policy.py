"""The tensordict tutorial's GRU policy: functd against tensordict, one run.

GRUCell -> NormalParamExtractor -> Normal head with log-prob, at batch 1 and
256, deterministic and random: functd eager (td call) and compiled, and
tensordict's ProbabilisticTensorDictSequential eager (when installed; its
random rows draw from torch's global generator, ours from a key). Each timed
call builds its TensorDict, with grad mode on (as a user's loop runs). Target
(issue 11): functd eager <= 0.6x tensordict eager, both interaction types.
BENCH_DEVICE=cuda runs it on the GPU. Times: best of BENCH_ROUNDS interleaved
medians of this process's CPU time with BENCH_THREADS=1 (BENCH_CLOCK=wall: wall
time; always wall on the GPU).

Run: .venv/bin/python benchmarks/policy.py   (BENCH_COMPILE=0 skips compiling)
"""

from __future__ import annotations

import os
import sys

import torch
from torch import distributions as D
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from _common import CLOCK, DEVICE, THREADS, clock_us, machine, table

import functd as fd

COMPILE = os.environ.get("BENCH_COMPILE", "1") == "1"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "7"))


def functd_policy(net):
    return fd.ProbabilisticSequential(
        fd.Module(net, in_keys=["input", "hidden"], out_keys=["hidden"]),
        fd.Module(fd.NormalParamExtractor(), in_keys=["hidden"], out_keys=["loc", "scale"]),
        fd.Probabilistic(["loc", "scale"], ["action"], D.Normal, return_log_prob=True),
    )


def tensordict_policy(net, interaction="deterministic"):
    try:
        from tensordict.nn import NormalParamExtractor, TensorDictModule
        from tensordict.nn import ProbabilisticTensorDictModule as PM
        from tensordict.nn import ProbabilisticTensorDictSequential as PS
    except ImportError:
        return None
    return PS(
        TensorDictModule(net, in_keys=["input", "hidden"], out_keys=["hidden"]),
        TensorDictModule(NormalParamExtractor(), in_keys=["hidden"], out_keys=["loc", "scale"]),
        PM(
            ["loc", "scale"],
            ["action"],
            distribution_class=D.Normal,
            return_log_prob=True,
            default_interaction_type=interaction,
        ),
    )


def interleaved(fns: dict) -> dict:
    """The best of ROUNDS medians of each function, measured in turn (a shared,
    loaded machine drifts; interleaving keeps the ratios honest)."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            best[name] = min(best[name], clock_us(fn, min_run_time=0.1))
    return best


def rows(batch: int) -> list[list]:
    """One row per interaction type: the TensorDict is built inside each timed
    call and grad mode is on, as a user's own loop runs it."""
    torch.manual_seed(0)
    net = nn.GRUCell(4, 8).to(DEVICE)
    pol = functd_policy(net)
    params = fd.from_module(pol)
    x = torch.randn(batch, 4, device=DEVICE)
    h = torch.randn(batch, 8, device=DEVICE)
    key = fd.random.key(0).to(DEVICE)
    out = []
    for mode in ("deterministic", "random"):
        it = fd.InteractionType.RANDOM if mode == "random" else None
        k = key if mode == "random" else None

        def call(p, x, h, k, it=it):
            return pol(p, fd.TensorDict({"input": x, "hidden": h}, [batch]), key=k, interaction=it)

        fns = {"ours": lambda call=call, k=k: call(params, x, h, k)}
        if COMPILE:
            torch._dynamo.reset()
            f = torch.compile(call, fullgraph=True)
            for _ in range(3):
                f(params, x, h, k)
            fns["compiled"] = lambda f=f, k=k: f(params, x, h, k)
        ref = tensordict_policy(net, mode)  # its random mode: the module default
        if ref is not None:
            from tensordict import TensorDict

            fns["theirs"] = lambda ref=ref: ref(TensorDict({"input": x, "hidden": h}, [batch]))
        t = interleaved(fns)
        nan = float("nan")
        ours, comp, theirs = t["ours"], t.get("compiled", nan), t.get("theirs", nan)
        out.append([batch, mode, ours, comp, theirs, ours / theirs])
    return out


def main() -> None:
    torch.set_num_threads(THREADS)
    clock = "CPU time (process clock)" if CLOCK == "process" else "wall time"
    print(
        f"# GRU policy call, td built in the call, grad mode on ({machine()}, {DEVICE}; {clock})\n"
    )
    body = rows(1) + rows(256)
    print(
        table(
            [
                "batch",
                "interaction",
                "functd eager µs",
                "functd compiled µs",
                "tensordict eager µs",
                "functd / tensordict (eager)",
            ],
            body,
        )
    )


if __name__ == "__main__":
    main()
