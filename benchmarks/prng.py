"""functd.random against torch's global generator: the PRNG targets of issues 11 and 22.

Rows: ``normal``/``uniform`` (float32) at 4, 1024 and 2**20 draws against
``torch.randn``/``torch.rand``; ``split(k, 2)`` and ``fold_in(k, 7)`` on a concrete
key; ``fd.vmap`` of ``normal``/``uniform(k, (128, 128))`` over 64 keys against a loop
of 64 eager draws (stacked, the same result); the first draw in a fresh process
against a later one there (no compiler: ``CC=/bin/false``, an empty home). functd's
fused kernel (the extension module ``functd._fused_ext``, notes/prng.md) and its pure
torch-op path (the fallback, ``FUNCTD_FUSED_RANDOM=0``) are timed side by side with
the peer, interleaved over rounds; each time is the best of the rounds' medians.
Targets: <= 25 µs up to 1024 draws; <= 1.5x torch.randn / <= 1.0x torch.rand at
2**20; split/fold_in <= 5 µs; vmapped <= 1.0x the loop; a first draw at most 0.05 s
above a later one, with no warning. The header names the CPU, its vector extensions
and the kernel variant serving. BENCH_DEVICE=cuda times the GPU (pure ops only).

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

import functd as fd
import functd.random as fr
from functd import _fused

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIRST = """
import json, time, torch
import functd.random as fr
k = fr.key(0)
t0 = time.perf_counter(); fr.normal(k, (1024,)); t1 = time.perf_counter()
later = min(
    (lambda t: (fr.normal(k, (1024,)), time.perf_counter() - t)[1])(time.perf_counter())
    for _ in range(20)
)
import functd._fused as f
print(json.dumps([t1 - t0, later, f.variant()]))
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


def cpu_flags() -> str:
    """The CPU's wide-vector extensions (what the kernel variants need)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "").split()
    except OSError:
        return "unknown"
    wide = [x for x in ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512vl") if x in flags]
    return " ".join(wide) + ("" if "avx512f" in flags else " (no AVX-512)")


def first_draw() -> tuple[float, float, str | None, str]:
    """A fresh process: its first ``normal(key, (1024,))``, a later one, the variant, stderr."""
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "CC": "/bin/false", "HOME": home, "XDG_CACHE_HOME": home}
        env["PYTHONPATH"] = ROOT
        out = subprocess.run(
            [sys.executable, "-c", FIRST], env=env, capture_output=True, text=True, check=True
        )
    first, later, variant = json.loads(out.stdout.strip().splitlines()[-1])
    return first, later, variant, out.stderr.strip()


def eager_rows(key) -> list:
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
    return rows


def vmap_rows(key) -> list:
    rows = []
    keys = fr.split(key, 64)
    for name, draw in [("normal", fr.normal), ("uniform", fr.uniform)]:
        batched = fd.vmap(lambda k, d=draw: d(k, (128, 128)))
        fns = {
            "fused": lambda b=batched: b(keys),
            "pure": pure(lambda b=batched: b(keys)),
            "peer": lambda d=draw: torch.stack([d(k, (128, 128)) for k in keys]),
        }
        t = best_of_rounds(fns)
        label = f"`fd.vmap({name}(k, (128, 128)))` over 64 keys vs a loop of 64 draws"
        rows.append([label, t["fused"], t["pure"], t["peer"], t["fused"] / t["peer"], "<= 1.0x"])
    return rows


def main() -> None:
    if not ON_GPU:
        torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    key = fr.key(0, device=DEVICE)
    fr.normal(fr.key(0), (4,))  # import the kernel outside the timings
    rows = eager_rows(key) + vmap_rows(key)
    if not ON_GPU:
        first, later, variant, err = first_draw()
        extra = f"{first - later:+.3f} s" + ("" if variant else " (no kernel!)")
        extra += f" (stderr: {err!r})" if err else ", no warning"
        label = "first draw vs a later one, fresh process, CC=/bin/false, empty home (s)"
        rows.append([label, round(first, 4), "—", round(later, 5), extra, "<= +0.05 s"])
    print(
        f"{machine()}, load {os.getloadavg()[0]:.1f}, best of {ROUNDS} interleaved medians\n"
        f"CPU vector extensions: {cpu_flags()}; kernel variant: {_fused.variant()}\n"
    )
    header = ["work", "functd fused (µs)", "functd pure-op (µs)", "peer (µs)", "fused / peer"]
    print(table([*header, "target"], rows))


if __name__ == "__main__":
    main()
