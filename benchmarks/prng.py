"""functd.random against torch's global generator: the targets of issue 11, one table.

Rows: ``normal``/``uniform`` (float32) at 4, 1024 and 2**20 draws against
``torch.randn``/``torch.rand``; ``split(k, 2)`` and ``fold_in(k, 7)`` on a concrete
key; the first draw in a fresh process with an empty kernel cache. functd's
eager path (the fused kernel, see notes/prng.md) and its pure torch-op path (the
fallback, ``FUNCTD_FUSED_RANDOM=0``) are timed side by side with the peer,
interleaved over rounds; each time is the best of the rounds' medians. Targets:
<= 25 µs up to 1024 draws; <= 1.5x torch.randn / <= 1.0x torch.rand at 2**20;
split/fold_in <= 5 µs; a cold first draw at most 2 s more than the pure path's.
BENCH_DEVICE=cuda times the GPU (pure ops; no cold-start rows).

Run: .venv/bin/python benchmarks/prng.py   (BENCH_ROUNDS=3, BENCH_THREADS=2)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import DEVICE, ON_GPU, machine, median_us, table

import functd.random as fr
from functd import _fused

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLD = """
import time, torch
t0 = time.perf_counter()
import functd.random as fr
t1 = time.perf_counter()
z = fr.normal(fr.key(0), (1024,))
t2 = time.perf_counter()
import functd._fused as f
print(__import__("json").dumps([t1 - t0, t2 - t1, bool(f._KERNEL)]))
"""


def pure(fn):
    """``fn`` on the pure torch-op path (what FUNCTD_FUSED_RANDOM=0 runs)."""

    def call():
        saved, _fused._KERNEL = _fused._KERNEL, False
        try:
            return fn()
        finally:
            _fused._KERNEL = saved

    return call


def best_of_rounds(fns: dict) -> dict:
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            best[name] = min(best[name], median_us(fn))
    return best


def first_draw(fused: bool, cache: str) -> tuple[float, bool]:
    """Seconds of the first ``normal(key, (1024,))`` in a fresh process using ``cache``."""
    env = {**os.environ, "FUNCTD_CACHE_DIR": cache, "FUNCTD_FUSED_RANDOM": str(int(fused))}
    env["PYTHONPATH"] = ROOT
    out = subprocess.run(
        [sys.executable, "-c", COLD], env=env, capture_output=True, text=True, check=True
    )
    _, first, used = json.loads(out.stdout.strip().splitlines()[-1])
    return first, used


def main() -> None:
    if not ON_GPU:
        torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    key = fr.key(0, device=DEVICE)
    fr.normal(fr.key(0), (4,))  # load (or build) the kernel outside the timings
    rows = []
    for dist, peer_name, peer, ours in [
        ("uniform", "torch.rand", torch.rand, fr.uniform),
        ("normal", "torch.randn", torch.randn, fr.normal),
    ]:
        for n in (4, 1024, 2**20):
            fns = {
                "fused": lambda o=ours, n=n: o(key, (n,)),
                "pure": pure(lambda o=ours, n=n: o(key, (n,))),
                "peer": lambda p=peer, n=n: p(n, device=DEVICE),
            }
            t = best_of_rounds(fns)
            big = "<= 1.0x" if dist == "uniform" else "<= 1.5x"
            target = "<= 25 µs" if n <= 1024 else big
            label = f"`{dist}(k, ({n if n < 2**20 else '2**20'},))` vs {peer_name}"
            rows.append([label, t["fused"], t["pure"], t["peer"], t["fused"] / t["peer"], target])
    for label, fn in [("`split(k, 2)`", lambda: fr.split(key, 2)), ("`fold_in(k, 7)`", lambda: fr.fold_in(key, 7))]:  # fmt: skip
        t = best_of_rounds({"fused": fn, "pure": pure(fn)})
        rows.append([label, t["fused"], t["pure"], "—", "—", "<= 5 µs"])
    if not ON_GPU:
        with tempfile.TemporaryDirectory() as cache:
            base, _ = first_draw(False, cache)
            cold, used = first_draw(True, cache)  # builds the kernel into the empty folder
            warm, _ = first_draw(True, cache)  # loads it
        extra = f"{cold - base:+.2f} s" + ("" if used else " (no kernel!)")
        label = "first draw, fresh process, empty kernel cache (s)"
        rows.append([label, round(cold, 3), round(base, 3), "—", extra, "<= +2 s"])
        label = "first draw, fresh process, kernel cached (s)"
        rows.append([label, round(warm, 3), round(base, 3), "—", f"{warm - base:+.2f} s", "—"])
    print(f"{machine()}, load {os.getloadavg()[0]:.1f}, best of {ROUNDS} interleaved medians\n")
    header = ["work", "functd fused (µs)", "functd pure-op (µs)", "peer (µs)", "fused / peer"]
    print(table([*header, "target"], rows))


if __name__ == "__main__":
    main()
