"""Data-parallel training step on 2 gloo processes: functd against DDP + torch.optim.

Each rank steps on its half of a batch of 64 rows. functd's step is
``fd.train_step(loss_fn, fd.optim.chain(fd.distributed.mean_updates(), fd.optim.adam(1e-3)))``
with the batch TensorDict built inside the timed call; the peer is
``torch.nn.parallel.DistributedDataParallel`` + ``torch.optim.Adam`` (zero_grad,
forward, backward, step). Both run in the same processes, in interleaved rounds
of fixed length (the ranks must issue the same collectives in the same order,
so no autorange); the time of a round is the slower rank's; the ratio is the
median over rounds of the ratio of a round's two adjacent measurements (which
cancels most of the drift of a shared machine's load), and "rounds' IQR" the
quartiles of those per-round ratios (their spread: one round's ratio swings by
+-20% on 2 shared cores, so the target rows run 3x the rounds); "CPU ratio" is the same
with the processes' CPU time (gloo's threads included), steadier under load. The last column
checks the result: params after 10 float64 Adam steps against DDP's; "target"
is the goal for the step rows (functd within 1.1x of DDP). Two indented rows
break the step down: the local step without any collective (functd's step with
plain ``adam`` against ``nn`` + ``torch.optim.Adam`` without DDP) and
``mean_updates().update`` alone against one bare ``dist.all_reduce`` of a flat buffer
divided in place (the floor every data-parallel step pays). The last
row is the cost of the cross-rank structure check if it ran on every call
(``all_reduce(grads, check=True)`` against the default ``check="first"``).

Run: ``python benchmarks/data_parallel.py`` (starts its 2 processes itself, on
127.0.0.1). ``BENCH_ROUNDS`` and ``BENCH_STEPS`` change the rounds and steps
per round.
"""

from __future__ import annotations

import datetime
import itertools
import os
import socket
import statistics
import sys
import time
from functools import partial

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

import functd as fd

sys.path.insert(0, os.path.dirname(__file__))
from _common import machine, table

WORLD = 2
BATCH = 64
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "30"))
STEPS = int(os.environ.get("BENCH_STEPS", "20"))
MODELS = {"small MLP 8-32-32-1": (8, 32, 32, 1), "large MLP 64-256-256-8": (64, 256, 256, 8)}


def make_net(sizes, dtype=torch.float32):
    torch.manual_seed(0)
    layers = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1]).to(dtype)


def setup(sizes, rank, dtype):
    net = make_net(sizes, dtype)
    model = fd.Module(net, in_keys=["x"], out_keys=["y"])

    def loss_fn(params, batch, key):
        return ((model(params, x=batch["x"]) - batch["y"]) ** 2).mean()

    opt = fd.optim.chain(fd.distributed.mean_updates(), fd.optim.adam(1e-3))
    step = fd.train_step(loss_fn, opt)
    params = fd.from_module(net)
    ddp = nn.parallel.DistributedDataParallel(make_net(sizes, dtype))
    topt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, sizes[0], generator=g, dtype=dtype)
    y = torch.randn(BATCH, sizes[-1], generator=g, dtype=dtype)
    n = BATCH // WORLD
    x, y = x[rank * n : (rank + 1) * n], y[rank * n : (rank + 1) * n]
    return step, params, opt.init(params), ddp, topt, x, y


def run_functd(state, step, x, y, steps):
    params, opt_state = state
    for _ in range(steps):
        batch = fd.TensorDict({"x": x, "y": y}, [x.shape[0]])
        params, opt_state, _ = step(params, opt_state, batch, None)
    return params, opt_state


def run_ddp(ddp, topt, x, y, steps):
    for _ in range(steps):
        topt.zero_grad()
        ((ddp(x) - y) ** 2).mean().backward()
        topt.step()


def slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def local_pair(sizes, x, y):
    """functd's step without mean_updates and nn + Adam without DDP (no collective)."""
    net = make_net(sizes)
    model = fd.Module(net, in_keys=["x"], out_keys=["y"])

    def loss_fn(params, batch, key):
        return ((model(params, x=batch["x"]) - batch["y"]) ** 2).mean()

    opt = fd.optim.adam(1e-3)
    step = fd.train_step(loss_fn, opt)
    params = fd.from_module(net)
    box = [run_functd((params, opt.init(params)), step, x, y, 5)]

    def local(box=box):
        box[0] = run_functd(box[0], step, x, y, STEPS)

    torch_net = make_net(sizes)
    return local, torch_net, torch.optim.Adam(torch_net.parameters(), lr=1e-3)


