"""One rank of the 2-process gloo job of tests/test_distributed_fit.py: faults of
``fd.fit(data_parallel=True)`` and its exact resume.

Run as ``python tests/_support/dist_fit_worker.py RANK WORLD PORT OUT_DIR TIMEOUT``. Each
check returns what the test asserts on (the error message on every rank,
timings); the last one stalls rank 1 past the timeout, which leaves the group
broken, so it runs last, without a barrier after it.
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import functd as fd
from tests._support.dist_job import run_checks

torch.set_default_dtype(torch.float64)
RANK, WORLD, PORT, OUT = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
TIMEOUT = float(sys.argv[5])
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def expect(exc, fn):
    try:
        fn()
    except exc as e:
        return str(e)
    raise AssertionError(f"no {exc.__name__} raised")


def model(width=16):
    return fd.Module(fd.nn.MLP(4, 1, num_cells=(width,)), in_keys=["x"], out_keys=["pred"])


def setup(width=16, seed=0, stall=None):
    """(step, params, opt_state); the loss draws noise from its key. ``stall=(step,
    seconds)`` makes this rank sleep in the loss of that step."""
    m = model(width)
    calls = []

    def loss_fn(params, batch, key):
        if stall is not None and len(calls) == stall[0]:
            calls.append(time.monotonic())
            time.sleep(stall[1])
        calls.append(time.monotonic())
        noisy = batch["x"] + 0.1 * fd.random.normal(key, batch["x"].shape, dtype=torch.float64)
        return ((m(params, x=noisy) - batch["y"]) ** 2).mean()

    opt = fd.optim.chain(fd.distributed.mean_updates(), fd.optim.adam(1e-2))
    params = m.init(fd.random.key(seed)).double()
    step = fd.train_step(loss_fn, opt)
    loss_fn.calls = calls  # type: ignore[attr-defined]
    return step, params, opt.init(params)


def batch(i, rows=8, epoch=0):
    x = fd.random.normal(fd.random.fold_in(fd.random.key(50 + epoch), i), (rows, 4), torch.float64)
    return fd.TensorDict({"x": x, "y": torch.sin(x.sum(-1, keepdim=True))}, [rows])


def fit(step, params, state, batches, **kw):
    kw = {"progress": False, "data_parallel": True, "timeout": 30.0, **kw}
    return fd.fit(step, params, state, batches, fd.random.key(1), **kw)


def bitwise(a, b) -> None:
    for x, y in zip(fd.tree.leaves(a), fd.tree.leaves(b), strict=True):
        assert torch.equal(x, y)


# ------------------------------------------------------------------ uneven batches
@check
def uneven_counts_with_len():
    step, params, state = setup()
    batches = [batch(i) for i in range(7 + RANK)]  # rank 0: 7, rank 1: 8
    return expect(ValueError, lambda: fit(step, params, state, batches))


@check
def uneven_counts_without_len():
    step, params, state = setup()

    def batches(epoch):  # a generator: no len()
        return (batch(i) for i in range(7 + RANK))

    msg = expect(ValueError, lambda: fit(step, params, state, batches))
    return msg, len(step.loss_fn.calls)


@check
def uneven_counts_one_rank_with_len():
    step, params, state = setup()
    mine = [batch(i) for i in range(7 + RANK)]
    batches = mine if RANK == 0 else (lambda epoch: iter(mine))
    return expect(ValueError, lambda: fit(step, params, state, batches, epochs=2))


@check
def uneven_counts_in_the_second_epoch():
    step, params, state = setup()

    def batches(epoch):
        return [batch(i) for i in range(3 + RANK * epoch)]

    return expect(ValueError, lambda: fit(step, params, state, batches, epochs=2))


@check
def even_generators_equal_lists():
    step, params, state = setup()
    from functd.distributed._faults import Board

    lists = fit(step, params, state, lambda e: [batch(i, epoch=e) for i in range(4)], epochs=2)
    adds, real_add = [], Board.add
    Board.add = lambda self, name, n: adds.append(name) or real_add(self, name, n)
    try:
        gens = fit(step, params, state, lambda e: (batch(i, epoch=e) for i in range(4)), epochs=2)
    finally:
        Board.add = real_add
    bitwise(gens, lists)  # the flag riding in pmean's buffer changes no gradient
    # the flag rode: besides one post of each epoch's total, the store was asked at
    # most after the run's first step (whose pmean may take the general path);
    # asking before every step would be 6 calls more
    assert adds in (["total/0", "total/1"], ["total/0", "total/0", "total/1"]), adds
    assert lists[2].batch_size == torch.Size([8])
    # fit set timeout=30 s on the group for its run and put the group's own back
    from functd.distributed._group import get_timeout

    assert get_timeout(dist.group.WORLD) == datetime.timedelta(seconds=60)


@check
def fit_keeps_the_groups_timeout():
    """Without timeout=, fit's collectives wait as long as the group was told (60 s at
    init_process_group), not a timeout of fit's own."""
    from functd.distributed._group import get_timeout

    step, params, state = setup()
    seen = []

    def batches(epoch):
        seen.append(get_timeout(dist.group.WORLD).total_seconds())  # during the run
        return [batch(i) for i in range(2)]

    fd.fit(step, params, state, batches, fd.random.key(1), progress=False, data_parallel=True)
    return seen


