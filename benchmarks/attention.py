"""MultiheadAttention: functd's lowered layer against nn.MultiheadAttention, one run.

Time rows (self-attention, batch_first, 4 heads; batch 1/32, seq 16/128, E 64/256):
- "default": torch ``m(x, x, x)`` (need_weights=True), grad mode on, the module's
  parameters requiring grad as users have them; functd ``fd.Module(m, in_keys=["x",
  "x", "x"], out_keys=["y", "w"])`` called on a TensorDict built inside the timed call
  (params from ``fd.from_module``, which do not require grad).
- "need_weights=False": torch ``m(x, x, x, need_weights=False)``; functd the lowered
  layer ``layer(params, x, x, x, need_weights=False)`` (a static call option: fd.Module
  has no way to pass one).
- "inference": ``m.eval()`` under ``torch.no_grad()``, need_weights=False, where torch
  takes its native fused path (``torch._native_multi_head_attention``); functd the
  eval-mode layer.
- "fwd+bwd": ``m(x, x, x)[0].sum().backward()`` against the layer's forward and
  ``torch.autograd.grad`` over params that require grad (the eager path of
  ``fd.train_step``); informational.

Memory rows: an ensemble of 8 members on shared inputs, torch's
``torch.func.stack_module_state`` + ``vmap(functional_call)`` against
``fd.vmap(lambda p: layer(p, x, x, x, ...))`` over ``fd.stack`` of the members'
params; forward (grad mode on) and forward+backward (``torch.func.grad`` of the
summed output, both sides). Peak = the highest running total of the CPU allocator's
allocations minus frees during the call, read from ``torch.profiler``
(``profile_memory=True``) memory events: exact bytes of torch tensors, allocator
caching aside (CPU has none).

Inference row (issue 38): self-attention ``m.eval()`` under ``torch.no_grad()``,
batch_first, N=8 L=16 E=64, 4 heads, where torch takes ``_native_multi_head_attention``:
torch ``m(x, x, x)`` (need_weights True and False) against the eval-mode lowered layer
and ``fd.Module`` on a TensorDict; BENCH_ROUNDS interleaved rounds, the median of
the rounds' times and of their per-round ratios (target <= 1.1x). Only this table:
``.venv/bin/python benchmarks/attention.py inference``.

Targets (issue 20): functd/torch <= 1.1x eager time, <= 1.25x ensemble memory.
Times are the best of BENCH_ROUNDS interleaved medians of this process's CPU time
with BENCH_THREADS=1 (BENCH_CLOCK=wall for wall time).

Run: .venv/bin/python benchmarks/attention.py   (BENCH_QUICK=1: fewer rows)
"""

from __future__ import annotations

import copy
import os
import sys
import warnings

import torch
import torch.nn as nn
from torch.func import functional_call, stack_module_state

sys.path.insert(0, os.path.dirname(__file__))
from _common import CLOCK, THREADS, clock_us, machine, peak_mib, table

import functd as fd

QUICK = os.environ.get("BENCH_QUICK", "0") == "1"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
RUN_TIME = float(os.environ.get("BENCH_MIN_RUN_TIME", "0.1"))
HEADS = 4
SHAPES = [(n, L, e) for n in (1, 32) for L in (16, 128) for e in (64, 256)]
if QUICK:
    SHAPES = [(1, 16, 64), (32, 128, 256)]
MEMBERS = 8
MEM_SHAPES = [(32, 16, 64), (8, 128, 256)]
# torch's CPU flash kernel has no vmap batching rule: its ensemble loops (and warns)
warnings.filterwarnings("ignore", message="There is a performance drop")


