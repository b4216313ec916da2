"""The tensordict tutorial's residual block: functd against its peers, one run.

Rows: plain nn.Module, a hand-written pure F.linear function,
torch.func.functional_call, tensordict's TensorDictSequential (td call and
keyword call, when tensordict is installed) and functd's Sequential (td call
and keyword call), eager and torch.compile'd, at batch 1 and 256, under no_grad
and with grad; each td call builds its TensorDict. Last rows: a chain of 16
cheap modules against the plain loop (per-module overhead). Eager times are the
best of BENCH_ROUNDS interleaved medians of this process's CPU time with
BENCH_THREADS=1 thread (BENCH_CLOCK=wall: wall time). One table, then the
targets of issue 11.

Run: .venv/bin/python benchmarks/tutorial_block.py   (BENCH_COMPILE=0: eager only)
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from _common import CLOCK, THREADS, clock_us, machine, table

import functd as fd

COMPILE = os.environ.get("BENCH_COMPILE", "1") == "1"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
RUN_TIME = float(os.environ.get("BENCH_MIN_RUN_TIME", "0.1"))  # per measurement and round


class ResidualBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear0 = nn.Linear(3, 128)
        self.linear1 = nn.Linear(128, 128)
        self.linear2 = nn.Linear(128, 3)

    def forward(self, x):
        y = torch.relu(self.linear0(x))
        y = torch.relu(self.linear1(y))
        return self.linear2(y) + x


def pure_block(p, x):
    h = torch.relu(F.linear(x, p["linear0.weight"], p["linear0.bias"]))
    h = torch.relu(F.linear(h, p["linear1.weight"], p["linear1.bias"]))
    return F.linear(h, p["linear2.weight"], p["linear2.bias"]) + x


def functd_block(ref):
    block = fd.Sequential(
        fd.Module(ref.linear0, ["x"], ["linear0"]),
        fd.Module(torch.relu, ["linear0"], ["relu0"]),
        fd.Module(ref.linear1, ["relu0"], ["linear1"]),
        fd.Module(nn.ReLU(), ["linear1"], ["relu1"]),
        fd.Module(ref.linear2, ["relu1"], ["linear2"]),
        fd.Module(lambda x, y: x + y, ["x", "linear2"], ["y"]),
        selected_out_keys=["y"],
    )
    return block, fd.from_module(block)


def tensordict_block(ref):
    try:
        from tensordict.nn import TensorDictModule as M
        from tensordict.nn import TensorDictSequential
    except ImportError:
        return None
    return TensorDictSequential(
        M(ref.linear0, ["x"], ["linear0"]),
        M(torch.relu, ["linear0"], ["relu0"]),
        M(ref.linear1, ["relu0"], ["linear1"]),
        M(nn.ReLU(), ["linear1"], ["relu1"]),
        M(ref.linear2, ["relu1"], ["linear2"]),
        M(lambda x, y: x + y, ["x", "linear2"], ["y"]),
        selected_out_keys=["y"],
    )


def cases(batch: int):
    """name -> (function, call): every call builds its input TensorDict, as a user's
    loop does."""
    torch.manual_seed(0)
    ref = ResidualBlock()
    x = torch.randn(batch, 3)
    flat = {k: v.detach() for k, v in ref.state_dict().items()}
    block, params = functd_block(ref)
    out = {
        "nn.Module": (ref, lambda f: f(x)),
        "hand-written F.linear": (pure_block, lambda f: f(flat, x)),
        "functional_call": (
            lambda p, x: torch.func.functional_call(ref, p, (x,)),
            lambda f: f(flat, x),
        ),
        "functd Sequential (td)": (
            block,
            lambda f: f(params, fd.TensorDict({"x": x}, [batch])),
        ),
        "functd Sequential (kw)": (block, lambda f: f(params, x=x)),
    }
    tdm = tensordict_block(ref)
    if tdm is not None:
        from tensordict import TensorDict

        out["tensordict Sequential (td)"] = (
            tdm,
            lambda f: f(TensorDict({"x": x}, [batch])),
        )
        out["tensordict Sequential (kw)"] = (tdm, lambda f: f(x=x))
    with torch.no_grad():
        expect = ref(x)
        torch.testing.assert_close(block(params, x=x), expect)
    return out


def chain_cases(n: int = 16):
    """A chain of ``n`` cheap modules (torch.neg on a [1, 3] tensor) against the plain
    loop: the per-module overhead."""
    x = torch.randn(1, 3)
    keys = [f"k{i}" for i in range(n + 1)]
    seq = fd.Sequential(*[fd.Module(torch.neg, [keys[i]], [keys[i + 1]]) for i in range(n)])

    def plain(x):
        for _ in range(n):
            x = torch.neg(x)
        return x

    out = {
        "plain loop": (plain, lambda f: f(x)),
        "functd Sequential (td)": (seq, lambda f: f(None, fd.TensorDict({"k0": x}, [1]))),
    }
    try:
        from tensordict import TensorDict
        from tensordict.nn import TensorDictModule, TensorDictSequential
    except ImportError:
        return out
    tseq = TensorDictSequential(
        *[TensorDictModule(torch.neg, [keys[i]], [keys[i + 1]]) for i in range(n)]
    )
    out["tensordict Sequential (td)"] = (tseq, lambda f: f(TensorDict({"k0": x}, [1])))
    return out


def interleaved(fns: dict) -> dict:
    """Best of ROUNDS medians per function, measured in turn (a shared machine drifts)."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            best[name] = min(best[name], clock_us(fn, min_run_time=RUN_TIME))
    return best


