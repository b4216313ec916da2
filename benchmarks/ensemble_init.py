"""Making an ensemble of the tutorial block (Linear 3->128, 128->128, 128->3): functd's
one-shot ``fd.vmap(block.init)(keys)`` against its peers (issue 22).

Rows, at 256 and 1024 members: ``fd.vmap(block.init)(keys)`` (one kernel draw per
parameter leaf over all members); a Python loop of ``block.init(k)`` + ``fd.stack``;
torch's way, building the ``nn.Module`` members and ``torch.func.stack_module_state``
(its default init draws from torch's generator). At 64 members also the same vmap on
the pure torch-op path (``FUNCTD_FUSED_RANDOM=0``: how vmapped draws ran before).
Each time is the best of BENCH_ROUNDS=3 interleaved wall-clock runs, BENCH_THREADS=2.
Targets at 1024 members: <= 0.1x stack_module_state and <= 0.5x the loop.

Run: .venv/bin/python benchmarks/ensemble_init.py   (about a minute)
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch.func import stack_module_state

sys.path.insert(0, os.path.dirname(__file__))
from _common import machine, table
from tutorial_block import ResidualBlock, functd_block

import functd as fd
import functd.random as fr
from functd import _fused

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))


def seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def pure(fn):
    def call():
        saved, _fused._KERNEL = _fused._KERNEL, False
        try:
            return fn()
        finally:
            _fused._KERNEL = saved

    return call


def main() -> None:
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    block = functd_block(ResidualBlock())[0]
    rows = []
    for n in (64, 256, 1024):
        keys = fr.split(fr.key(0), n)
        fns = {
            "vmap": lambda k=keys: fd.vmap(block.init)(k),
            "loop": lambda k=keys: fd.stack([block.init(m) for m in k]),
            "torch": lambda n=n: stack_module_state([ResidualBlock() for _ in range(n)]),
        }
        if n == 64:
            fns["vmap pure"] = pure(fns["vmap"])
        fns["vmap"]()  # warm up
        best = dict.fromkeys(fns, float("inf"))
        for _ in range(ROUNDS):
            for name, fn in fns.items():
                best[name] = min(best[name], seconds(fn))
        t = best["vmap"]
        rows.append(
            [
                n,
                f"{t:.4f}",
                f"{best['loop']:.4f}",
                f"{best['torch']:.4f}",
                f"{best['vmap pure']:.3f}" if "vmap pure" in best else "—",
                f"{t / best['torch']:.3f}x",
                f"{t / best['loop']:.3f}x",
            ]
        )
    print(f"{machine()}, load {os.getloadavg()[0]:.1f}, kernel variant {_fused.variant()}, "
          f"best of {ROUNDS} interleaved runs\n")  # fmt: skip
    header = [
        "members",
        "fd.vmap(block.init) (s)",
        "loop of block.init + fd.stack (s)",
        "nn.Module x n + stack_module_state (s)",
        "fd.vmap, pure ops (s)",
        "vmap / torch (<= 0.1x at 1024)",
        "vmap / loop (<= 0.5x at 1024)",
    ]
    print(table(header, rows))


if __name__ == "__main__":
    main()
