"""The one GPU check (`make gpu-check`): the CUDA tests and the GPU rows of the benchmarks.

Runs, each in its own process with a time limit, ``pytest -m cuda`` and the
benchmarks ``cuda_graph``, ``prng``, ``policy``, ``ensemble``,
``train_step`` and ``jit`` with ``BENCH_DEVICE=cuda`` in their short settings,
then prints one table: a row per test run and per benchmark row (the benchmark's
own columns joined by `` · ``). The whole check is sized for under 6 minutes on
one GPU. Without CUDA it prints that it skipped and exits 0, so it runs unchanged on
any machine; it exits 1 when a step fails or times out.

Run: .venv/bin/python benchmarks/gpu_check.py   (GPU_CHECK_BUDGET=300: seconds the
shares of the steps are taken from;
GPU_CHECK_DEVICE=cpu: a smoke run of every step on the CPU)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUDGET = float(os.environ.get("GPU_CHECK_BUDGET", "300"))
# (name, argv, share of the budget); the benchmarks' short settings.
STEPS = [
    (
        "cuda tests",
        [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider"],
        0.25,
    ),
    ("cuda_graph", [sys.executable, os.path.join(HERE, "cuda_graph.py")], 0.15),
    ("prng", [sys.executable, os.path.join(HERE, "prng.py")], 0.1),
    ("policy", [sys.executable, os.path.join(HERE, "policy.py")], 0.15),
    ("ensemble", [sys.executable, os.path.join(HERE, "ensemble.py")], 0.2),
    ("train_step", [sys.executable, os.path.join(HERE, "train_step.py")], 0.15),
    ("jit", [sys.executable, os.path.join(HERE, "jit.py")], 0.2),
]
# GPU_CHECK_DEVICE=cpu is a smoke run of the whole check on a CPU machine.
FORCED = os.environ.get("GPU_CHECK_DEVICE")
ENV = {
    "BENCH_DEVICE": FORCED or "cuda",
    "BENCH_QUICK": "1",
    "BENCH_ROUNDS": "2",
    "BENCH_MIN_RUN_TIME": "0.1",
    "HYPOTHESIS_PROFILE": "ci",
}


def table_rows(text: str) -> list[str]:
    """The data rows of every markdown table in ``text``, cells joined by ' · '."""
    rows = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("|") or re.fullmatch(r"\|[-:| ]+\|", line):
            continue
        if i + 1 < len(lines) and re.fullmatch(r"\|[-:| ]+\|", lines[i + 1]):
            continue  # a header row
        rows.append(" · ".join(c.strip() for c in line.strip("|").split("|")))
    return rows


def run_step(name: str, argv: list[str], limit: float) -> tuple[str, float, list[str]]:
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            argv, cwd=ROOT, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=limit
        )
    except subprocess.TimeoutExpired:
        return f"TIMEOUT after {limit:.0f} s", time.monotonic() - t0, []
    dt = time.monotonic() - t0
    out = done.stdout + done.stderr
    if done.returncode != 0:
        tail = out.strip().splitlines()[-3:]
        return f"FAILED (rc {done.returncode}): {' / '.join(tail)}", dt, []
    if name == "cuda tests":
        summary = [
            ln
            for ln in out.splitlines()
            if re.search(r"\d+ (passed|failed|skipped|deselected)", ln)
        ]
        return "ok", dt, summary[-1:]
    return "ok", dt, table_rows(done.stdout)


def main() -> int:
    if not FORCED and not torch.cuda.is_available():
        print("gpu-check: skipped: no CUDA device on this machine (nothing to check)")
        return 0
    where = torch.cuda.get_device_name(0) if not FORCED else f"{FORCED} (smoke run)"
    print(f"# gpu-check on {where}, torch {torch.__version__}\n")
    print("| step | result | s | row |")
    print("|---|---|---|---|")
    failed = False
    for name, argv, share in STEPS:
        result, dt, rows = run_step(name, argv, BUDGET * share)
        failed |= result != "ok"
        for j, row in enumerate(rows or [""]):
            first = j == 0
            print(
                f"| {name if first else ''} | {result if first else ''} | "
                f"{f'{dt:.0f}' if first else ''} | {row} |",
                flush=True,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
