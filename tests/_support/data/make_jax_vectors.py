"""Generate ``jax_random_vectors.json``: reference outputs of real ``jax.random``.

jax is not a dependency of functd; this script is run by hand, in a separate
environment, whenever the reference vectors need to be regenerated::

    python3 -m venv /tmp/jaxvenv
    /tmp/jaxvenv/bin/pip install jax jaxlib numpy
    /tmp/jaxvenv/bin/python tests/_support/data/make_jax_vectors.py

Every value is stored as an unsigned integer so that the comparison in
``tests/test_random.py`` is bit-exact: keys and bits as their unsigned value,
floats as the unsigned integer with the same bit pattern (``uint16`` for
float16/bfloat16, ``uint32`` for float32, ``uint64`` for float64). Arrays are
flattened in row-major order and stored together with their shape.

The "x32" block is computed with jax's default 32-bit mode; everything else is
computed with ``jax_enable_x64`` so that 64-bit seeds, ``bits(uint64)`` and
float64 samples are available (jax's default ``jax_threefry_partitionable=True``
is asserted).
"""

from __future__ import annotations

import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

SEEDS = [0, 1, 42, 2**31 + 5, -7, 2**40 + 3]
SHAPES = [(), (3,), (2, 5), (7,)]
UINT_OF = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def enc(x) -> dict:
    """Encode an array as its shape and flat unsigned-integer bit patterns."""
    a = np.asarray(x)
    if a.dtype == jnp.bfloat16 or a.dtype.kind == "f":
        a = a.view(UINT_OF[a.dtype.itemsize])
    elif a.dtype.kind == "i":
        a = a.astype(np.int64)
    elif a.dtype.kind == "b":
        a = a.astype(np.uint8)
    return {"shape": list(a.shape), "dtype": str(np.asarray(x).dtype), "data": a.ravel().tolist()}


def cases_x32(out: list) -> None:
    jr = jax.random
    for seed in [0, 42, 2**31 + 5]:
        k = jr.PRNGKey(seed)
        out.append({"fn": "key", "seed": seed, "out": enc(k)})
        out.append(
            {
                "fn": "uniform",
                "seed": seed,
                "shape": [7],
                "dtype": "float32",
                "out": enc(jr.uniform(k, (7,))),
            }
        )
        out.append(
            {
                "fn": "randint",
                "seed": seed,
                "shape": [7],
                "minval": -3,
                "maxval": 100,
                "dtype": "int32",
                "out": enc(jr.randint(k, (7,), -3, 100)),
            }
        )


