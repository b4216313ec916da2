"""CUDA graphs on the tutorial block at batch 1: functd eager, torch.compile'd,
fd.cuda_graph, and tensordict's CudaGraphModule, in one run (no_grad).

Targets: fd.cuda_graph >= 3x faster than functd eager, and no slower than
tensordict's CudaGraphModule. Without CUDA it prints "skipped: no CUDA" and exits 0.
``BENCH_DEVICE=cpu`` forces a smoke run on the CPU (every row then runs eagerly;
the figures mean nothing, the run checks that the script works).

Run: .venv/bin/python benchmarks/cuda_graph.py
"""

from __future__ import annotations

import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import machine, median_us, table
from tutorial_block import ResidualBlock, functd_block, tensordict_block

import functd as fd

BATCH = 1
COMPILE = os.environ.get("BENCH_COMPILE", "1") == "1"


def cases(device: torch.device) -> dict:
    torch.manual_seed(0)
    ref = ResidualBlock().to(device)
    block, params = functd_block(ref)
    params = params.apply(lambda v: v.detach())  # inputs of a graph must not require grad
    x = torch.randn(BATCH, 3, device=device)
    td = fd.TensorDict({"x": x}, [BATCH])
    out = {
        "nn.Module eager": lambda: ref(x),
        "functd eager": lambda: block(params, td),
    }
    if COMPILE:
        torch._dynamo.reset()
        compiled = torch.compile(block, fullgraph=True)
        out["functd torch.compile"] = lambda: compiled(params, td)
        if device.type == "cuda":
            ro = torch.compile(block, mode="reduce-overhead", fullgraph=True)
            out["functd torch.compile(reduce-overhead)"] = lambda: ro(params, td)
    graphed = fd.cuda_graph(block, warmup=2)
    out["functd fd.cuda_graph"] = lambda: graphed(params, td)
    if COMPILE:
        graphed_c = fd.cuda_graph(compiled, warmup=3)
        out["functd fd.cuda_graph(torch.compile)"] = lambda: graphed_c(params, td)
    tdm = tensordict_block(ref)
    if tdm is not None:
        from tensordict import TensorDict
        from tensordict.nn import CudaGraphModule

        ttd = TensorDict({"x": x}, [BATCH], device=device)
        cgm = CudaGraphModule(tdm, warmup=2)
        out["tensordict CudaGraphModule"] = lambda: cgm(ttd)
        out["tensordict eager"] = lambda: tdm(ttd.copy())
    # every version gives the reference's numbers; a version that fails is reported
    checked = {}
    with torch.no_grad():
        expect = ref(x)
        for name, fn in out.items():
            try:
                for _ in range(4):  # past warm-up and recording
                    got = fn()
                y = got if isinstance(got, torch.Tensor) else got["y"]
                torch.testing.assert_close(y, expect)
            except Exception as e:
                print(f"{name}: FAILED: {type(e).__name__}: {str(e)[:300]}")
                continue
            checked[name] = fn
    return checked


def main() -> int:
    forced = os.environ.get("BENCH_DEVICE")
    if forced is None and not torch.cuda.is_available():
        print("skipped: no CUDA")
        return 0
    device = torch.device(forced or "cuda")
    print(f"# CUDA graphs: tutorial block, batch {BATCH}, no_grad ({machine()}, {device})\n")
    if device.type != "cuda":
        print("smoke run on the CPU: no graph is recorded, the figures mean nothing\n")
        warnings.simplefilter("ignore")
    results = {}
    with torch.no_grad():
        for name, fn in cases(device).items():
            results[name] = median_us(fn)
    eager = results["functd eager"]
    rows = [[name, t, eager / t] for name, t in results.items()]
    print(table(["version", "µs per call", "speed-up over functd eager"], rows))
    if "functd fd.cuda_graph" not in results:
        return 1
    cg = results["functd fd.cuda_graph"]
    print("\ntargets:")
    print(
        f"  fd.cuda_graph >= 3x faster than eager: {eager / cg:.2f}x -> "
        f"{'met' if eager >= 3 * cg else 'MISSED'}"
    )
    if "tensordict CudaGraphModule" in results:
        t = results["tensordict CudaGraphModule"]
        print(
            f"  fd.cuda_graph no slower than CudaGraphModule: {t / cg:.2f}x -> "
            f"{'met' if cg <= t else 'MISSED'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
