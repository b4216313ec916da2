"""Per-call cost of ``fd.vmap`` at small sizes, where its own work (pairing in_dims with
the leaves, the checks, the flat function) is a visible part of the call.

Rows: the tutorial block over an ensemble of 4 at batch 1 with in_dims ``(0, None)``;
the same through a container TensorDict with per-entry in_dims
``({"params": 0, "td": None},)``; a tensor function over a tuple ``(x, (y, None))``
with in_dims ``(0, (0, None))``. Each against ``torch.func.vmap`` of the same function
(which knows TensorDicts through torch's pytree but checks nothing; for the container,
which it cannot map by a dict, of the block on the container's two entries). Times are the
best of BENCH_ROUNDS interleaved medians of this process's CPU time with one thread.

A/B two checkouts: run it with ``PYTHONPATH=<tree>`` for each, interleaved.

Run: .venv/bin/python benchmarks/vmap_call.py
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import clock_us, machine, table
from tutorial_block import ResidualBlock, functd_block

import functd as fd

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
RUN_TIME = float(os.environ.get("BENCH_MIN_RUN_TIME", "0.1"))


def cases():
    block, _ = functd_block(ResidualBlock())
    ens = fd.vmap(block.init)(fd.random.split(fd.random.key(0), 4))
    td = fd.TensorDict({"x": torch.randn(1, 3)}, [1])
    box = fd.TensorDict({"params": ens, "td": td}, [])

    def boxed(b):
        return block(b["params"], b["td"])

    def tensors(x, pair):
        return x * pair[0]

    x, y = torch.randn(4, 3), torch.randn(4, 3)
    return {
        "block (0, None)": (
            lambda: fd.vmap(block, in_dims=(0, None))(ens, td),
            lambda: torch.func.vmap(block, in_dims=(0, None))(ens, td),
        ),
        "container {'params': 0, 'td': None}": (
            lambda: fd.vmap(boxed, in_dims=({"params": 0, "td": None},))(box),
            lambda: torch.func.vmap(block, in_dims=(0, None))(box["params"], box["td"]),
        ),
        "tensors (0, (0, None))": (
            lambda: fd.vmap(tensors, in_dims=(0, (0, None)))(x, (y, None)),
            lambda: torch.func.vmap(tensors, in_dims=(0, (0, None)))(x, (y, None)),
        ),
    }


def main() -> None:
    torch.set_num_threads(1)
    best: dict[tuple[str, int], float] = {}
    runs = cases()
    with torch.no_grad():
        for _ in range(ROUNDS):
            for name, fns in runs.items():
                for i, fn in enumerate(fns):
                    t = clock_us(fn, RUN_TIME)
                    best[name, i] = min(best.get((name, i), t), t)
    rows = [[name, best[name, 0], best[name, 1], best[name, 0] / best[name, 1]] for name in runs]
    print(machine())
    print(table(["case", "fd.vmap µs", "torch.func.vmap µs", "ratio"], rows))


if __name__ == "__main__":
    main()
