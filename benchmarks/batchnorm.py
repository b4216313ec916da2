"""BatchNorm: functd's pure layer (returns new statistics) against its peers, one run.

Rows per input shape: ``nn.BatchNorm*`` (writes its buffers), the same module
through ``torch.func.functional_call`` with cloned buffers (the peer way to stay
pure), and ``functd.nn.BatchNorm*`` (returns ``(y, new_state)``); in training
mode (forward, and forward + backward) and in eval mode. Then a Linear ->
BatchNorm1d -> ReLU model's training forward through ``fd.Sequential.apply_with_state``.

Run: .venv/bin/python benchmarks/batchnorm.py   (BENCH_MIN_RUN_TIME=0.1 for a quick run)
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
from _common import machine, median_us, table

import functd as fd


def rows_for(cls: type, shape: tuple[int, ...]) -> list[list]:
    torch.manual_seed(0)
    x = torch.randn(*shape)
    xg = x.clone().requires_grad_()
    bn = cls(shape[1])
    layer = fd.nn.lower(bn)
    ev = fd.nn.eval_mode(layer)
    params = fd.from_module(bn).clone()
    buffers = {k: v.clone() for k, v in bn.state_dict().items()}

    def peer(inp):
        state = {k: v.clone() for k, v in buffers.items()}  # else the call writes them
        return torch.func.functional_call(bn, state, (inp,))

    out = []
    with torch.no_grad():
        t_nn = median_us(lambda: bn(x))
        t_fc = median_us(lambda: peer(x))
        t_fd = median_us(lambda: layer(params, x))
    t_nn_b = median_us(lambda: bn(xg).sum().backward())
    t_fc_b = median_us(lambda: peer(xg).sum().backward())
    t_fd_b = median_us(lambda: layer(params, xg)[0].sum().backward())
    bn.eval()
    with torch.no_grad():
        t_nn_e = median_us(lambda: bn(x))
        t_fd_e = median_us(lambda: ev(params, x))
    name = f"{cls.__name__} {list(shape)}"
    out.append([name, "train fwd", t_nn, t_fc, t_fd, t_fd / t_nn])
    out.append([name, "train fwd+bwd", t_nn_b, t_fc_b, t_fd_b, t_fd_b / t_nn_b])
    out.append([name, "eval fwd", t_nn_e, float("nan"), t_fd_e, t_fd_e / t_nn_e])
    return out


def model_row() -> list:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 128), nn.BatchNorm1d(128), nn.ReLU())
    seq = fd.Sequential(
        fd.Module(net[0], ["x"], ["h"]),
        fd.Module(net[1], ["h"], ["h"]),
        fd.Module(net[2], ["h"], ["y"]),
    )
    params = fd.from_module(seq).clone()
    x = torch.randn(64, 64)
    td = fd.TensorDict({"x": x}, [64])
    with torch.no_grad():
        t_nn = median_us(lambda: net(x))
        t_fd = median_us(lambda: seq.apply_with_state(params, td))
    return ["Linear>BN1d>ReLU [64, 64]", "train fwd", t_nn, float("nan"), t_fd, t_fd / t_nn]


def main() -> None:
    print(f"# BatchNorm ({machine()})\n")
    rows = []
    for cls, shape in [(nn.BatchNorm1d, (64, 256)), (nn.BatchNorm2d, (32, 16, 16, 16))]:
        rows += rows_for(cls, shape)
    rows.append(model_row())
    header = ["case", "what", "nn.Module µs", "functional_call µs", "functd µs", "functd / nn"]
    print(table(header, rows))


if __name__ == "__main__":
    main()
