"""One rank of a gloo job where one rank stalls inside ``fd.fit(data_parallel=True)``
(tests/test_distributed_fit.py, the 4-rank check; the larger runs of notes/reliability.md).

Run as ``python -m tests._support.dist_stall_worker WORLD PORT OUT_DIR TIMEOUT STALLED [MODE]``
(MODE: ``stall``, the default, ``raise`` or ``kill``):
one process imports torch and functd, then forks the ranks (one import instead of
``WORLD``: a 4-rank job costs about what a 2-rank one does).
The process group is created with ``timeout=TIMEOUT`` and ``fit`` is given none, so the
group's timeout is the one in force; rank ``STALLED`` sleeps ``TIMEOUT + 3`` s in the loss
of step 2 (or raises a ValueError, or SIGKILLs itself). Each rank writes ``OUT_DIR/rank{r}.json``: its error's message, ``missing``
and how long it waited from entering the collective to the error.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import functd as fd

WORLD, PORT, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
TIMEOUT, STALLED = float(sys.argv[4]), int(sys.argv[5])
MODE = (sys.argv[6:] or ["stall"])[0]  # "raise" or "kill" (SIGKILL) instead of sleeping
RANK = -1  # set in each forked rank


def run() -> dict:
    torch.set_default_dtype(torch.float64)
    m = fd.Module(fd.nn.MLP(4, 1, num_cells=(16,)), in_keys=["x"], out_keys=["pred"])
    calls: list[float] = []

    def loss_fn(params, batch, key):
        if RANK == STALLED and len(calls) == 2:
            if MODE == "raise":
                raise ValueError("a bad batch")
            if MODE == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(TIMEOUT + 3)
        calls.append(time.monotonic())
        return ((m(params, x=batch["x"]) - batch["y"]) ** 2).mean()

    opt = fd.optim.chain(fd.distributed.mean_updates(), fd.optim.adam(1e-2))
    params = m.init(fd.random.key(0)).double()
    x = fd.random.normal(fd.random.key(5), (4 * WORLD, 4), torch.float64)
    batches = [fd.TensorDict({"x": x, "y": x.sum(-1, keepdim=True)}, [4 * WORLD])] * 5
    step = fd.train_step(loss_fn, opt)
    try:
        fd.fit(step, params, opt.init(params), batches, fd.random.key(1), progress=False,
               data_parallel=True)  # fmt: skip
        return {"message": "no error"}
    except fd.distributed.CollectiveError as e:
        return {"message": str(e), "missing": e.missing, "waited": time.monotonic() - calls[-1]}
    except ValueError as e:
        return {"message": f"ValueError: {e}", "waited": time.monotonic() - calls[-1]}


def rank_main() -> None:
    # every rank has torch imported before the group starts (its timeout is short)
    store = dist.TCPStore("127.0.0.1", PORT, WORLD, RANK == 0, datetime.timedelta(seconds=120))
    store.add("ready", 1)
    while int(store.add("ready", 0)) < WORLD:
        time.sleep(0.01)
    dist.init_process_group(
        "gloo", store=store, rank=RANK, world_size=WORLD,
        timeout=datetime.timedelta(seconds=TIMEOUT),
    )  # fmt: skip
    out = run()
    with open(os.path.join(OUT, f"rank{RANK}.json"), "w") as f:
        json.dump(out, f)
    # rank 0's process serves the store: it stays until every rank wrote its report
    store.add("done", 1)
    if RANK == 0:
        deadline, alive = time.monotonic() + 60, WORLD - (MODE == "kill")
        while int(store.add("done", 0)) < alive and time.monotonic() < deadline:
            time.sleep(0.05)
    sys.stdout.flush()
    os._exit(0)


def main() -> None:
    """Fork the ranks, wait for them (at most 120 s); exit 1 if one failed or hung."""
    global RANK
    pids = {}
    for r in range(WORLD):
        pid = os.fork()
        if pid == 0:
            RANK = r
            try:
                rank_main()
            finally:
                os._exit(1)  # rank_main leaves with os._exit(0)
        pids[pid] = r
    deadline, failed = time.monotonic() + 120, []
    while pids and time.monotonic() < deadline:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            time.sleep(0.05)
            continue
        if status != 0 and not (MODE == "kill" and pids[pid] == STALLED):
            failed.append(pids[pid])
        del pids[pid]
    for pid in pids:
        os.kill(pid, 9)
    if failed or pids:
        sys.exit(f"ranks {failed} failed, ranks {sorted(pids.values())} hung")


if __name__ == "__main__":
    main()