def cases_x64(out: list) -> None:
    jr = jax.random
    for seed in SEEDS:
        k = jr.PRNGKey(seed)
        out.append({"fn": "key", "seed": seed, "out": enc(k)})
        for num in (1, 2, 3):
            out.append({"fn": "split", "seed": seed, "num": num, "out": enc(jr.split(k, num))})
        for data in (0, 1, 7, 2**31 + 11, 2**32 - 1):
            out.append(
                {"fn": "fold_in", "seed": seed, "data": data, "out": enc(jr.fold_in(k, data))}
            )
        for shape in SHAPES:
            s = list(shape)
            for dt in ("uint8", "uint16", "uint32", "uint64"):
                out.append(
                    {
                        "fn": "bits",
                        "seed": seed,
                        "shape": s,
                        "dtype": dt,
                        "out": enc(jr.bits(k, shape, dt)),
                    }
                )
            for dt in ("float16", "bfloat16", "float32", "float64"):
                u = jr.uniform(k, shape, getattr(jnp, dt))
                out.append({"fn": "uniform", "seed": seed, "shape": s, "dtype": dt, "out": enc(u)})
            for dt in ("float32", "float64"):
                out.append(
                    {
                        "fn": "normal",
                        "seed": seed,
                        "shape": s,
                        "dtype": dt,
                        "out": enc(jr.normal(k, shape, getattr(jnp, dt))),
                    }
                )
        # Non-default ranges, derived keys and larger sizes, for one seed shape each.
        for dt in ("float16", "bfloat16", "float32", "float64"):
            u = jr.uniform(k, (6,), getattr(jnp, dt), minval=-2.5, maxval=7.25)
            out.append(
                {
                    "fn": "uniform",
                    "seed": seed,
                    "shape": [6],
                    "dtype": dt,
                    "minval": -2.5,
                    "maxval": 7.25,
                    "out": enc(u),
                }
            )
        for dt in ("float16", "bfloat16"):
            out.append(
                {
                    "fn": "normal",
                    "seed": seed,
                    "shape": [7],
                    "dtype": dt,
                    "out": enc(jr.normal(k, (7,), getattr(jnp, dt))),
                }
            )
        out.append(
            {
                "fn": "gumbel",
                "seed": seed,
                "shape": [7],
                "dtype": "float32",
                "out": enc(jr.gumbel(k, (7,), jnp.float32)),
            }
        )
        out.append(
            {
                "fn": "exponential",
                "seed": seed,
                "shape": [7],
                "dtype": "float32",
                "out": enc(jr.exponential(k, (7,), jnp.float32)),
            }
        )
        out.append(
            {
                "fn": "truncated_normal",
                "seed": seed,
                "shape": [7],
                "dtype": "float32",
                "lower": -1.5,
                "upper": 0.75,
                "out": enc(jr.truncated_normal(k, -1.5, 0.75, (7,), jnp.float32)),
            }
        )
        out.append(
            {
                "fn": "bernoulli",
                "seed": seed,
                "shape": [9],
                "p": 0.3,
                "out": enc(jr.bernoulli(k, 0.3, (9,))),
            }
        )
        logits = [[0.0, 1.0, -1.0, 0.5], [2.0, -3.0, 0.0, 0.0]]
        out.append(
            {
                "fn": "categorical",
                "seed": seed,
                "logits": logits,
                "shape": [5, 2],
                "out": enc(jr.categorical(k, jnp.asarray(logits, jnp.float32), shape=(5, 2))),
            }
        )
        for lo, hi, dt in [
            (0, 10, "int32"),
            (-3, 100, "int64"),
            (-(2**62), 2**62 + 12345, "int64"),
            (-(2**63), 2**63 - 1, "int64"),
            (0, 256, "uint8"),
            (-5, 5, "int8"),
            (5, 5, "int32"),
        ]:
            r = jr.randint(k, (7,), lo, hi, getattr(jnp, dt))
            out.append(
                {
                    "fn": "randint",
                    "seed": seed,
                    "shape": [7],
                    "minval": lo,
                    "maxval": hi,
                    "dtype": dt,
                    "out": enc(r),
                }
            )
        for n in (1, 2, 10):
            out.append(
                {"fn": "permutation", "seed": seed, "n": n, "out": enc(jr.permutation(k, n))}
            )
    k = jr.fold_in(jr.split(jr.PRNGKey(3), 3)[2], 11)
    out.append({"fn": "chain", "seed": 3, "out": enc(jr.bits(k, (4,), jnp.uint32))})
    out.append(
        {
            "fn": "bits",
            "seed": 0,
            "shape": [300],
            "dtype": "uint32",
            "out": enc(jr.bits(jr.PRNGKey(0), (300,), jnp.uint32)),
        }
    )
    out.append(
        {"fn": "permutation", "seed": 0, "n": 2000, "out": enc(jr.permutation(jr.PRNGKey(0), 2000))}
    )
    # A larger normal sample (it reaches |z| > 3.5) to measure the ulp error of erfinv.
    z = jr.normal(jr.PRNGKey(5), (3000,), jnp.float32)
    out.append({"fn": "normal", "seed": 5, "shape": [3000], "dtype": "float32", "out": enc(z)})


def main() -> None:
    assert jax.config.jax_threefry_partitionable, "vectors assume jax_threefry_partitionable=True"
    x32: list = []
    cases_x32(x32)
    jax.config.update("jax_enable_x64", True)
    x64: list = []
    cases_x64(x64)
    doc = {
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib.__version__,
        "numpy_version": np.__version__,
        "platform": jax.default_backend(),
        "threefry_partitionable": bool(jax.config.jax_threefry_partitionable),
        "x32": x32,
        "x64": x64,
    }
    path = pathlib.Path(
        sys.argv[1]
        if len(sys.argv) > 1
        else pathlib.Path(__file__).with_name("jax_random_vectors.json")
    )
    # One case per line keeps the file small and its diffs readable.
    text = json.dumps(doc, separators=(",", ":"))
    for name in ("x32", "x64"):
        text = text.replace(f'"{name}":[{{', f'"{name}":[\n{{')
    path.write_text(text.replace('}},{"fn"', '}},\n{"fn"') + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes, {len(x32) + len(x64)} cases)")


if __name__ == "__main__":
    main()
