"""Benchmark functd.random against torch's global RNG (and jax, if installed).

Draws 1e6 float32 uniforms and normals with functd eager, functd under
``torch.compile(fullgraph=True)``, ``torch.rand``/``torch.randn`` and, when
importable, ``jax.random`` (jitted). Prints a markdown table of median times
(``torch.utils.benchmark.Timer.blocked_autorange``) and the ratio to
``torch.rand`` / ``torch.randn`` measured in the same run.

Run: ``.venv/bin/python benchmarks/prng.py [--n 1000000] [--min-run-time 1.0]``
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.benchmark import Timer

import functd.random as fr


def median_us(fn, min_run_time: float) -> float:
    fn()  # warm up (and compile)
    timer = Timer("fn()", globals={"fn": fn})
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e6


def jax_fns(n: int) -> dict:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return {}
    key = jax.random.PRNGKey(0)
    uni = jax.jit(lambda k: jax.random.uniform(k, (n,), jnp.float32))
    nor = jax.jit(lambda k: jax.random.normal(k, (n,), jnp.float32))
    return {
        "uniform": lambda: uni(key).block_until_ready(),
        "normal": lambda: nor(key).block_until_ready(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--min-run-time", type=float, default=1.0)
    args = parser.parse_args()
    n, t = args.n, args.min_run_time
    key = fr.key(0)
    compiled_uniform = torch.compile(lambda k: fr.uniform(k, (n,)), fullgraph=True)
    compiled_normal = torch.compile(lambda k: fr.normal(k, (n,)), fullgraph=True)
    jax_impl = jax_fns(n)
    rows = []
    for dist, torch_fn, eager, compiled in [
        ("uniform", lambda: torch.rand(n), lambda: fr.uniform(key, (n,)), compiled_uniform),
        ("normal", lambda: torch.randn(n), lambda: fr.normal(key, (n,)), compiled_normal),
    ]:
        base = median_us(torch_fn, t)
        name = "torch.rand" if dist == "uniform" else "torch.randn"
        impls = [
            (name, torch_fn),
            ("functd eager", eager),
            ("functd compiled", lambda c=compiled: c(key)),
        ]
        if dist in jax_impl:
            impls.append(("jax.random (jit)", jax_impl[dist]))
        for impl, fn in impls:
            us = base if fn is torch_fn else median_us(fn, t)
            rows.append((dist, impl, us, us / base))
    print(f"{n:.0e} float32 draws, torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print("| distribution | implementation | median (µs) | ratio to torch |")
    print("|---|---|---:|---:|")
    for dist, impl, us, ratio in rows:
        print(f"| {dist} | {impl} | {us:,.0f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
