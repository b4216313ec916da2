"""A data-parallel ``fd.fit(checkpoint=..., resume=True)`` run under ``torchrun``.

``torchrun --nproc-per-node 2 --max-restarts 2 tests/_support/torchrun_resume.py OUT KILL_STEP``:
in the first attempt (``TORCHELASTIC_RESTART_COUNT=0``) rank 1 kills itself with
SIGKILL in the loss of step ``KILL_STEP`` (``-1``: never); torchrun then stops
rank 0 and restarts both, which resume from the checkpoint. The restarted ranks
then run the same fit uninterrupted and compare bit for bit; rank 0 writes
``attempt=N equal=True steps=S`` to ``OUT/result.txt`` (read by
tests/test_distributed_fit.py).
"""

from __future__ import annotations

import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist

import functd as fd

torch.set_default_dtype(torch.float64)
OUT, KILL_STEP = sys.argv[1], int(sys.argv[2])
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
EPOCHS = 4


RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def attempt_store() -> dist.Store:
    """torchrun's store with a prefix of this attempt. Without it, gloo's
    connectFullMesh of a restarted attempt read now and then the address of the
    previous attempt's rank 0 (left in the agent's store) and failed with
    "Connection refused", or waited its whole timeout (4 of 9 restarts here)."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        WORLD,
        is_master=RANK == 0 and not agent,
        timeout=datetime.timedelta(seconds=60),
    )
    return dist.PrefixStore(f"attempt{ATTEMPT}", store)


def main() -> None:
    dist.init_process_group("gloo", store=attempt_store(), rank=RANK, world_size=WORLD)
    rank = dist.get_rank()
    model = fd.Module(fd.nn.MLP(4, 1, num_cells=(16,)), in_keys=["x"], out_keys=["pred"])
    calls = [0]

    def loss_fn(params, batch, key):
        if rank == 1 and ATTEMPT == 0 and calls[0] == KILL_STEP:
            os.kill(os.getpid(), signal.SIGKILL)
        calls[0] += 1
        noisy = batch["x"] + 0.1 * fd.random.normal(key, batch["x"].shape, dtype=torch.float64)
        return ((model(params, x=noisy) - batch["y"]) ** 2).mean()

    def batches(epoch):
        x = fd.random.normal(fd.random.fold_in(fd.random.key(5), epoch), (24, 4), torch.float64)
        y = torch.sin(x.sum(-1, keepdim=True))
        return [fd.TensorDict({"x": x[i : i + 8], "y": y[i : i + 8]}, [8]) for i in (0, 8, 16)]

    opt = fd.optim.chain(fd.distributed.mean_updates(), fd.optim.adam(1e-2))
    params = model.init(fd.random.key(0)).double()
    step = fd.train_step(loss_fn, opt)

    def fit(**kw):
        return fd.fit(
            step, params, opt.init(params), batches, fd.random.key(1), epochs=EPOCHS,
            progress=False, data_parallel=True, timeout=60, **kw,
        )  # fmt: skip

    resumed = fit(checkpoint=os.path.join(OUT, "ckpt.pt"), resume=True)
    whole = fit()  # the same run, never interrupted
    equal = all(torch.equal(a, b) for a, b in zip(fd.tree.leaves(resumed), fd.tree.leaves(whole)))
    if rank == 0:
        with open(os.path.join(OUT, "result.txt"), "w") as f:
            f.write(f"attempt={ATTEMPT} equal={equal} steps={resumed[2].batch_size[0]}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
