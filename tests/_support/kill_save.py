"""kill -9 during ``fd.save``: the file at the path always loads to the old or the new value.

A driver process (this file, run as a script) imports functd once, then for each
kill forks a writer that saves TensorDicts of ``--mb`` MB to the same path in a
loop (version ``i``: every element of ``x`` is ``i``, ``meta.i == i``,
``meta.check == 7 * i + 3``), reporting each finished save on a pipe; after a
random delay the driver kills it with SIGKILL and loads the file. The file must
hold a whole version: the last one reported finished, or the one in progress
(its ``os.replace`` may have happened just before the kill). A kill "inside a
write" is one that left the writer's temporary file behind. At the end one more
save runs to completion and must have removed every temporary file of the
killed writers.

Run: ``python tests/_support/kill_save.py --kills 60 --mb 8 [--seed 0] [--path P]``; prints
a JSON summary (tests/test_io_atomic.py runs 10 kills of 4 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time

import torch

import functd as fd


def version(i: int, n: int) -> fd.TensorDict:
    x = torch.full((n,), float(i))
    meta = {"i": torch.tensor(i), "check": torch.tensor(7 * i + 3)}
    return fd.TensorDict({"x": x, "meta": meta}, [])


def _whole_version(td: fd.TensorDict, n: int) -> int | None:
    """The version a loaded file holds, or None when it is not a whole version."""
    i = int(td["meta", "i"])
    ok = (
        int(td["meta", "check"]) == 7 * i + 3
        and td["x"].shape == (n,)
        and bool((td["x"] == float(i)).all())
    )
    return i if ok else None


def _writer(path: str, start: int, n: int, out: int) -> None:
    """The forked child: save versions start, start+1, ... and report each on ``out``."""
    i = start
    while True:
        fd.save(version(i, n), path)
        os.write(out, f"{i}\n".encode())
        i += 1


def _temps(path: str) -> list[str]:
    folder, name = os.path.split(os.path.abspath(path))
    return [f for f in os.listdir(folder) if f.startswith(f".{name}.") and f.endswith(".tmp")]


def run(path: str, kills: int, mb: float, seed: int) -> dict:
    torch.set_num_threads(1)  # no thread pool in the driver: forking stays safe
    rng = random.Random(seed)
    n = int(mb * (1 << 20)) // 4
    fd.save(version(0, n), path)
    t = time.perf_counter()
    fd.save(version(0, n), path)
    save_s = time.perf_counter() - t
    done, lost, wrong, inside, landed_new = 0, 0, [], 0, 0
    start = time.perf_counter()
    for _ in range(kills):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the writer
            os.close(r)
            try:
                _writer(path, done + 1, n, w)
            finally:
                os._exit(1)
        os.close(w)
        time.sleep(rng.uniform(0.2, 3.0) * save_s)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        with os.fdopen(r) as f:
            reported = [int(x) for x in f.read().split()]
        last = reported[-1] if reported else done
        inside += any(f"-{pid}-" in name for name in _temps(path))
        try:
            got = _whole_version(fd.load(path), n)
        except Exception as e:  # a lost file: truncated, empty, unreadable
            lost += 1
            wrong.append(f"kill after version {last}: {type(e).__name__}: {str(e)[:200]}")
            got = None
        if got not in (last, last + 1):
            if got is not None:
                wrong.append(f"kill after version {last}: the file holds version {got}")
        else:
            landed_new += got == last + 1
        done = max(last, got or 0)
    fd.save(version(done + 1, n), path)  # a save that finishes sweeps the killed writers' files
    return {
        "kills": kills,
        "mb": mb,
        "save_s": round(save_s, 4),
        "seconds": round(time.perf_counter() - start, 1),
        "inside_write": inside,
        "new_version_landed": landed_new,
        "lost": lost,
        "wrong": wrong,
        "temps_left": _temps(path),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=60)
    p.add_argument("--mb", type=float, default=8.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--path", default=None)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        path = a.path or os.path.join(d, "ckpt.pt")
        print(json.dumps(run(path, a.kills, a.mb, a.seed)))


if __name__ == "__main__":
    sys.exit(main())
