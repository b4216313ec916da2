"""RNN/GRU/LSTM: torch's module against functd's pure layer, both of its paths, one run.

Rows per config: ``nn.LSTM``/``nn.GRU`` eager (torch's fused op), functd's
layer on plain eager CPU tensors (the fused path: ``torch._VF`` per stack),
functd's layer through its Python loop over time (the path ``vmap`` and
``torch.compile`` take; forced here by switching the plain-tensor test off),
forward and forward + backward, grad mode on. Then an ensemble of 4: a loop
over 4 torch modules against ``fd.vmap`` of the layer (the loop path).

Run: .venv/bin/python benchmarks/rnn.py   (BENCH_MIN_RUN_TIME=0.1 for a quick run)
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
from _common import machine, median_us, table

import functd as fd
from functd.nn import _rnn

CONFIGS = [
    ("LSTM", dict(input_size=16, hidden_size=32, num_layers=1), (16, 8)),
    ("LSTM", dict(input_size=16, hidden_size=64, num_layers=2, bidirectional=True), (32, 16)),
    ("GRU", dict(input_size=16, hidden_size=64, num_layers=2), (32, 16)),
]


def loop_path(fn):
    """``fn`` with the fused path switched off (the loop that vmap and compile run)."""

    def call():
        saved, _rnn.plain = _rnn.plain, lambda tensors: False
        try:
            return fn()
        finally:
            _rnn.plain = saved

    return call


def rows_for(kind: str, kw: dict, shape: tuple[int, int]) -> list[list]:
    torch.manual_seed(0)
    m = getattr(nn, kind)(**kw)
    layer = fd.nn.lower(m)
    params = fd.from_module(m).clone()
    x = torch.randn(shape[0], shape[1], kw["input_size"])  # (L, N, input_size)
    xg = x.clone().requires_grad_()
    name = f"{kind} {kw['hidden_size']}x{kw['num_layers']}{' bi' if kw.get('bidirectional') else ''} L,N={list(shape)}"
    t_nn = median_us(lambda: m(x))
    t_fu = median_us(lambda: layer(params, x))
    t_lo = median_us(loop_path(lambda: layer(params, x)))
    t_nn_b = median_us(lambda: m(xg)[0].sum().backward())
    t_fu_b = median_us(lambda: layer(params, xg)[0].sum().backward())
    t_lo_b = median_us(loop_path(lambda: layer(params, xg)[0].sum().backward()))
    return [
        [name, "fwd", t_nn, t_fu, t_lo, t_fu / t_nn, t_lo / t_nn],
        [name, "fwd+bwd", t_nn_b, t_fu_b, t_lo_b, t_fu_b / t_nn_b, t_lo_b / t_nn_b],
    ]


def ensemble_row() -> list:
    torch.manual_seed(0)
    kw = dict(input_size=16, hidden_size=32)
    mods = [nn.LSTM(**kw) for _ in range(4)]
    layer = fd.nn.lower(mods[0])
    ens = fd.stack([fd.from_module(m) for m in mods])
    x = torch.randn(16, 8, 16)
    run = fd.vmap(layer, in_dims=(0, None))
    t_nn = median_us(lambda: [m(x) for m in mods])
    t_fd = median_us(lambda: run(ens, x))
    return [
        "4 x LSTM 32 L,N=[16, 8]",
        "ensemble fwd",
        t_nn,
        float("nan"),
        t_fd,
        float("nan"),
        t_fd / t_nn,
    ]


def main() -> None:
    print(f"# RNN layers ({machine()})\n")
    rows = []
    for kind, kw, shape in CONFIGS:
        rows += rows_for(kind, kw, shape)
    rows.append(ensemble_row())
    header = ["config", "pass", "torch µs", "fused µs", "loop µs", "fused/torch", "loop/torch"]
    print(table(header, rows))


if __name__ == "__main__":
    main()
