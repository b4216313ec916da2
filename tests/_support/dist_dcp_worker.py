"""One rank of the 2-process gloo job of tests/test_distributed_checkpoint.py: DTensor
params and optimizer state through torch.distributed.checkpoint.

Run as ``python tests/_support/dist_dcp_worker.py RANK WORLD PORT OUT_DIR``. The checks save
sharded params (weights ``Shard(0)``) and Adam's state after a step to
``OUT/ckpt``, with the full values beside it (``OUT/full.pt``, plain, by rank 0);
they load them back on the 2 ranks with another sharding; ``fd.fit(data_parallel=True,
checkpoint=...)`` of DTensor params crashes at epoch 2, resumes from its DCP folder
with another sharding, and ends bitwise where the uninterrupted run ends. The test
then loads ``OUT/ckpt`` in one process without a process group.
"""

from __future__ import annotations

import datetime
import os
import shutil
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

import functd as fd
from tests._support.dist_job import run_checks

torch.set_default_dtype(torch.float64)
RANK, WORLD, PORT, OUT = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ROWS = {"*.weight": [Shard(0)], "*": [Replicate()]}
COLS = {"*.weight": [Shard(1)], "*": [Replicate()]}
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def model():
    return fd.Module(fd.nn.MLP(4, 2, num_cells=(8,)), in_keys=["x"], out_keys=["pred"])


def mesh():
    return init_device_mesh("cpu", (WORLD,))


def batch(i, epoch=0):
    """A batch of 8 rows as DTensors sharded by rows (each rank holds 4): the global
    batch DTensor ops compute with (shard_batch passes DTensor leaves whole)."""
    x = fd.random.normal(fd.random.fold_in(fd.random.key(50 + epoch), i), (8, 4), torch.float64)
    rows = slice(RANK * 8 // WORLD, (RANK + 1) * 8 // WORLD)
    local = {"x": x[rows], "y": torch.sin(x[rows, :2])}
    place = {k: DTensor.from_local(v, mesh(), [Shard(0)]) for k, v in local.items()}
    return fd.TensorDict(place, [8])


def setup(rules):
    """(step, sharded params, their Adam state) on this job's mesh."""
    m = model()
    params = fd.distributed.shard(m.init(fd.random.key(0)).double(), mesh(), rules)

    def loss_fn(params, batch, key):
        return ((m(params, x=batch["x"]) - batch["y"]) ** 2).mean().full_tensor()

    opt = fd.optim.chain(fd.distributed.mean_updates(), fd.optim.adam(1e-2))
    return fd.train_step(loss_fn, opt), params, opt.init(params)


def full(tree):
    """Every DTensor leaf as its full plain value (gather), other leaves as they are."""
    return fd.tree.map(lambda x: x.full_tensor() if fd.distributed.is_dtensor(x) else x, tree)


def bitwise(a, b) -> int:
    la, lb = fd.tree.leaves(full(a)), fd.tree.leaves(full(b))
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype and torch.equal(x, y), (x, y)
    return len(la)


@check
def save_sharded():
    step, params, state = setup(ROWS)
    params, state, _ = step(params, state, batch(0), None)
    tree = {"params": params, "opt_state": state}
    fd.distributed.save(tree, os.path.join(OUT, "ckpt"))
    whole = full(tree)  # a collective: on every rank
    if RANK == 0:
        fd.save(whole, os.path.join(OUT, "full.pt"))
    local = params["0", "weight"].to_local().shape
    return {"local_weight_shape": list(local), "files": sorted(os.listdir(OUT))}


@check
def load_resharded_on_two_ranks():
    """Weights Shard(1) now: each rank reads its columns; values equal bitwise."""
    _, like_params, like_state = setup(COLS)
    like = {"params": like_params, "opt_state": like_state}
    back = fd.distributed.load(os.path.join(OUT, "ckpt"), like=like)
    w = back["params"]["0", "weight"]
    assert fd.distributed.is_dtensor(w) and w.placements == (Shard(1),)
    n = bitwise(back, fd.load(os.path.join(OUT, "full.pt")))
    return {"leaves": n, "local_weight_shape": list(w.to_local().shape)}


@check
def load_whole_on_every_rank():
    back = fd.distributed.load(os.path.join(OUT, "ckpt"))  # no like: plain, whole
    assert not any(fd.distributed.is_dtensor(x) for x in fd.tree.leaves(back))
    return bitwise(back, fd.load(os.path.join(OUT, "full.pt")))


class Crash(Exception):
    pass


def batches(crash):
    def of(epoch):
        if crash and epoch == 2:
            raise Crash("stop")
        return [batch(i, epoch=epoch) for i in range(3)]

    return of


def fit(step, params, state, source, **kw):
    kw = {"progress": False, "data_parallel": True, "timeout": 60.0, "epochs": 4, **kw}
    return fd.fit(step, params, state, source, fd.random.key(1), **kw)


@check
def fit_resumes_from_dcp():
    """A data-parallel fit of DTensor params crashes at epoch 2 and resumes from its DCP
    folders: bitwise the run that never stopped, with the same sharding and with the
    weights sharded by columns instead of rows (a copy of the folders)."""
    step, params, state = setup(ROWS)
    folder = os.path.join(OUT, "fit")
    path = os.path.join(folder, "ckpt")
    if RANK == 0:
        os.makedirs(folder, exist_ok=True)
    dist.barrier()
    whole = fit(step, params, state, batches(False))
    try:
        fit(step, params, state, batches(True), checkpoint=path)
    except Crash:
        pass
    else:
        raise AssertionError("no crash")
    saved = fd.distributed.load(path)  # plain, whole: the checkpoint dict
    assert int(saved["epoch"]) == 2 and saved["history"].batch_size == torch.Size([6])
    files = sorted(os.listdir(folder))
    if RANK == 0:
        shutil.copytree(folder, folder + "2")
    dist.barrier()
    resumed = fit(step, params, state, batches(False), checkpoint=path, resume=True)
    same = bitwise(resumed, whole)
    step2, params2, state2 = setup(COLS)  # resume on another sharding
    path2 = os.path.join(folder + "2", "ckpt")
    other = fit(step2, params2, state2, batches(False), checkpoint=path2, resume=True)
    assert other[0]["0", "weight"].placements == (Shard(1),)
    return {"leaves": same, "files": files, "resharded_leaves": bitwise(other, whole)}


def main() -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{PORT}",
        rank=RANK,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    run_checks(CHECKS, RANK, OUT)


if __name__ == "__main__":
    main()
