"""What the params check's ``_checked`` mark saves: module calls with the mark, and
the same calls with the check forced (the marks of the params' sub-TensorDicts
cleared before each call), measured in turn in one process.

Rows: the tutorial block (two Linear) and the GRU policy (one GRUCell), batch 1
and 256, TensorDict built in each call, grad mode on. Times: the median of
BENCH_ROUNDS interleaved rounds of this process's CPU time, one thread. See
notes/performance.md ("The `_checked` slot stays").

A second table times ``fd.train_step`` (Adam, the two models of
benchmarks/train_step.py) as it is, where the eager gradient keeps the marks the
modules leave on its detached copy of the params on the params given to the
step (so the next step's params skip the check), against the same step with
that hand-over switched off (every step checks every module, as before stop
18), and torch's eager step (``torch.optim.Adam(foreach=True)``) beside them.
See notes/performance.md ("The mark through ``train_step``").

Run: .venv/bin/python benchmarks/params_check.py
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch import distributions as D
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from _common import machine, table

import functd as fd
from functd._td import _set_checked

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "15"))
CALLS = 200


def interleaved(*fs, calls: int = CALLS) -> list[float]:
    """The median over ``ROUNDS`` rounds of each function's µs per call (the order
    alternating from round to round)."""
    ts: list[list[float]] = [[] for _ in fs]
    for r in range(ROUNDS):
        order = list(enumerate(fs)) if r % 2 == 0 else list(enumerate(fs))[::-1]
        for i, f in order:
            t = time.process_time()
            for _ in range(calls):
                f()
            ts[i].append((time.process_time() - t) / calls * 1e6)
    return [sorted(t)[ROUNDS // 2] for t in ts]


def train_steps() -> list[list]:
    """``fd.train_step`` with the marks handed over, without, and torch's step."""
    import train_step as ts

    import functd._transforms._autodiff as autodiff

    keep = autodiff.keep_marks
    rows = []
    for name, make in (("tutorial block", ts.make_block), ("MLP 4x256", ts.make_mlp)):
        ref, block, params = make()
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(64, 3, generator=g), torch.randn(64, 3, generator=g)
        kept = ts.functd_steps(block, params.clone(), x, y)["functd eager"]
        plain = ts.functd_steps(block, params.clone(), x, y)["functd eager"]

        def dropped(plain=plain):
            autodiff.keep_marks = lambda seen, like: None
            try:
                plain()
            finally:
                autodiff.keep_marks = keep

        peer = ts.torch_steps(ref, x, y)["torch eager"]
        for f in (kept, dropped, peer):
            for _ in range(10):
                f()
        t_kept, t_dropped, t_torch = interleaved(kept, dropped, peer, calls=40)
        rows.append([name, t_kept, t_dropped, t_torch, t_kept / t_torch, t_dropped / t_torch])
    return rows


def forced(call, params):
    """``call`` after clearing the marks of the params' sub-TensorDicts."""
    subs = [v for v in params._data.values() if type(v) is fd.TensorDict]

    def f():
        for s in subs:
            _set_checked(s, None)
        return call()

    return f


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    block = fd.Sequential(
        fd.Module(nn.Linear(3, 8), ["x"], ["h0"]),
        fd.Module(torch.relu, ["h0"], ["a0"]),
        fd.Module(nn.Linear(8, 3), ["a0"], ["h1"]),
        fd.Module(lambda x, h: x + h, ["x", "h1"], ["y"]),
        selected_out_keys=["y"],
    )
    policy = fd.ProbabilisticSequential(
        fd.Module(nn.GRUCell(4, 8), in_keys=["input", "hidden"], out_keys=["hidden"]),
        fd.Module(fd.NormalParamExtractor(), in_keys=["hidden"], out_keys=["loc", "scale"]),
        fd.Probabilistic(["loc", "scale"], ["action"], D.Normal, return_log_prob=True),
    )
    bp, pp = fd.from_module(block), fd.from_module(policy)
    rows = []
    for batch in (1, 256):
        x, i, h = torch.randn(batch, 3), torch.randn(batch, 4), torch.randn(batch, 8)

        def call_block(x=x, batch=batch):
            return block(bp, fd.TensorDict({"x": x}, [batch]))

        def call_policy(i=i, h=h, batch=batch):
            return policy(pp, fd.TensorDict({"input": i, "hidden": h}, [batch]))

        for name, call, p in (("tutorial block", call_block, bp), ("GRU policy", call_policy, pp)):
            for _ in range(20):
                call()
            t_mark, t_forced = interleaved(call, forced(call, p))
            rows.append([name, batch, t_mark, t_forced, t_forced / t_mark])
    print(f"# params check each call vs the _checked mark ({machine()})")
    print(table(["call", "batch", "with mark µs", "check forced µs", "forced / mark"], rows))
    print(f"# fd.train_step (Adam, batch 64): marks kept vs dropped ({machine()})")
    cols = ["model", "kept µs", "dropped µs", "torch µs", "kept / torch", "dropped / torch"]
    print(table(cols, train_steps()))


if __name__ == "__main__":
    main()
