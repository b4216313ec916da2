"""Timing for the examples' speed lines: interleaved rounds of one thread's CPU time.

Shared by examples/tutorial.py and examples/ensembles.py (a script's own folder is on
``sys.path``, so ``from _timing import interleaved`` works from anywhere).

Example:
    >>> import statistics
    >>> t = interleaved({"a": lambda: sum(range(100)), "b": lambda: sum(range(200))}, 5, 0.01)
    >>> statistics.median(b / a for a, b in zip(t["a"], t["b"])) > 1
    True
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["interleaved"]

K = TypeVar("K")


def interleaved(
    fns: dict[K, Callable[[], object]], rounds: int = 11, block_s: float = 0.05
) -> dict[K, list[float]]:
    """CPU seconds per call of each function in each round: {name: [round 0, round 1, ...]}.

    The thread's CPU time (time.thread_time; torch runs on this thread when it has one),
    not the wall clock: the time other processes hold the core is not counted. The
    functions take turns within every round (in alternating order), so what the load
    still changes (caches, clock speed) hits all of them alike; compare them by the
    median of the per-round ratios, which a shared machine's noise cannot invert.
    """
    calls = {}
    for name, fn in fns.items():  # warm up, then size a block to about block_s
        fn()
        start = time.thread_time()
        fn()
        calls[name] = max(1, round(block_s / max(time.thread_time() - start, 1e-7)))
    times: dict[K, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            start = time.thread_time()
            for _ in range(calls[name]):
                fns[name]()
            times[name].append((time.thread_time() - start) / calls[name])
    return times
