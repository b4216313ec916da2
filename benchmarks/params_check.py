"""What the params check's params-check cache (``_td/_marks.py``) saves: module calls with the mark, and
the same calls with the check forced (the marks of the params' sub-TensorDicts
cleared before each call), measured in turn in one process.

Rows: the tutorial block (two Linear) and the GRU policy (one GRUCell), batch 1
and 256, TensorDict built in each call, grad mode on. Times: the median of
BENCH_ROUNDS interleaved rounds of this process's CPU time, one thread; the
ratios are the medians of the rounds' paired ratios. Why the cache stays:
notes/design.md ("The params-check cache"); the latest figures: notes/performance.md.

A second table times ``fd.train_step`` (Adam, the two models of
benchmarks/train_step.py), and a hand-written ``fd.grad`` loop, as they are, where the eager gradient keeps the marks the
modules leave on its detached copy of the params on the params given to the
step (so the next step's params skip the check), against the same step with
that hand-over switched off (every step checks every module), and torch's eager
step (``torch.optim.Adam(foreach=True)``) beside them. See notes/distributed.md
("Speed against DDP"), where the hand-over keeps the data-parallel step at par.

Run: .venv/bin/python benchmarks/params_check.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
from torch import distributions as D
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from _common import machine, table

import functd as fd
from functd._td._marks import mark

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "15"))
CALLS = 200


def interleaved(*fs, calls: int = CALLS) -> list[list[float]]:
    """Each function's µs per call in each of ``ROUNDS`` rounds (the order alternating
    from round to round)."""
    ts: list[list[float]] = [[] for _ in fs]
    for r in range(ROUNDS):
        order = list(enumerate(fs)) if r % 2 == 0 else list(enumerate(fs))[::-1]
        for i, f in order:
            t = time.process_time()
            for _ in range(calls):
                f()
            ts[i].append((time.process_time() - t) / calls * 1e6)
    return ts


def med(xs) -> float:
    return statistics.median(xs)


def paired(a: list[float], b: list[float]) -> float:
    """The median of the rounds' ratios ``a / b`` (drift between rounds cancels)."""
    return med(x / y for x, y in zip(a, b))


def small_mlp() -> nn.Sequential:
    """The small MLP of benchmarks/data_parallel.py (its params are nested: one
    sub-TensorDict a Linear, checked against the whole Sequential)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1)
    )


def make_small():
    ref = small_mlp()
    return ref, fd.Module(small_mlp(), in_keys=["x"], out_keys=["pred"]), fd.from_module(ref)


def grad_loop(block, params, x, y):
    """A hand-written step: ``fd.grad``, ``adam.update``, ``apply_updates``."""
    out_key = block.out_keys[-1]
    opt = fd.optim.adam(1e-3)
    batch = fd.TensorDict({"x": x, "y": y}, [x.shape[0]])
    state = {"p": params, "s": opt.init(params)}

    def loss(p, batch):
        return torch.nn.functional.mse_loss(block(p, batch)[out_key], batch["y"])

    def call():
        g = fd.grad(loss)(state["p"], batch)
        u, state["s"] = opt.update(g, state["s"], state["p"])
        state["p"] = fd.optim.apply_updates(state["p"], u)

    return call


def train_steps() -> list[list]:
    """``fd.train_step`` and an ``fd.grad`` loop with the marks handed over, without,
    and torch's step."""
    import train_step as ts

    import functd._transforms._autodiff as autodiff

    keep = autodiff.keep_marks
    rows = []
    models = (
        ("tutorial block", ts.make_block, 3, 3),
        ("MLP 4x256", ts.make_mlp, 3, 3),
        ("MLP 8-32-32-1 as one fd.Module", make_small, 8, 1),
    )
    for name, make, n_in, n_out in models:
        ref, block, params = make()
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(64, n_in, generator=g), torch.randn(64, n_out, generator=g)
        peer = ts.torch_steps(ref, x, y)["torch eager"]
        for how in ("train_step", "fd.grad loop"):
            built = []
            for p in (params.clone(), params.clone()):
                if how == "train_step":
                    built.append(ts.functd_steps(block, p, x, y)["functd eager"])
                else:
                    built.append(grad_loop(block, p, x, y))
            kept, plain = built

            def dropped(plain=plain):
                autodiff.keep_marks = lambda seen, like: None
                try:
                    plain()
                finally:
                    autodiff.keep_marks = keep

            for f in (kept, dropped, peer):
                for _ in range(10):
                    f()
            t_kept, t_dropped, t_torch = interleaved(kept, dropped, peer, calls=40)
            ratios = [
                paired(t_kept, t_torch),
                paired(t_dropped, t_torch),
                paired(t_kept, t_dropped),
            ]
            row = [f"{name}, {how}", med(t_kept), med(t_dropped), med(t_torch), *ratios]
            rows.append(row)
    return rows


def forced(call, params):
    """``call`` after clearing the marks of the params and their sub-TensorDicts."""
    subs = [params, *(v for v in params._data.values() if type(v) is fd.TensorDict)]

    def f():
        for s in subs:
            mark(s, None)
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
    mlp = fd.Module(small_mlp(), in_keys=["x"], out_keys=["pred"])
    bp, pp, mp = fd.from_module(block), fd.from_module(policy), fd.from_module(mlp)
    rows = []
    for batch in (1, 256):
        x, i, h = torch.randn(batch, 3), torch.randn(batch, 4), torch.randn(batch, 8)

        def call_block(x=x, batch=batch):
            return block(bp, fd.TensorDict({"x": x}, [batch]))

        def call_policy(i=i, h=h, batch=batch):
            return policy(pp, fd.TensorDict({"input": i, "hidden": h}, [batch]))

        def call_mlp(batch=batch):
            return mlp(mp, fd.TensorDict({"x": torch.randn(batch, 8)}, [batch]))

        cases = (
            ("tutorial block", call_block, bp),
            ("GRU policy", call_policy, pp),
            ("nn.Sequential 8-32-32-1 as one fd.Module", call_mlp, mp),
        )
        for name, call, p in cases:
            for _ in range(20):
                call()
            t_mark, t_forced = interleaved(call, forced(call, p))
            rows.append([name, batch, med(t_mark), med(t_forced), paired(t_forced, t_mark)])
    print(f"# params check each call vs the params-check cache ({machine()})")
    print(table(["call", "batch", "with mark µs", "check forced µs", "forced / mark"], rows))
    print(f"# training steps (Adam, batch 64): marks kept vs dropped ({machine()})")
    cols = ["model", "kept µs", "dropped µs", "torch µs", "kept / torch", "dropped / torch"]
    cols.append("kept / dropped")
    print(table(cols, train_steps()))


if __name__ == "__main__":
    main()
