"""Data-parallel training with functd: each rank its shard, the grads averaged.

Run on 2 processes (gloo on CPU, NCCL when CUDA is there):

    torchrun --nproc-per-node 2 examples/train_data_parallel.py

(``python examples/train_data_parallel.py`` runs it on one process.) The
training step is the single-process one; the only change is
``fd.distributed.mean_updates()`` first in the optimizer chain. Rank 0 prints the loss
of every step (averaged over the ranks), then compares the params with one
process trained on the full batches, and then does the same with
``fd.fit(..., data_parallel=True)``.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.nn as nn

import functd as fd

STEPS = int(os.environ.get("STEPS", "20"))
BATCH = 32  # the global batch; each of the W ranks steps on BATCH / W rows


def init_process_group() -> torch.device:
    cuda = torch.cuda.is_available()
    if "RANK" not in os.environ:  # plain `python`: a group of one process
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ.update(MASTER_PORT=str(port), LOCAL_RANK="0")
    dist.init_process_group("nccl" if cuda else "gloo")
    if cuda:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def main() -> None:
    device = init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_default_dtype(torch.float64)  # so the comparison below is exact to 1e-12

    model = fd.Sequential(
        fd.Module(nn.Linear(8, 64), in_keys=["x"], out_keys=["h"]),
        fd.Module(torch.tanh, in_keys=["h"], out_keys=["h"]),
        fd.Module(nn.Linear(64, 1), in_keys=["h"], out_keys=["y_hat"]),
    )
    params = model.init(fd.random.key(0))  # the same key: the same params on every rank
    params = params.apply(lambda x: x.to(device, torch.float64))

    def loss_fn(
        params: fd.TensorDict, batch: fd.TensorDict, key: torch.Tensor | None
    ) -> torch.Tensor:
        return ((model(params, batch).get_tensor("y_hat") - batch.get_tensor("y")) ** 2).mean()

    # every rank generates the same global batches; each steps on its rows
    g = torch.Generator().manual_seed(1)
    w_true = torch.randn(8, 1, generator=g)
    batches = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, 8, generator=g)
        y = torch.sin(x @ w_true / 3) + 0.1 * torch.randn(BATCH, 1, generator=g)
        batches.append(fd.TensorDict({"x": x, "y": y}, [BATCH]).to(device))

    opt = fd.optim.chain(fd.distributed.mean_updates(), fd.optim.adam(1e-2))
    step = fd.train_step(loss_fn, opt)

    # 1. the loop by hand: shard, step, average the metrics for printing
    p, s = params, opt.init(params)
    for i, batch in enumerate(batches):
        p, s, metrics = step(p, s, fd.distributed.shard_batch(batch), None)
        loss = fd.distributed.all_reduce(metrics)["loss"]  # the full-batch loss
        if rank == 0:
            print(f"step {i:2d}: loss {float(loss):.6f}")

    # the same steps in this process alone, on the full batches
    single = fd.train_step(loss_fn, fd.optim.adam(1e-2))
    q, t = params, fd.optim.adam(1e-2).init(params)
    for batch in batches:
        q, t, _ = single(q, t, batch, None)
    diff = max(
        float((a - b).abs().max()) for a, b in zip(p.values(True, True), q.values(True, True))
    )
    if rank == 0:
        print(f"{world} ranks vs one process on the full batch: max |params diff| = {diff:.1e}")
    assert diff <= 1e-12, diff

    # 2. the same with fit: it shards the batches and prints on rank 0 only
    p2, _, hist = fd.fit(
        step, params, opt.init(params), batches, progress=False, data_parallel=True
    )
    diff2 = max(
        float((a - b).abs().max()) for a, b in zip(p2.values(True, True), q.values(True, True))
    )
    if rank == 0:
        print(
            f"fd.fit(data_parallel=True): final loss {float(hist['loss'][-1]):.6f}, "
            f"max |params diff| vs one process = {diff2:.1e}"
        )
    assert diff2 <= 1e-12, diff2
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
