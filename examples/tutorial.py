"""The tensordict.nn tutorial's residual block, re-told in pure functions.

Every step of "Building models with TensorDictModule" has its functd
counterpart: functions as modules, chaining, several input keys, keeping only
some outputs, keyword calls, and the runtime table. The difference: a module
call never changes its input; it returns a new TensorDict, and the parameters
are an explicit TensorDict.

Run with `make demo` (QUICK=1 shortens the timings).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.benchmark import Timer

import functd as fd

QUICK = os.environ.get("QUICK", "0") == "1"


def step(title: str, td: fd.TensorDict) -> None:
    print(f"\n## {title}\n{td}")


def walkthrough() -> tuple[fd.Sequential, fd.Sequential, fd.TensorDict]:
    key = fd.random.key(0)
    td = fd.TensorDict({"x": torch.randn(5, 3)}, batch_size=[5])
    step("The input", td)

    # A module reads "x" and writes "linear0" into a NEW tensordict.
    linear0 = fd.Module(nn.Linear(3, 128), in_keys=["x"], out_keys=["linear0"])
    params0 = linear0.init(key)
    out = linear0(params0, td)
    assert "linear0" in out and "linear0" not in td  # the input is unchanged
    step("linear0(params, td): a new tensordict; td is unchanged", out)

    # Functions as modules: any callable, no parameters.
    relu0 = fd.Module(torch.relu, in_keys=["linear0"], out_keys=["relu0"])

    # Chaining: composition of pure functions.
    block0 = fd.Sequential(linear0, relu0)  # also: linear0 >> relu0
    out = block0(block0.init(key), td)
    step("Sequential(linear0, relu0)", out)

    linear1 = fd.Module(nn.Linear(128, 128), in_keys=["relu0"], out_keys=["linear1"])
    relu1 = fd.Module(nn.ReLU(), in_keys=["linear1"], out_keys=["relu1"])
    linear2 = fd.Module(nn.Linear(128, 3), in_keys=["relu1"], out_keys=["linear2"])
    block1 = linear1 >> relu1 >> linear2

    # Several input keys: a function with two arguments.
    residual = fd.Module(lambda x, y: x + y, in_keys=["x", "linear2"], out_keys=["y"])
    block = fd.Sequential(block0, block1, residual)  # nested Sequentials flatten
    params = block.init(key)
    print("\nparams of the block (nested by position):", params)
    out = block(params, td)
    step("the residual block", out)

    # Keeping only some outputs: a NEW module; `block` is unchanged.
    small = block.select_out_keys("y")
    td1 = fd.TensorDict({"x": torch.randn(1, 3)}, batch_size=[1])
    out = small(params, td1)
    assert "y" in out and "linear1" not in out and "x" in out
    assert block.selected_out_keys is None
    step("block.select_out_keys('y')", out)

    # Calling a module with tensors.
    y = small(params, x=torch.randn(1, 3))
    assert isinstance(y, torch.Tensor)
    print("\nsmall(params, x=x) ->", tuple(y.shape))

    # The weights the wrapped torch modules hold now, and back.
    assert fd.from_module(block).keys() == ("0", "2", "4")
    return block, small, params


class ResidualBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear0 = nn.Linear(3, 128)
        self.relu0 = nn.ReLU()
        self.linear1 = nn.Linear(128, 128)
        self.relu1 = nn.ReLU()
        self.linear2 = nn.Linear(128, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear0(x)
        y = self.relu0(y)
        y = self.linear1(y)
        y = self.relu1(y)
        out: torch.Tensor = self.linear2(y) + x
        return out


def pure_block(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The same block written by hand as a pure function of a dict of weights."""
    h = torch.relu(F.linear(x, p["0.weight"], p["0.bias"]))
    h = torch.relu(F.linear(h, p["2.weight"], p["2.bias"]))
    return F.linear(h, p["4.weight"], p["4.bias"]) + x


def median_us(fn: Callable[[], object]) -> float:
    t = Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.1 if QUICK else 0.5)
    return t.median * 1e6


def runtime_table(small: fd.Sequential, params: fd.TensorDict) -> None:
    x = torch.randn(256, 3)
    td = fd.TensorDict({"x": x}, batch_size=[256])
    ref = ResidualBlock()
    fd.to_module(
        fd.TensorDict(
            {
                "linear0": params["0"],
                "linear1": params["2"],
                "linear2": params["4"],
            }
        ),
        ref,
    )
    flat = {f"{k[0]}.{k[1]}": v for k, v in params.items(True, True)}
    torch.testing.assert_close(small(params, x=x), ref(x))
    torch.testing.assert_close(pure_block(flat, x), ref(x))

    rows: dict[str, Callable[[Callable[..., Any]], Callable[[], object]]] = {
        "nn.Module": lambda f: lambda: f(x),
        "hand-written pure function": lambda f: lambda: f(flat, x),
        "functd Sequential, td call": lambda f: lambda: f(params, td),
        "functd Sequential, keyword call": lambda f: lambda: f(params, x=x),
    }
    fns: dict[str, Callable[..., Any]] = {
        "nn.Module": ref,
        "hand-written pure function": pure_block,
        "functd Sequential, td call": small,
        "functd Sequential, keyword call": small,
    }
    try:
        from tensordict import TensorDict
        from tensordict.nn import TensorDictModule, TensorDictSequential

        tdm = TensorDictSequential(
            TensorDictModule(ref.linear0, ["x"], ["linear0"]),
            TensorDictModule(torch.relu, ["linear0"], ["relu0"]),
            TensorDictModule(ref.linear1, ["relu0"], ["linear1"]),
            TensorDictModule(nn.ReLU(), ["linear1"], ["relu1"]),
            TensorDictModule(ref.linear2, ["relu1"], ["linear2"]),
            TensorDictModule(lambda x, y: x + y, ["x", "linear2"], ["y"]),
            selected_out_keys=["y"],
        )
        ttd = TensorDict({"x": x}, batch_size=[256])
        rows["tensordict Sequential, td call"] = lambda f: lambda: f(ttd.copy())
        rows["tensordict Sequential, keyword call"] = lambda f: lambda: f(x=x)
        fns["tensordict Sequential, td call"] = tdm
        fns["tensordict Sequential, keyword call"] = tdm
    except ImportError:
        print("(tensordict not installed: its rows are skipped)")

    print("\n## Runtime (batch 256, median per call)")
    print(f"| {'version':36} | eager µs | compiled µs | eager / nn.Module |")
    print(f"|{'-' * 38}|---------:|------------:|------------------:|")
    base = None
    for name, make in rows.items():
        eager = median_us(make(fns[name]))
        compiled_fn = torch.compile(fns[name])
        call = make(compiled_fn)
        for _ in range(3):
            call()
        compiled = median_us(call)
        base = base or eager
        print(f"| {name:36} | {eager:8.1f} | {compiled:11.1f} | {eager / base:17.2f} |")
    print(
        "\nThe numbers come from this machine, now; the benchmarks in benchmarks/ "
        "measure more cases (notes/performance.md)."
    )


def main() -> None:
    _, small, params = walkthrough()
    runtime_table(small, params)
    print("\n## Working with distributions (examples/probabilistic_policy.py)")
    import probabilistic_policy  # the tutorial's GRU policy, with explicit keys

    probabilistic_policy.main()


if __name__ == "__main__":
    main()
