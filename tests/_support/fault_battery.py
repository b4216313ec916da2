"""Run the distributed fault job of tests/test_distributed_fit.py many times.

Each run launches the 2 gloo ranks of tests/_support/dist_fit_worker.py (bounded by a
timeout: a hang counts as a failure) and applies every test of
tests/test_distributed_fit.py that reads the job's report; it prints the number
of runs in which each test passed and the stalled-rank timings (seconds from
entering the collective to the error, per rank). The figures of
notes/reliability.md come from::

    python -m tests._support.fault_battery OUT_DIR --runs 10
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import time
from pathlib import Path

from tests import test_distributed_fit as t
from tests._support.dist_job import launch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--runs", type=int, default=10)
    a = p.parse_args()
    tests = [
        f
        for name, f in vars(t).items()
        if name.startswith("test_") and list(inspect.signature(f).parameters) == ["report"]
    ]
    passed = dict.fromkeys((f.__name__ for f in tests), 0)
    hangs, waited, seconds = 0, {0: [], 1: []}, []
    for run in range(a.runs):
        out = Path(a.out) / f"run{run}"
        os.makedirs(out)
        start = time.perf_counter()
        try:
            report = launch(t.WORKER, t.WORLD, out, str(t.TIMEOUT), timeout=240)
        except subprocess.TimeoutExpired:
            hangs += 1
            continue
        seconds.append(round(time.perf_counter() - start, 1))
        for f in tests:
            try:
                f(report)
                passed[f.__name__] += 1
            except AssertionError as e:
                print(f"run {run}: {f.__name__} failed: {str(e)[:500]}")
        for r in (0, 1):
            value = report[r]["stalled_rank"].get("value") or {}
            waited[r].append(round(value.get("waited", -1), 2))
    summary = {"runs": a.runs, "hangs": hangs, "passed": passed, "waited": waited}
    summary["job_seconds"] = seconds
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