# ------------------------------------------------------------------ layouts
@check
def different_batch_sizes():
    step, params, state = setup()
    batches = [batch(i, rows=8 * (RANK + 1)) for i in range(3)]  # 8 rows, 16 rows
    msg = expect(ValueError, lambda: fit(step, params, state, batches))
    return msg, len(step.loss_fn.calls)


@check
def mismatched_params():
    step, params, state = setup(width=16 + 4 * RANK)  # '0.weight' is [16, 4] / [20, 4]
    return expect(ValueError, lambda: fit(step, params, state, [batch(0)]))


@check
def mismatched_param_dtypes():
    step, params, state = setup()
    if RANK == 1:
        params = params.float()
    return expect(ValueError, lambda: fit(step, params, state, [batch(0)]))


@check
def missing_checkpoint_folder_on_one_rank():
    step, params, state = setup()
    folder = os.path.join(OUT, f"ckpt_rank{RANK}")
    if RANK == 0:
        os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "ckpt.pt")
    return expect(ValueError, lambda: fit(step, params, state, [batch(0)], checkpoint=path))


# ------------------------------------------------------------------ resume
class Crash(Exception):
    pass


@check
def resume_equals_uninterrupted():
    """Both ranks crash at the start of epoch 2, then resume: bitwise the run that
    never stopped (keyed loss, epoch-dependent batches, the ranks' own keys)."""
    step, params, state = setup()
    path = os.path.join(OUT, "resume", "ckpt.pt")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    dist.barrier()

    def batches(crash):
        def of(epoch):
            if crash and epoch == 2:
                raise Crash("stop")
            return [batch(i, epoch=epoch) for i in range(3)]

        return of

    whole = fit(step, params, state, batches(False), epochs=4)
    expect(Crash, lambda: fit(step, params, state, batches(True), epochs=4, checkpoint=path))
    assert int(fd.load(path)["epoch"]) == 2
    dist.barrier()
    resumed = fit(step, params, state, batches(False), epochs=4, checkpoint=path, resume=True)
    bitwise(resumed, whole)
    return sorted(os.listdir(os.path.dirname(path)))


# ------------------------------------------------------------------ a stalled rank
def stalled_rank():
    """Rank 1 sleeps TIMEOUT + 3 s in the loss of step 2 (past rank 0's timeout and
    its 2 s wait for the others' notes); rank 0 waits in pmean."""
    step, params, state = setup(stall=(2, TIMEOUT + 3) if RANK == 1 else None)
    batches = [batch(i) for i in range(5)]
    start = time.monotonic()
    try:
        fit(step, params, state, batches, timeout=TIMEOUT)
        raise AssertionError("no error")
    except fd.distributed.CollectiveError as e:
        end = time.monotonic()
        out = {
            "message": str(e),
            "cause": f"{type(e.__cause__).__name__}: {e.__cause__}",
            "missing": e.missing,
            "step": e.step,
            "collective": e.collective,
            # from the end of this rank's last loss (it then enters pmean) to the error
            "waited": end - step.loss_fn.calls[-1],
            "total": end - start,
        }
    # rank 0's process serves the store: it stays until rank 1 is done with it
    store = dist.distributed_c10d._get_default_store()
    if RANK == 1:
        store.set("stall_done", "1")
    else:
        store.wait(["stall_done"], datetime.timedelta(seconds=60))
    return out


def main() -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{PORT}",
        rank=RANK,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    run_checks(CHECKS, RANK, OUT, final=stalled_rank)


if __name__ == "__main__":
    main()
