"""The tensordict tutorial's residual block: functd against its peers, one run.

Rows: plain nn.Module, a hand-written pure F.linear function,
torch.func.functional_call, tensordict's TensorDictSequential (td call and
keyword call, when tensordict is installed) and functd's Sequential (td call
and keyword call), eager and torch.compile'd, at batch 1 and 256. Then the
per-module overhead of a chain of 1, 4 and 16 cheap modules.

Run: .venv/bin/python benchmarks/tutorial_block.py
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from _common import machine, median_us, table

import functd as fd

COMPILE = os.environ.get("BENCH_COMPILE", "1") == "1"


class ResidualBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear0 = nn.Linear(3, 128)
        self.linear1 = nn.Linear(128, 128)
        self.linear2 = nn.Linear(128, 3)

    def forward(self, x):
        y = torch.relu(self.linear0(x))
        y = torch.relu(self.linear1(y))
        return self.linear2(y) + x


def pure_block(p, x):
    h = torch.relu(F.linear(x, p["linear0.weight"], p["linear0.bias"]))
    h = torch.relu(F.linear(h, p["linear1.weight"], p["linear1.bias"]))
    return F.linear(h, p["linear2.weight"], p["linear2.bias"]) + x


def functd_block(ref):
    block = fd.Sequential(
        fd.Module(ref.linear0, ["x"], ["linear0"]),
        fd.Module(torch.relu, ["linear0"], ["relu0"]),
        fd.Module(ref.linear1, ["relu0"], ["linear1"]),
        fd.Module(nn.ReLU(), ["linear1"], ["relu1"]),
        fd.Module(ref.linear2, ["relu1"], ["linear2"]),
        fd.Module(lambda x, y: x + y, ["x", "linear2"], ["y"]),
        selected_out_keys=["y"],
    )
    return block, fd.from_module(block)


def tensordict_block(ref):
    try:
        from tensordict.nn import TensorDictModule as M
        from tensordict.nn import TensorDictSequential
    except ImportError:
        return None
    return TensorDictSequential(
        M(ref.linear0, ["x"], ["linear0"]),
        M(torch.relu, ["linear0"], ["relu0"]),
        M(ref.linear1, ["relu0"], ["linear1"]),
        M(nn.ReLU(), ["linear1"], ["relu1"]),
        M(ref.linear2, ["relu1"], ["linear2"]),
        M(lambda x, y: x + y, ["x", "linear2"], ["y"]),
        selected_out_keys=["y"],
    )


def cases(batch: int):
    torch.manual_seed(0)
    ref = ResidualBlock()
    x = torch.randn(batch, 3)
    flat = {k: v.detach() for k, v in ref.state_dict().items()}
    block, params = functd_block(ref)
    td = fd.TensorDict({"x": x}, [batch])
    out = {
        "nn.Module": (ref, lambda f: f(x)),
        "hand-written F.linear": (pure_block, lambda f: f(flat, x)),
        "functional_call": (
            lambda p, x: torch.func.functional_call(ref, p, (x,)),
            lambda f: f(flat, x),
        ),
        "functd Sequential (td)": (block, lambda f: f(params, td)),
        "functd Sequential (kw)": (block, lambda f: f(params, x=x)),
    }
    tdm = tensordict_block(ref)
    if tdm is not None:
        from tensordict import TensorDict

        ttd = TensorDict({"x": x}, [batch])
        out["tensordict Sequential (td)"] = (tdm, lambda f: f(ttd.copy()))
        out["tensordict Sequential (kw)"] = (tdm, lambda f: f(x=x))
    with torch.no_grad():
        expect = ref(x)
        torch.testing.assert_close(block(params, x=x), expect)
    return out


def run_block(grad: bool):
    results = {}
    for batch in (1, 256):
        for name, (fn, call) in cases(batch).items():
            with torch.set_grad_enabled(grad):
                eager = median_us(lambda fn=fn, call=call: call(fn))
                comp = float("nan")
                if COMPILE:
                    torch._dynamo.reset()
                    cf = torch.compile(fn)
                    for _ in range(3):
                        call(cf)
                    comp = median_us(lambda cf=cf, call=call: call(cf))
            results[(name, batch)] = (eager, comp)
    rows = []
    for batch in (1, 256):
        hand_e, hand_c = results[("hand-written F.linear", batch)]
        for (name, b), (e, c) in results.items():
            if b == batch:
                rows.append([name, batch, e, c, e / hand_e, c / hand_c])
    print(
        table(
            ["version", "batch", "eager µs", "compiled µs", "eager / hand", "compiled / hand"],
            rows,
        )
    )
    return results


def run_overhead():
    """µs per extra module in a chain of cheap modules (torch.neg on a [1, 3] tensor)."""
    x = torch.randn(1, 3)
    rows = []
    per = {}
    for n in (1, 4, 16):
        keys = [f"k{i}" for i in range(n + 1)]
        seq = fd.Sequential(*[fd.Module(torch.neg, [keys[i]], [keys[i + 1]]) for i in range(n)])
        td = fd.TensorDict({"k0": x}, [1])
        t_fd = median_us(lambda seq=seq, td=td: seq(None, td))

        def plain(x=x, n=n):
            for _ in range(n):
                x = torch.neg(x)
            return x

        t_plain = median_us(plain)
        row = [n, t_fd, t_plain]
        try:
            from tensordict import TensorDict
            from tensordict.nn import TensorDictModule, TensorDictSequential

            tseq = TensorDictSequential(
                *[TensorDictModule(torch.neg, [keys[i]], [keys[i + 1]]) for i in range(n)]
            )
            ttd = TensorDict({"k0": x}, [1])
            row.append(median_us(lambda tseq=tseq, ttd=ttd: tseq(ttd.copy())))
        except ImportError:
            row.append(float("nan"))
        per[n] = row
        rows.append(row)
    print(table(["modules", "functd µs", "plain loop µs", "tensordict µs"], rows))
    fd_per = (per[16][1] - per[1][1]) / 15 - (per[16][2] - per[1][2]) / 15
    td_per = (per[16][3] - per[1][3]) / 15 - (per[16][2] - per[1][2]) / 15
    print(
        f"\nper-module overhead beyond the op: functd {fd_per:.2f} µs, tensordict {td_per:.2f} µs"
    )
    return fd_per, td_per


def main():
    print(f"# tutorial block ({machine()})\n")
    print("## no_grad\n")
    report(run_block(grad=False))
    print("\n## grad enabled (as the tutorial's Timer runs)\n")
    report(run_block(grad=True))
    print("\n## per-module overhead (no_grad)\n")
    with torch.no_grad():
        run_overhead()


def report(results):
    e_fd, c_fd = results[("functd Sequential (td)", 1)]
    e_h, c_h = results[("hand-written F.linear", 1)]
    print("\ntargets at batch 1:")
    print(
        f"  eager functd <= 1.25x hand-written: {e_fd / e_h:.2f}x -> {'met' if e_fd <= 1.25 * e_h else 'MISSED'}"
    )
    if COMPILE:
        print(
            f"  compiled functd <= 1.05x compiled hand-written: {c_fd / c_h:.2f}x -> {'met' if c_fd <= 1.05 * c_h else 'MISSED'}"
        )
    if ("tensordict Sequential (td)", 1) in results:
        e_t = results[("tensordict Sequential (td)", 1)][0]
        print(
            f"  eager >= 3x faster than tensordict: {e_t / e_fd:.2f}x -> {'met' if e_t >= 3 * e_fd else 'MISSED'}"
        )
    e_m = results[("nn.Module", 1)][0]
    print(f"  ahead of plain nn.Module: {e_m / e_fd:.2f}x -> {'met' if e_fd < e_m else 'MISSED'}")


if __name__ == "__main__":
    main()
