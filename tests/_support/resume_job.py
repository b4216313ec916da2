"""Kill ``fd.fit(checkpoint=..., resume=True)`` with SIGKILL and check the resumed run.

One driver process imports functd once and forks a child per attempt (no
thread pool exists before the fork: the driver runs no torch op until the
children are done). Each child runs the same training (a keyed loss, batches
that depend on the epoch) with ``resume=True``; the driver kills it at a random
moment, starts the next attempt, and so on until an attempt finishes. The
result must equal, bit for bit, the run that was never interrupted. After each
kill the driver checks that the newest checkpoint file (if any) still loads.

``--write-kills`` adds attempts that kill themselves at fixed points inside the
checkpoint write: after writing half of the temporary file, and before each of
the ``os.replace`` calls of the rotation.

Run by tests/test_resume.py with a few kills; the larger battery of
notes/reliability.md is::

    python -m tests._support.resume_job OUT_DIR --trials 10 --kills 6 --write-kills

It prints (and writes to ``OUT_DIR/summary.json``) the figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import select
import signal
import statistics
import sys
import time

import torch

torch.set_num_threads(1)  # before any op: forked children share no thread pool

import functd as fd  # noqa: E402
import functd._checkpoint as _ckpt  # noqa: E402

EPOCHS, STEPS, ROWS, WIDTH = 8, 5, 16, 64


def _training(notify):
    model = fd.Module(fd.nn.MLP(8, 1, num_cells=(WIDTH, WIDTH)), in_keys=["x"], out_keys=["pred"])
    params = model.init(fd.random.key(0))

    def loss_fn(params, batch, key):  # the key matters: noise on the inputs
        noisy = batch["x"] + 0.1 * fd.random.normal(key, batch["x"].shape)
        return ((model(params, x=noisy) - batch["y"]) ** 2).mean()

    def batches(epoch):  # the data depend on the epoch
        notify(epoch)
        x = fd.random.normal(fd.random.fold_in(fd.random.key(7), epoch), (STEPS * ROWS, 8))
        y = torch.sin(x.sum(-1, keepdim=True))
        return [
            fd.TensorDict({"x": x[i : i + ROWS], "y": y[i : i + ROWS]}, [ROWS])
            for i in range(0, STEPS * ROWS, ROWS)
        ]

    opt = fd.optim.adam(1e-2)
    return fd.train_step(loss_fn, opt), params, opt.init(params), batches


def _die_at(kind: str, n: int) -> None:
    """Make this child SIGKILL itself at the ``n``-th checkpoint ``save`` (after
    writing half of the file) or at the ``n``-th ``os.replace`` (before it)."""
    calls = {"save": 0, "replace": 0}
    real_save, real_replace = _ckpt.save, os.replace

    def save(obj, path):
        calls["save"] += 1
        real_save(obj, path)
        if kind == "save" and calls["save"] == n:
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2)
            os.kill(os.getpid(), signal.SIGKILL)

    def replace(src, dst):
        calls["replace"] += 1
        if kind == "replace" and calls["replace"] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        real_replace(src, dst)

    _ckpt.save = save
    os.replace = replace


def _child(folder: str, result: str | None, pipe: int, die: tuple | None) -> None:
    """Run the training with resume=True in ``folder``; write the result when done."""
    try:
        if die is not None:
            _die_at(*die)
        step, params, state, batches = _training(lambda e: os.write(pipe, f"{e}\n".encode()))
        out = fd.fit(
            step,
            params,
            state,
            batches,
            fd.random.key(3),
            epochs=EPOCHS,
            progress=False,
            checkpoint=os.path.join(folder, "ckpt.pt"),
            resume=True,
            keep=2,
        )
        if result is not None:
            fd.save(dict(zip(("params", "opt_state", "history"), out)), result)
        os._exit(0)
    except BaseException:
        import traceback

        traceback.print_exc()
        os._exit(1)


def _start(folder, result=None, die=None):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(folder, result, w, die)
    os.close(w)
    return pid, r


def _read_epochs(fd_: int, seconds: float = 120) -> list[int] | None:
    """Epoch marks written by the child (None: the pipe closed, the child ended)."""
    ready, _, _ = select.select([fd_], [], [], seconds)
    if not ready:
        raise TimeoutError(f"no word from the training child in {seconds} s")
    data = os.read(fd_, 4096)
    return None if not data else [int(x) for x in data.split()]


def _wait(pid: int, pipe: int) -> int:
    os.close(pipe)
    _, status = os.waitpid(pid, 0)
    return status


def _killed_attempt(folder: str, rng: random.Random, epoch_s: float) -> bool:
    """One attempt killed at a random moment; False when it finished first."""
    pid, pipe = _start(folder)
    marks: list[int] = []
    while not marks:
        got = _read_epochs(pipe)
        if got is None:  # finished (a finished run resumes to its end at once)
            _wait(pid, pipe)
            return False
        marks += got
    # an epoch that is not the last one, then a moment within it (its steps or its
    # checkpoint write at the end, or the start of the next): the run never ends first
    target = rng.randint(marks[0], max(marks[0], EPOCHS - 2))
    while marks[-1] < target:
        got = _read_epochs(pipe)
        if got is None:
            _wait(pid, pipe)
            return False
        marks += got
    time.sleep(rng.uniform(0, epoch_s))
    os.kill(pid, signal.SIGKILL)
    status = _wait(pid, pipe)
    return os.WIFSIGNALED(status)


def _newest_loads(folder: str) -> bool:
    path = os.path.join(folder, "ckpt.pt")
    if not os.path.exists(path):
        return not os.path.exists(path + ".1") or _loads(path + ".1")
    return _loads(path)


def _loads(path: str) -> bool:
    pid = os.fork()  # load in a child: the driver stays free of torch threads
    if pid == 0:
        try:
            fd.load(path)
            os._exit(0)
        except BaseException:
            os._exit(1)
    return os.waitpid(pid, 0)[1] == 0


def _finish(folder: str, result: str, die=None, times: list | None = None) -> bool:
    """Run an attempt to its end (or to its planned death: True when it died);
    ``times`` gets the moments the epochs started."""
    pid, pipe = _start(folder, result, die)
    while (got := _read_epochs(pipe)) is not None:
        if times is not None:
            times += [time.perf_counter()] * len(got)
    status = _wait(pid, pipe)
    if os.WIFSIGNALED(status) and die is not None:
        return True
    if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
        raise RuntimeError(f"the training child failed (status {status}) in {folder}")
    return False


def _equal(a: str, b: str) -> bool:
    x, y = fd.load(a), fd.load(b)
    if fd.tree.structure(x) != fd.tree.structure(y):
        return False
    return all(torch.equal(p, q) for p, q in zip(fd.tree.leaves(x), fd.tree.leaves(y)))


def battery(out: str, trials: int, kills: int, write_kills: bool, seed: int) -> dict:
    rng = random.Random(seed)
    ref = os.path.join(out, "reference.pt")
    start = time.perf_counter()
    os.makedirs(os.path.join(out, "ref"))
    times: list[float] = []
    _finish(os.path.join(out, "ref"), ref, times=times)
    # an epoch with its checkpoint write (marks read together share a time: skipped)
    epoch_s = statistics.median(b - a for a, b in itertools.pairwise(times) if b > a)
    stats = {"trials": 0, "kills": 0, "newest_lost": 0, "tmp_left": 0, "equal": 0}
    plans = [("random", None)] * trials
    if write_kills:
        plans += [("write", ("save", 2)), ("write", ("save", 5))]
        plans += [("write", ("replace", n)) for n in (2, 3, 4, 5)]
    for t, (kind, die) in enumerate(plans):
        folder = os.path.join(out, f"trial{t}")
        os.makedirs(folder)
        if kind == "write":
            assert _finish(folder, os.path.join(folder, "unused.pt"), die), die
            stats["kills"] += 1
            stats["tmp_left"] += os.path.exists(os.path.join(folder, "ckpt.pt.tmp"))
            stats["newest_lost"] += not _newest_loads(folder)
        for _ in range(kills if kind == "random" else 0):
            if not _killed_attempt(folder, rng, epoch_s):
                break
            stats["kills"] += 1
            stats["tmp_left"] += os.path.exists(os.path.join(folder, "ckpt.pt.tmp"))
            stats["newest_lost"] += not _newest_loads(folder)
        result = os.path.join(folder, "result.pt")
        _finish(folder, result)
        stats["trials"] += 1
        stats["equal"] += _equal(result, ref)
        stats["files_left"] = sorted(os.listdir(folder))
    stats["seconds"] = round(time.perf_counter() - start, 1)
    stats["epoch_ms"] = round(epoch_s * 1e3, 1)
    return stats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--trials", type=int, default=1)
    p.add_argument("--kills", type=int, default=3, help="random kills per trial (at most)")
    p.add_argument("--write-kills", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    stats = battery(a.out, a.trials, a.kills, a.write_kills, a.seed)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(stats, f)
    print(json.dumps(stats))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
