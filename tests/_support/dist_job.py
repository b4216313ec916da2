"""The two halves of a torch.distributed job that a test module spawns.

``launch`` (pytest's side) starts one process a rank running a worker script
(``python WORKER RANK WORLD PORT OUT_DIR *extra``, on 127.0.0.1), waits for all
of them, fails with the rank's log when one exits non-zero, and returns each
rank's report (``OUT_DIR/rank{r}.json``). ``run_checks`` (the worker's side) runs
the checks in order on every rank, records each outcome (a failing check is
recorded, and the job goes on), writes the report and leaves.

Example:
    >>> reports = launch(ROOT / "tests" / "_support" / "dist_worker.py", 2, tmp_path)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def launch(worker: str | os.PathLike, world: int, out: Path, *extra: str, timeout: float = 180):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the repo first, then whatever the caller's PYTHONPATH already held (packages
    # installed outside site-packages, as on some GPU machines)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")
    args = [str(world), str(port), str(out), *extra]
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(r), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        for r in range(world)
    ]
    try:
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{log[-4000:]}"
    return [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(world)]


def run_checks(checks: list[Callable], rank: int, out: str, final: Callable | None = None) -> None:
    """Run ``checks`` (a barrier after each, so the ranks stay paired), then
    ``final`` (a check that may leave the process group broken: no barrier after
    it), write ``{name: {"ok", "value" | "type", "message", "traceback",
    "seconds"}}`` to ``out/rank{rank}.json``, destroy the process group and exit."""
    import torch.distributed as dist

    results = {}
    for fn in [*checks, *([final] if final is not None else [])]:
        start = time.perf_counter()
        try:
            results[fn.__name__] = {"ok": True, "value": fn()}
        except Exception as e:
            results[fn.__name__] = {
                "ok": False,
                "type": type(e).__name__,
                "message": str(e),
                "traceback": traceback.format_exc(),
            }
        results[fn.__name__]["seconds"] = round(time.perf_counter() - start, 2)
        if fn is not final:
            dist.barrier()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    if final is None:
        dist.destroy_process_group()
    # Skip the interpreter's teardown: freeing DDP/gloo objects after the group is
    # destroyed hung now and then (seen in benchmarks/data_parallel.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
