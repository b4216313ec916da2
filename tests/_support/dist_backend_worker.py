"""One rank of tests/test_distributed_backend.py: functd.distributed on one backend.

Run as ``python tests/_support/dist_backend_worker.py RANK WORLD PORT OUT_DIR BACKEND``
with BACKEND ``gloo`` (CPU tensors) or ``nccl`` (rank ``r`` on CUDA device
``r % device_count``). The checks are written once for either device: the
collectives on TensorDicts, ``chain(pmean(), adam)`` against one process on the
full batch, ``fit(data_parallel=True)`` against ``fit``, and (with 2 ranks) the
cross-rank structure check. Each outcome goes to ``OUT_DIR/rank{RANK}.json``.
"""

from __future__ import annotations

import datetime
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import functd as fd
from tests._support.dist_job import run_checks

RANK, WORLD, PORT, OUT, BACKEND = (
    int(sys.argv[1]),
    int(sys.argv[2]),
    int(sys.argv[3]),
    sys.argv[4],
    sys.argv[5],
)
CUDA = BACKEND == "nccl"
DEVICE = torch.device("cuda", RANK % torch.cuda.device_count()) if CUDA else torch.device("cpu")
DT = torch.float64
TOL = dict(rtol=1e-10, atol=1e-12)
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def on_device(tree) -> None:
    for x in fd.tree.leaves(tree):
        assert x.device == DEVICE, f"a leaf on {x.device}, expected {DEVICE}"


def td_for(r: int) -> fd.TensorDict:
    g = torch.Generator().manual_seed(10 + r)
    td = fd.TensorDict(
        {"w": torch.randn(4, 6, generator=g), "inner": {"b": torch.randn(4, generator=g)}}, [4]
    )
    return td.to(DT).to(DEVICE)


@check
def collectives():
    mine, everyone = td_for(RANK), [td_for(r) for r in range(WORLD)]
    before = mine.clone()
    stacked = fd.stack(everyone)
    want = {
        "sum": fd.tree.map(lambda x: x.sum(0), stacked),
        "mean": fd.tree.map(lambda x: x.sum(0) / WORLD, stacked),
        "max": fd.tree.map(lambda x: x.amax(0), stacked),
        "min": fd.tree.map(lambda x: x.amin(0), stacked),
    }
    for op, ref in want.items():
        got = fd.distributed.all_reduce(mine, op=op)
        on_device(got)
        fd.testing.assert_close(got, ref, **TOL)
    got = fd.distributed.broadcast(mine, src=0)
    fd.testing.assert_close(got, everyone[0], rtol=0, atol=0)
    got = fd.distributed.all_gather(mine)
    assert got.batch_size == torch.Size([WORLD, 4])
    fd.testing.assert_close(got, stacked, rtol=0, atol=0)
    got = fd.distributed.reduce_scatter(mine, op="sum")
    n = 4 // WORLD
    fd.testing.assert_close(got, want["sum"][RANK * n : (RANK + 1) * n], **TOL)
    on_device(got)
    fd.testing.assert_close(mine, before, rtol=0, atol=0)  # nothing given is written


def make_net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    return net.to(DT).to(DEVICE)


def batches(steps: int, n: int = 8) -> list[fd.TensorDict]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        x, y = torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)
        out.append(fd.TensorDict({"x": x, "y": y}, [n]).to(DT).to(DEVICE))
    return out


def loss_of(model):
    def loss_fn(params, batch, key):
        return ((model(params, x=batch["x"]) - batch["y"]) ** 2).mean()

    return loss_fn


@check
def pmean_adam_equals_one_process():
    net = make_net()
    model = fd.Module(net, in_keys=["x"], out_keys=["y"])
    params = fd.from_module(net)
    dp = fd.train_step(
        loss_of(model), fd.optim.chain(fd.distributed.mean_updates(), fd.optim.adam(1e-2))
    )
    one = fd.train_step(loss_of(model), fd.optim.adam(1e-2))
    p, s = params, dp.optimizer.init(params)
    q, t = params, fd.optim.adam(1e-2).init(params)
    for batch in batches(5):
        p, s, _ = dp(p, s, fd.distributed.shard_batch(batch), None)
        q, t, _ = one(q, t, batch, None)
    on_device(p)
    fd.testing.assert_close(p, q, **TOL)


@check
def fit_data_parallel_equals_fit():
    net = make_net()
    model = fd.Module(net, in_keys=["x"], out_keys=["y"])
    params = fd.from_module(net)
    opt = fd.optim.chain(fd.distributed.mean_updates(), fd.optim.adam(1e-2))
    step = fd.train_step(loss_of(model), opt)
    data = batches(4)
    p, _, hist = fd.fit(
        step, params, opt.init(params), data, epochs=2, progress=False, data_parallel=True
    )
    single = fd.train_step(loss_of(model), fd.optim.adam(1e-2))
    q, _, ref = fd.fit(
        single, params, fd.optim.adam(1e-2).init(params), data, epochs=2, progress=False
    )
    fd.testing.assert_close(p, q, **TOL)
    torch.testing.assert_close(hist["loss"], ref["loss"], **TOL)


@check
def ranks_with_different_shapes_are_named():
    if WORLD < 2:
        return "skipped: one rank"
    td = fd.TensorDict({"w": torch.zeros(2, 3 + RANK, dtype=DT, device=DEVICE)}, [2])
    try:
        fd.distributed.all_reduce(td, op="sum")
    except ValueError as e:
        assert "at the key 'w'" in str(e), str(e)
        return str(e)
    raise AssertionError("no error for ranks with different shapes")


def main() -> None:
    if CUDA:
        torch.cuda.set_device(DEVICE)
    dist.init_process_group(
        BACKEND,
        init_method=f"tcp://127.0.0.1:{PORT}",
        rank=RANK,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    run_checks(CHECKS, RANK, OUT)


if __name__ == "__main__":
    main()
