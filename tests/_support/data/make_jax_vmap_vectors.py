"""Generate ``jax_vmap_vectors.json``: ``jax.random`` draws under ``jax.vmap`` over keys.

The batched counterpart of ``make_jax_vectors.py`` (same encoding, same run-by-hand
rule: jax is not a dependency of functd)::

    python3 -m venv /tmp/jaxvenv
    /tmp/jaxvenv/bin/pip install jax jaxlib numpy
    /tmp/jaxvenv/bin/python tests/_support/data/make_jax_vmap_vectors.py

For each seed, ``keys = split(PRNGKey(seed), 3)`` and every sampler of ``SAMPLERS``
is drawn four ways: ``vmap(f)(keys)``; nested, ``vmap(vmap(f))`` over
``split(PRNGKey(seed), (2, 3))``; ``vmap(f, in_axes=1)`` over the keys stored
transposed, ``(2, 3)``; and, for ``fold_in``, a vmap over the data with one key.
``tests/test_random_vmap.py`` replays each with ``fd.vmap``/``torch.func.vmap``.
Computed with ``jax_enable_x64`` (64-bit seeds and ``randint`` bounds, like the x64
block of ``jax_random_vectors.json``).
"""

from __future__ import annotations

import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from make_jax_vectors import enc

SEEDS = [0, 42, 2**40 + 3]
LOGITS = [0.0, 1.0, -1.0, 0.5]


def samplers() -> dict:
    """name -> f(key): the same names and arguments as ``tests/test_random_vmap.py``."""
    jr = jax.random
    return {
        "split": lambda k: jr.split(k, 2),
        "fold_in": lambda k: jr.fold_in(k, 7),
        "bits": lambda k: jr.bits(k, (4,), jnp.uint32),
        "bits64": lambda k: jr.bits(k, (3,), jnp.uint64),
        "uniform": lambda k: jr.uniform(k, (5,), jnp.float32),
        "uniform_range": lambda k: jr.uniform(k, (2, 3), jnp.float32, minval=-2.5, maxval=7.25),
        "normal": lambda k: jr.normal(k, (6,), jnp.float32),
        "gumbel": lambda k: jr.gumbel(k, (5,), jnp.float32),
        "exponential": lambda k: jr.exponential(k, (5,), jnp.float32),
        "truncated_normal": lambda k: jr.truncated_normal(k, -1.5, 0.75, (5,), jnp.float32),
        "bernoulli": lambda k: jr.bernoulli(k, jnp.float32(0.3), (6,)),
        "categorical": lambda k: jr.categorical(k, jnp.asarray(LOGITS, jnp.float32), shape=(4,)),
        "randint": lambda k: jr.randint(k, (5,), -3, 100, jnp.int32),
        "randint64": lambda k: jr.randint(k, (4,), -(2**62), 2**62 + 12345, jnp.int64),
        "permutation": lambda k: jr.permutation(k, 6),
    }


def cases() -> list:
    jr = jax.random
    out = []
    for seed in SEEDS:
        keys = jr.split(jr.PRNGKey(seed), 3)
        grid = jr.split(jr.PRNGKey(seed), (2, 3))
        for name, f in samplers().items():
            out.append({"fn": name, "seed": seed, "how": "vmap", "out": enc(jax.vmap(f)(keys))})
            nested = jax.vmap(jax.vmap(f))(grid)
            out.append({"fn": name, "seed": seed, "how": "nested", "out": enc(nested)})
            moved = jax.vmap(f, in_axes=1)(keys.T)
            out.append({"fn": name, "seed": seed, "how": "in_axes1", "out": enc(moved)})
        data = jnp.asarray([0, 1, 7, 2**31 + 11, 2**32 - 1], jnp.uint32)
        folded = jax.vmap(lambda d, k=keys[0]: jr.fold_in(k, d))(data)
        out.append({"fn": "fold_in_data", "seed": seed, "how": "vmap", "out": enc(folded)})
    return out


def main() -> None:
    assert jax.config.jax_threefry_partitionable, "vectors assume jax_threefry_partitionable=True"
    jax.config.update("jax_enable_x64", True)
    doc = {
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib.__version__,
        "numpy_version": np.__version__,
        "platform": jax.default_backend(),
        "threefry_partitionable": bool(jax.config.jax_threefry_partitionable),
        "cases": cases(),
    }
    path = pathlib.Path(
        sys.argv[1]
        if len(sys.argv) > 1
        else pathlib.Path(__file__).with_name("jax_vmap_vectors.json")
    )
    text = json.dumps(doc, separators=(",", ":"))
    text = text.replace('"cases":[{', '"cases":[\n{').replace('}},{"fn"', '}},\n{"fn"')
    path.write_text(text + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes, {len(doc['cases'])} cases)")


if __name__ == "__main__":
    main()