def measure(grad: bool, batch: int, made: dict) -> dict:
    """name -> (eager µs, compiled µs) for one grad mode and batch: everything compiled
    and warmed up first, then eager and compiled calls measured in interleaved rounds."""
    with torch.set_grad_enabled(grad):
        fns = {(n, "eager"): (lambda fn=fn, call=call: call(fn)) for n, (fn, call) in made.items()}
        if COMPILE:
            torch._dynamo.reset()
            for name, (fn, call) in made.items():
                cf = torch.compile(fn)
                for _ in range(3):
                    call(cf)
                fns[name, "compiled"] = lambda cf=cf, call=call: call(cf)
        t = interleaved(fns)
    nan = float("nan")
    return {n: (t[n, "eager"], t.get((n, "compiled"), nan)) for n in made}


def main():
    torch.set_num_threads(THREADS)
    rows = []
    results = {}
    for grad in (False, True):
        for batch in (1, 256):
            res = measure(grad, batch, cases(batch))
            results[grad, batch] = res
            he, hc = res["hand-written F.linear"]
            for name, (e, c) in res.items():
                rows.append(["grad" if grad else "no_grad", batch, name, e, c, e / he, c / hc])
    with torch.no_grad():
        res = measure(False, 1, chain_cases())
        pe, pc = res["plain loop"]
        for name, (e, c) in res.items():
            rows.append(["no_grad", "chain of 16 neg", name, e, c, e / pe, c / pc])
    clock = "CPU time (process clock)" if CLOCK == "process" else "wall time"
    print(f"# tutorial block, TensorDict built in each call ({machine()}; {clock})\n")
    print(
        table(
            [
                "mode",
                "batch",
                "version",
                "eager µs",
                "compiled µs",
                "eager / hand",
                "compiled / hand",
            ],
            rows,
        )
    )
    print("\ntargets (eager unless said):")
    for (grad, batch), res in results.items():
        mode = "grad" if grad else "no_grad"
        f, h = res["functd Sequential (td)"], res["hand-written F.linear"]
        limit = 1.25 if batch == 1 else 1.05
        print(
            f"  {mode}, batch {batch}: functd / hand {f[0] / h[0]:.2f}x <= {limit}x: {_ok(f[0] <= limit * h[0])}"
        )
        if batch == 1 and "tensordict Sequential (td)" in res:
            t = res["tensordict Sequential (td)"]
            print(
                f"  {mode}, batch 1: functd / tensordict {f[0] / t[0]:.2f}x <= 0.25x: {_ok(f[0] <= 0.25 * t[0])}"
            )
        if COMPILE:
            print(
                f"  {mode}, batch {batch}, compiled: functd / hand {f[1] / h[1]:.2f}x <= 1.05x: {_ok(f[1] <= 1.05 * h[1])}"
            )


def _ok(met: bool) -> str:
    return "met" if met else "MISSED"


if __name__ == "__main__":
    main()
