"""Shared helpers of the benchmark scripts: timing and table printing.

Times are medians of ``torch.utils.benchmark.Timer.blocked_autorange``; the
scripts print ratios against peers measured in the same run, since absolute
times on shared machines mean little.
"""

from __future__ import annotations

import datetime
import os

import torch
from _cpu import cpu_model
from torch.utils.benchmark import Timer

MIN_RUN_TIME = float(os.environ.get("BENCH_MIN_RUN_TIME", "0.3"))
# Where the benchmarks put their tensors: BENCH_DEVICE=cuda for the GPU rows
# (`make gpu-check`); the CPU by default.
DEVICE = torch.device(os.environ.get("BENCH_DEVICE") or "cpu")
ON_GPU = DEVICE.type == "cuda"


def median_us(fn, min_run_time: float = MIN_RUN_TIME) -> float:
    """Median wall time of ``fn()`` in microseconds (torch's Timer synchronizes CUDA)."""
    fn()
    return (
        Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time).median * 1e6
    )


def machine() -> str:
    cpu = cpu_model()
    where = f", {torch.cuda.get_device_name(DEVICE)}" if ON_GPU else ""
    return (
        f"{datetime.date.today()}, {cpu}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads{where}"
    )


def table(header: list[str], rows: list[list]) -> str:
    def fmt(v):
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


# "process": this process's CPU time (the default on CPU: with one thread it is the work
# done, whatever else a shared machine runs); "wall": median_us (always on the GPU).
CLOCK = "wall" if ON_GPU else os.environ.get("BENCH_CLOCK", "process")
THREADS = int(os.environ.get("BENCH_THREADS", "1"))


def clock_us(fn, min_run_time: float = MIN_RUN_TIME) -> float:
    """Median time of ``fn()`` in µs on ``CLOCK``: blocks of calls long enough for the
    clock's resolution, their median per call."""
    if CLOCK == "wall":
        return median_us(fn, min_run_time)
    import statistics
    import time

    fn()
    n = 1
    while True:
        t0 = time.process_time()
        for _ in range(n):
            fn()
        dt = time.process_time() - t0
        if dt > 0.005 or n > 1 << 16:
            break
        n *= 2
    times, total = [], 0.0
    while total < min_run_time or len(times) < 5:
        t0 = time.process_time()
        for _ in range(n):
            fn()
        dt = time.process_time() - t0
        times.append(dt / n)
        total += dt
    return statistics.median(times) * 1e6


def peak_mib(fn) -> float:
    """Peak of (allocated - freed) bytes during ``fn()``, in MiB, from ``torch.profiler``'s
    memory events (``profile_memory=True``): exact bytes of torch tensors on the CPU,
    which has no caching allocator; the result is freed inside the window."""
    from torch.profiler import ProfilerActivity, profile

    err = os.dup(2)  # the profiler's start/stop lines go to stderr: not into the tables
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            result = fn()
            del result
    finally:
        os.dup2(err, 2)
        os.close(err)
    events = prof.profiler.kineto_results.events()
    deltas = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    total = peak = 0
    for _, b in deltas:
        total += b
        peak = max(peak, total)
    return peak / 2**20
