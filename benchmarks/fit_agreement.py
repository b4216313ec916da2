"""What ``fd.fit(data_parallel=True)``'s agreement on the batches costs, 2 gloo ranks.

Before each epoch the ranks agree on their number of batches and the layout of
the first one (one ``all_gather`` of 2 int64); when a rank's batches have no
``len()``, each step also asks the store whether a rank has run out (one TCP
round trip to the store) and the epoch ends with a second ``all_gather``. The
rows: ``fit`` over ``EPOCHS`` epochs of ``EPOCH_STEPS`` steps (the small MLP
of benchmarks/data_parallel.py, batch 64, ``mean_updates`` + Adam, float32) with a
list of batches and with a generator, each against a hand-written loop doing
the same (the broadcast of the params at the start, the same steps, keys,
sharding and end-of-epoch metrics all-reduce, without the agreements), in
interleaved rounds; a round's time is the slower rank's; "ms" is per epoch;
the ratio is the median of the rounds' paired ratios. Then the pieces
alone: the agreement's ``all_gather`` and the store's ``add``, per call, and
an epoch of steps with a store ``add`` before each against the steps alone
(what a no-len epoch would pay without the flag riding in ``mean_updates``'s buffer).

Run: ``python benchmarks/fit_agreement.py`` (starts its 2 processes itself, on
127.0.0.1). ``BENCH_ROUNDS`` changes the rounds.
"""

from __future__ import annotations

import datetime
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import functd as fd

sys.path.insert(0, os.path.dirname(__file__))
from _common import machine, table

WORLD = 2
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "15"))
EPOCH_STEPS = 20
EPOCHS = 5


def slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def compare(ours, theirs, rounds=ROUNDS):
    a, b = [], []
    for r in range(rounds):
        for who in ("a", "b") if r % 2 == 0 else ("b", "a"):
            dist.barrier()
            t0 = time.perf_counter()
            ours() if who == "a" else theirs()
            (a if who == "a" else b).append(slowest(time.perf_counter() - t0) / EPOCHS)
    ratio = statistics.median(x / y for x, y in zip(a, b))
    return round(statistics.median(a) * 1e3, 2), round(statistics.median(b) * 1e3, 2), ratio


def setup():
    model = fd.Module(fd.nn.MLP(8, 1, num_cells=(32, 32)), in_keys=["x"], out_keys=["y"])

    def loss_fn(params, batch, key):
        return ((model(params, x=batch["x"]) - batch["y"]) ** 2).mean()

    opt = fd.optim.chain(fd.distributed.mean_updates(), fd.optim.adam(1e-3))
    params = model.init(fd.random.key(0))
    g = torch.Generator().manual_seed(1)
    batches = [
        fd.TensorDict(
            {"x": torch.randn(64, 8, generator=g), "y": torch.randn(64, 1, generator=g)}, [64]
        )
        for _ in range(EPOCH_STEPS)
    ]
    return fd.train_step(loss_fn, opt), params, opt.init(params), batches


def hand_loop(step, params, state, batches, key, rank):
    params, state = fd.distributed.broadcast((params, state), 0)
    i = 0
    for _ in range(EPOCHS):
        metrics = []
        for b in batches:
            k = fd.random.fold_in(fd.random.fold_in(key, i), rank)
            params, state, m = step(params, state, fd.distributed.shard_batch(b), k)
            metrics.append(m)
            i += 1
        fd.distributed.all_reduce(fd.stack(metrics), "mean")
    return params, state


def worker(rank: int, port: int, queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=120),
    )
    step, params, state, batches = setup()
    key = fd.random.key(2)

    def fit(source):
        return lambda: fd.fit(
            step, params, state, source, key, epochs=EPOCHS, progress=False, data_parallel=True
        )

    def hand():
        hand_loop(step, params, state, batches, key, rank)

    rows = []
    for name, source in (
        ("list (len known)", batches),
        ("generator (no len)", lambda e: iter(batches)),
    ):
        ours, theirs, ratio = compare(fit(source), hand)
        rows.append([f"fit epoch, {name}", "hand loop", ours, theirs, ratio])
    from functd.distributed._faults import Board
    from functd.distributed._group import gather_ints

    group = dist.group.WORLD
    board = Board("functd/bench", WORLD, rank)
    n = 200

    def gathers():
        for _ in range(n):
            gather_ints("bench", group, WORLD, [1, 2])

    def adds():
        for _ in range(n):
            board.add("x", 0)

    def one_step():
        for _ in range(n // 10):
            step(params, state, fd.distributed.shard_batch(batches[0]), key)

    for name, fn, per in (
        ("agreement all_gather", gathers, n),
        ("store add", adds, n),
        ("one train step", one_step, n // 10),
    ):
        times = []
        for _ in range(5):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            times.append(slowest(time.perf_counter() - t0) / per)
        rows.append([name, "", round(statistics.median(times) * 1e3, 3), "", ""])
    # a store round trip between steps (what a step of a no-len epoch pays when its
    # flag cannot ride in mean_updates' buffer) against the steps alone
    b0 = fd.distributed.shard_batch(batches[0])

    def steps():
        for _ in range(EPOCH_STEPS):
            step(params, state, b0, key)

    def steps_and_adds():
        for _ in range(EPOCH_STEPS):
            board.add("y", 0)
            step(params, state, b0, key)

    ours, theirs, ratio = compare(steps_and_adds, steps)
    rows.append(["epoch with a store add a step", "epoch", ours * EPOCHS, theirs * EPOCHS, ratio])
    if rank == 0:
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # no interpreter teardown (see benchmarks/data_parallel.py)


def main() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(worker, args=(port, queue), nprocs=WORLD, start_method="spawn")
    rows = queue.get()
    load = os.getloadavg()[0]
    print(
        f"# fit's batch agreement, {WORLD} gloo ranks, {EPOCH_STEPS} steps an epoch ({machine()}, load {load:.1f})"
    )
    print(table(["row", "peer", "ms", "peer ms", "ratio"], rows))


if __name__ == "__main__":
    main()