def compare(ours, theirs, rounds: int = ROUNDS) -> tuple[int, int, float, float, str]:
    """Interleaved rounds of ``STEPS`` calls of each (order alternating), both ranks
    starting every measurement together (a barrier); a round's time is the slower
    rank's. Returns the median us per call of each, the medians of the rounds'
    paired wall and CPU ratios, and the quartiles of the paired wall ratios."""
    a, b, ca, cb = [], [], [], []
    for r in range(rounds):
        for who in ("a", "b") if r % 2 == 0 else ("b", "a"):
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            ours() if who == "a" else theirs()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            (a if who == "a" else b).append(slowest(wall) / STEPS)
            (ca if who == "a" else cb).append(slowest(cpu) / STEPS)
    ratios = [x / y for x, y in zip(a, b)]
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    cpu = statistics.median(x / y for x, y in zip(ca, cb))
    us = round(statistics.median(a) * 1e6), round(statistics.median(b) * 1e6)
    return *us, statistics.median(ratios), cpu, f"{q1:.2f}-{q3:.2f}"


def worker(rank: int, port: int, queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=120),
    )
    rows = []
    for name, sizes in MODELS.items():
        # correctness: 10 float64 Adam steps against DDP
        step, params, opt_state, ddp, topt, x, y = setup(sizes, rank, torch.float64)
        params, _ = run_functd((params, opt_state), step, x, y, 10)
        run_ddp(ddp, topt, x, y, 10)
        ref = fd.tree.leaves(fd.from_module(ddp.module))
        err = max(float((a - b).abs().max()) for a, b in zip(fd.tree.leaves(params), ref))
        # speed, float32
        step, params, opt_state, ddp, topt, x, y = setup(sizes, rank, torch.float32)
        box = [run_functd((params, opt_state), step, x, y, 5)]
        run_ddp(ddp, topt, x, y, 5)

        def functd_steps(box=box, step=step, x=x, y=y):
            box[0] = run_functd(box[0], step, x, y, STEPS)

        # the target row: 3x the rounds (one round's ratio spreads by +-20% on 2 shared cores)
        f, d, ratio, cpu, iqr = compare(
            functd_steps, partial(run_ddp, ddp, topt, x, y, STEPS), rounds=3 * ROUNDS
        )
        rows.append(
            [name, "functd step", "DDP + Adam", f, d, ratio, iqr, cpu, "<= 1.10", f"{err:.1e}"]
        )
        # the break-down: the local step (no collective) and the all-reduce alone
        local, net, lopt = local_pair(sizes, x, y)
        f, d, ratio, cpu, iqr = compare(local, partial(run_ddp, net, lopt, x, y, STEPS))
        rows.append(
            [name, "  local step (no mean_updates)", "nn + Adam (no DDP)", f, d, ratio, iqr, cpu]
        )
        grads, pm = box[0][0], fd.distributed.mean_updates()
        pstate = pm.init(grads)
        flat = torch._utils._flatten_dense_tensors(fd.tree.leaves(grads))

        def pmean_only(grads=grads, pm=pm, pstate=pstate):
            for _ in range(STEPS):
                pm.update(grads, pstate, grads)

        def bare(flat=flat):
            for _ in range(STEPS):
                dist.all_reduce(flat.div_(WORLD))

        f, d, ratio, cpu, iqr = compare(pmean_only, bare)
        rows.append(
            [name, "  mean_updates().update", "all_reduce(one buffer)", f, d, ratio, iqr, cpu]
        )
        state = box[0]

    # the cost of the cross-rank structure check when it runs on every call
    def check_every(grads=state[0]):
        for _ in range(STEPS):
            fd.distributed.all_reduce(grads, check=True)

    def check_first(grads=state[0]):
        for _ in range(STEPS):
            fd.distributed.all_reduce(grads)

    e, f, ratio, cpu, iqr = compare(check_every, check_first)
    rows.append([name, "all_reduce check=True", "check='first'", e, f, ratio, iqr, cpu])
    if rank == 0:
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()
    # Leave without the interpreter's teardown: freeing the DDP and gloo objects after
    # the group is destroyed hung the worker now and then (faulthandler: after worker()
    # returned, inside the wrapper), which left `make bench` waiting forever.
    os._exit(0)


def main() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(worker, args=(port, queue), nprocs=WORLD, start_method="spawn")
    rows = [r + [""] * (10 - len(r)) for r in queue.get()]
    load = os.getloadavg()[0]
    print(f"# data-parallel step, {WORLD} gloo ranks, batch {BATCH} ({machine()}, load {load:.1f})")
    print(
        table(
            [
                "model",
                "row",
                "peer",
                "us",
                "peer us",
                "ratio",
                "rounds' IQR",
                "CPU ratio",
                "target",
                "max |params - DDP| f64",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