def time_cases(n: int, L: int, e: int) -> dict:
    """row name -> (torch fn, functd fn), checked equal first."""
    torch.manual_seed(0)
    m = nn.MultiheadAttention(e, HEADS, batch_first=True)
    x = torch.randn(n, L, e)
    mod = fd.Module(m, in_keys=["x", "x", "x"], out_keys=["y", "w"])
    params = fd.from_module(mod)
    layer = fd.nn.lower(m)
    ev_m, ev_layer = copy.deepcopy(m).eval(), fd.nn.eval_mode(layer)
    grad_params = params.apply(lambda t: t.clone().requires_grad_())
    names = [tuple(name.split(".")) for name, _ in m.named_parameters()]
    leaves = [grad_params[name] for name in names]  # in torch's order
    torch_leaves = list(m.parameters())

    def fd_default():
        return mod(params, fd.TensorDict({"x": x}, [n]))

    def torch_bwd():
        m(x, x, x)[0].sum().backward()

    def fd_bwd():
        return torch.autograd.grad(layer(grad_params, x, x, x)[0].sum(), leaves)

    out = fd_default()
    ref = m(x, x, x)
    torch.testing.assert_close(out["y"], ref[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out["w"], ref[1], rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(ev_layer(params, x, x, x, need_weights=False)[0],
                                   ev_m(x, x, x, need_weights=False)[0], rtol=1e-4, atol=1e-5)  # fmt: skip
    torch.testing.assert_close(fd_bwd()[0], torch.autograd.grad(m(x, x, x)[0].sum(), torch_leaves)[0],
                               rtol=1e-4, atol=1e-4)  # fmt: skip

    def no_grad(f):
        def run():
            with torch.no_grad():
                return f()

        return run

    return {
        "default": (lambda: m(x, x, x), fd_default),
        "need_weights=False": (
            lambda: m(x, x, x, need_weights=False),
            lambda: layer(params, x, x, x, need_weights=False),
        ),
        "inference": (
            no_grad(lambda: ev_m(x, x, x, need_weights=False)),
            no_grad(lambda: ev_layer(params, x, x, x, need_weights=False)),
        ),
        "fwd+bwd": (torch_bwd, fd_bwd),
    }


def time_rows() -> list[list]:
    cases = {s: time_cases(*s) for s in SHAPES}
    best: dict = {}
    for _ in range(ROUNDS):  # interleaved: each round measures every version once
        for s, rows in cases.items():
            for name, fns in rows.items():
                for who, fn in zip(("torch", "functd"), fns):
                    t = clock_us(fn, RUN_TIME)
                    best[(s, name, who)] = min(best.get((s, name, who), float("inf")), t)
    out = []
    for s, rows in cases.items():
        for name in rows:
            t, f = best[(s, name, "torch")], best[(s, name, "functd")]
            out.append([f"N={s[0]} L={s[1]} E={s[2]}", name, t, f, f / t])
    return out


# ------------------------------------------------------------------- inference
INFER_SHAPE = (8, 16, 64)


def _yw(td: fd.TensorDict) -> tuple:
    return td["y"], td["w"]


def inference_cases() -> dict:
    """call -> (torch fn, functd fn) for the eval no_grad self-attention, checked equal."""
    n, L, e = INFER_SHAPE
    torch.manual_seed(0)
    m = nn.MultiheadAttention(e, HEADS, batch_first=True).eval()
    x = torch.randn(n, L, e)
    layer, params = fd.nn.lower(m), fd.from_module(m)
    mod = fd.Module(m, in_keys=["x", "x", "x"], out_keys=["y", "w"])
    cases = {
        "layer, need_weights=True": (lambda: m(x, x, x), lambda: layer(params, x, x, x)),
        "layer, need_weights=False": (
            lambda: m(x, x, x, need_weights=False),
            lambda: layer(params, x, x, x, need_weights=False),
        ),
        "fd.Module (TensorDict)": (
            lambda: m(x, x, x),
            lambda: _yw(mod(params, fd.TensorDict({"x": x}, [n]))),
        ),
    }
    with torch.no_grad():
        for t_fn, f_fn in cases.values():
            for a, b in zip(f_fn(), t_fn()):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    return cases


def inference_rows() -> list[list]:
    import statistics

    cases = inference_cases()
    times: dict = {}
    with torch.no_grad():
        for _ in range(ROUNDS):  # interleaved: each round measures torch then functd once
            for name, fns in cases.items():
                t, f = (clock_us(fn, RUN_TIME) for fn in fns)
                times.setdefault(name, []).append((t, f, f / t))
    out = []
    for name, ts in times.items():
        t, f, ratio = (statistics.median(col) for col in zip(*ts))
        out.append([f"N={INFER_SHAPE[0]} L={INFER_SHAPE[1]} E={INFER_SHAPE[2]}", name, t, f, ratio])
    return out


def inference_main() -> None:
    torch.set_num_threads(THREADS)
    clock = "CPU time (process clock)" if CLOCK == "process" else "wall time"
    print(f"# MultiheadAttention inference, eval + no_grad ({machine()}); {clock}, "
          f"medians of {ROUNDS} interleaved rounds; load {os.getloadavg()[0]:.2f}\n")  # fmt: skip
    rows = inference_rows()
    header = ["case", "call", "torch µs", "functd µs", "functd / torch (median of rounds)"]
    print(table(header, rows))
    worst = max(r[4] for r in rows)
    print(f"\ntarget functd/torch <= 1.1x: worst {worst:.2f}x "
          f"({'met' if worst <= 1.1 else 'MISSED'})")  # fmt: skip


# ---------------------------------------------------------------------- memory
def memory_rows() -> list[list]:
    rows = []
    for n, L, e in MEM_SHAPES:
        for batch_first in (True, False):
            for need_weights in (True, False):
                rows.append(memory_row(n, L, e, batch_first, need_weights))
    return rows


def memory_row(n: int, L: int, e: int, batch_first: bool, need_weights: bool) -> list:
    torch.manual_seed(0)
    nets = [nn.MultiheadAttention(e, HEADS, batch_first=batch_first) for _ in range(MEMBERS)]
    x = torch.randn(n, L, e) if batch_first else torch.randn(L, n, e)
    stacked, _ = stack_module_state(nets)  # requires grad, as torch's tutorial has it
    base = copy.deepcopy(nets[0]).to("meta")

    def t_member(p, x):
        return functional_call(base, p, (x, x, x), {"need_weights": need_weights})[0]

    t_fwd = torch.func.vmap(t_member, in_dims=(0, None))
    t_grad = torch.func.grad(lambda p: t_fwd(p, x).sum())
    layer = fd.nn.lower(nets[0])
    ens = fd.stack([fd.from_module(net) for net in nets])
    f_fwd = fd.vmap(lambda p, x: layer(p, x, x, x, need_weights=need_weights)[0], in_dims=(0, None))
    f_grad = fd.grad(lambda p: f_fwd(p, x).sum())
    torch.testing.assert_close(f_fwd(ens, x), t_fwd(stacked, x), rtol=1e-4, atol=1e-5)
    tf, ff = peak_mib(lambda: t_fwd(stacked, x)), peak_mib(lambda: f_fwd(ens, x))
    tb, fb = peak_mib(lambda: t_grad(stacked)), peak_mib(lambda: f_grad(ens))
    name = f"{MEMBERS} x N={n} L={L} E={e} {'batch_first' if batch_first else '(L, N, E)'}"
    return [name, str(need_weights), tf, ff, ff / tf, tb, fb, fb / tb]


def main() -> None:
    torch.set_num_threads(THREADS)
    clock = "CPU time (process clock)" if CLOCK == "process" else "wall time"
    print(f"# MultiheadAttention ({machine()}); {clock}, best median of {ROUNDS} rounds\n")
    rows = time_rows()
    print(table(["case", "call", "torch µs", "functd µs", "functd / torch"], rows))
    print("\n## inference: eval + no_grad, torch's native fused path (medians of rounds)\n")
    infer = inference_rows()
    print(table(["case", "call", "torch µs", "functd µs", "functd / torch"], infer))
    rows += infer
    print("\n## ensemble memory (peak MiB during the call)\n")
    mem = memory_rows()
    header = ["ensemble", "need_weights", "torch fwd", "functd fwd", "ratio",
              "torch fwd+bwd", "functd fwd+bwd", "ratio"]  # fmt: skip
    print(table(header, mem))
    eager = [r[4] for r in rows if r[1] != "fwd+bwd"]
    mems = [v for r in mem for v in (r[4], r[7])]
    print("\ntargets:")
    print(f"  eager functd/torch <= 1.1x: worst {max(eager):.2f}x "
          f"({'met' if max(eager) <= 1.1 else 'MISSED'})")  # fmt: skip
    print(f"  ensemble memory functd/torch <= 1.25x: worst {max(mems):.2f}x "
          f"({'met' if max(mems) <= 1.25 else 'MISSED'})")  # fmt: skip


if __name__ == "__main__":
    inference_main() if sys.argv[1:] == ["inference"] else main()
