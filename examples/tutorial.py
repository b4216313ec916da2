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
import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from _timing import interleaved

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


def median_ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b))


def runtime_table(small: fd.Sequential, params: fd.TensorDict) -> None:
    """The table, on one thread: OpenMP's threads on a shared machine wait on each other,
    and the figures would measure the load (inductor fixes the count when it compiles).
    Under no_grad: the nn.Module's weights require grad, functd's params do not, and
    every row should time the same work (inference, no autograd graph)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            _runtime_table(small, params)
    finally:
        torch.set_num_threads(threads)


def _runtime_table(small: fd.Sequential, params: fd.TensorDict) -> None:
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

    time_and_print(rows, fns)


def time_and_print(rows: dict[str, Callable[..., Any]], fns: dict[str, Any]) -> None:
    """Time every row eager and compiled, all taking turns, and print the table."""
    compiled_fns = {}
    for name, make in rows.items():
        compiled_fns[name] = make(torch.compile(fns[name]))
        for _ in range(3):
            compiled_fns[name]()
    rounds, block = (31, 0.005) if QUICK else (61, 0.01)
    calls = {(name, False): make(fns[name]) for name, make in rows.items()}
    calls.update({(name, True): fn for name, fn in compiled_fns.items()})
    times = interleaved(calls, rounds, block)  # eager and compiled rows all take turns
    eager = {name: times[name, False] for name in rows}
    compiled = {name: times[name, True] for name in rows}

    print(f"\n## Runtime (batch 256, inference, 1 thread; CPU time, median of {rounds} rounds)")
    print(f"| {'version':36} | eager µs | compiled µs | eager / nn.Module |")
    print(f"|{'-' * 38}|---------:|------------:|------------------:|")
    base = eager["nn.Module"]
    for name in rows:
        e, c = statistics.median(eager[name]) * 1e6, statistics.median(compiled[name]) * 1e6
        r = median_ratio(eager[name], base)
        print(f"| {name:36} | {e:8.1f} | {c:11.1f} | {r:17.2f} |")
    print(
        "\nThe numbers come from this machine, now; the versions take turns in every round, "
        "so the\nratio column (the median of the per-round ratios) holds under load. The "
        "benchmarks in\nbenchmarks/ measure more cases (notes/performance.md)."
    )
    slower = [n for n in rows if median_ratio(compiled[n], eager[n]) > 1]
    if slower:
        print(
            f"Compiled is slower than eager here for {len(slower)} of {len(rows)} versions: the "
            "work is three\nsmall matmuls, which compiled code hands to the same BLAS "
            "routines, so there is little\nto fuse, and each compiled call adds its guard "
            "checks and wrapper. torch.compile pays off\non larger graphs with elementwise "
            "work to fuse (see benchmarks/)."
        )


def main() -> None:
    _, small, params = walkthrough()
    runtime_table(small, params)
    print("\n## Working with distributions (examples/probabilistic_policy.py)")
    import probabilistic_policy  # the tutorial's GRU policy, with explicit keys

    probabilistic_policy.main()


if __name__ == "__main__":
    main()
