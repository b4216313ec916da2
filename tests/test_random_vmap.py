"""functd.random under vmap: batched keys stay in the fused kernel (one call over every
key of every level), with jax.random's bits and the eager loop's bits.

References: jax.random under jax.vmap (stored vectors, tests/_support/data/jax_vmap_vectors.json,
made by make_jax_vmap_vectors.py), the eager loop over the keys, and the pure torch-op
path (which torch.func batches op by op).
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
from test_random import as_signed, decode, ulp_distance

import functd as fd
import functd.random as fr
from functd import _fused, _threefry
from tests._support import random_cases

SAMPLERS = {**random_cases.SAMPLERS, **random_cases.FUSED_EXTRA}
VECTORS = json.loads(
    (pathlib.Path(__file__).parent / "_support" / "data" / "jax_vmap_vectors.json").read_text()
)
SIDE = (_fused.MODE_ERFINV_GATHER, _fused.MODE_ERFINV_GT)  # only where |x| > 0.9966


@pytest.fixture
def calls(monkeypatch):
    """The kernel's calls as (mode, elements), gather/finish steps of normal left out."""
    fn = _fused._load()
    if not fn:
        pytest.skip("the fused kernel is not in use (FUNCTD_FUSED_RANDOM=0)")
    seen: list = []

    def spy(op, keys, total, *rest):
        if op & 255 not in SIDE:
            seen.append((op & 255, total))
        return fn(op, keys, total, *rest)

    monkeypatch.setattr(_fused, "_KERNEL", spy)
    return seen


def pure(f, *args):
    saved, _fused._KERNEL = _fused._KERNEL, False
    try:
        return f(*args)
    finally:
        _fused._KERNEL = saved


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(as_signed(a), as_signed(b))


def bitwise(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point:
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.itemsize]
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(ints), b.view(ints))
    return same(a, b)


# -- the eager loop, bitwise, and one kernel call per draw -----------------------------


@pytest.mark.parametrize("name", sorted(SAMPLERS))
@pytest.mark.parametrize("vmap", [torch.func.vmap, fd.vmap], ids=["torch.func", "fd"])
def test_vmapped_draw_is_the_loop_in_one_kernel_call(calls, name, vmap):
    f, shape = SAMPLERS[name], (3, 5)
    keys = fr.split(fr.key(len(name)), 6)
    calls.clear()
    one = f(keys[0], shape)
    single = list(calls)
    calls.clear()
    got = vmap(lambda k: f(k, shape))(keys)
    assert calls == [(mode, total * 6) for mode, total in single]  # all keys at once
    assert bitwise(got, torch.stack([one, *(f(k, shape) for k in keys[1:])]))
    assert bitwise(got, pure(lambda: vmap(lambda k: f(k, shape))(keys)))


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_nested_vmap_and_in_dims_other_than_0(calls, name):
    f, shape = SAMPLERS[name], (4,)
    grid = fr.split(fr.key(7), (2, 3))  # (2, 3, 2)
    loop = torch.stack([torch.stack([f(k, shape) for k in row]) for row in grid])
    calls.clear()
    nested = torch.func.vmap(torch.func.vmap(lambda k: f(k, shape)))(grid)
    n_nested = len(calls)
    assert bitwise(nested, loop)
    moved = grid.permute(2, 1, 0)  # keys along dim 2, rows along dim 1, words first
    inner = torch.func.vmap(lambda k: f(k, shape), in_dims=1)
    calls.clear()
    swapped = torch.func.vmap(inner, in_dims=1)(moved)  # [row index i][column j]
    assert len(calls) == n_nested
    assert bitwise(swapped, loop.transpose(0, 1))
    mixed = fd.vmap(fd.vmap(lambda k: f(k, shape)), in_dims=1)(grid)  # inner over rows
    assert bitwise(mixed, loop.transpose(0, 1))
    # a batch of keys inside vmap: the key's own batch dims map as well
    assert bitwise(torch.func.vmap(lambda ks: f(ks, shape))(grid), loop)


def test_vmap_levels_the_key_is_not_batched_at():
    # the key is batched only at the outer level; the inner vmap maps data
    keys, xs = fr.split(fr.key(3), 4), torch.arange(5.0)

    def member(k):
        return torch.func.vmap(lambda x: fr.normal(k, (2,)) + x)(xs)

    got = torch.func.vmap(member)(keys)
    want = torch.stack([fr.normal(k, (2,)) + xs[:, None] for k in keys])
    assert bitwise(got, want)
    plain = fr.key(1)  # a captured key: not batched at all
    got = torch.func.vmap(lambda x: fr.uniform(plain, (3,)) * x)(xs)
    assert bitwise(got, fr.uniform(plain, (3,)) * xs[:, None])


def test_fold_in_over_batched_data_and_keys(calls):
    k, data = fr.key(5), torch.tensor([0, 1, 7, 2**31 + 11, 2**32 - 1])
    calls.clear()
    got = torch.func.vmap(lambda d: fr.fold_in(k, d))(data)
    assert calls == [(_fused.MODE_FOLD, 5)]
    assert same(got, torch.stack([fr.fold_in(k, int(d)) for d in data]))
    keys = fr.split(k, 3)
    both = torch.func.vmap(torch.func.vmap(fr.fold_in, in_dims=(None, 0)), in_dims=(0, None))
    want = torch.stack([torch.stack([fr.fold_in(kk, int(d)) for d in data]) for kk in keys])
    assert same(both(keys, data), want)
    # eager tensor data broadcasts with a batch of keys, as the pure path does
    grid = fr.fold_in(keys[:, None], data[None, :].to(torch.int32))
    assert same(grid, want) and same(grid, pure(fr.fold_in, keys[:, None], data[None, :]))


def test_chunked_vmap_and_non_contiguous_keys():
    keys = fr.split(fr.key(9), 8)[::2]  # a strided view
    f = lambda k: fr.normal(k, (3, 2))  # noqa: E731
    want = torch.stack([f(k) for k in keys])
    assert bitwise(torch.func.vmap(f, chunk_size=3)(keys), want)
    assert bitwise(torch.func.vmap(f)(keys.view(torch.uint32)), want)


INT_PAIRS = [
    (torch.int8, torch.uint8),
    (torch.int16, torch.uint16),
    (torch.int32, torch.uint32),
    (torch.int64, torch.uint64),
]


@pytest.mark.parametrize("signed, unsigned", INT_PAIRS, ids=lambda d: str(d)[6:])
def test_bitcast_without_a_view_dtype_batching_rule_is_torchs_view(monkeypatch, signed, unsigned):
    """torch < 2.13 has no vmap rule for view(dtype): bitcast's conversions (forced here on
    any torch) give the bits of torch's own view, eagerly and under vmap."""
    monkeypatch.setattr(_threefry, "VIEW_DTYPE_BATCHES", False)
    info = torch.iinfo(signed)
    x = torch.tensor([[0, 1, -1], [info.min, info.max, -77]], dtype=signed)
    for src, dst in ((x, unsigned), (x.view(unsigned), signed)):
        for got in (
            _threefry.bitcast(src, dst),
            torch.func.vmap(_threefry.bitcast, (0, None))(src, dst),
        ):
            assert got.dtype == dst and torch.equal(got.view(signed), x)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.uint16, torch.uint32, torch.uint64])
def test_vmapped_unsigned_bits_and_uint32_keys_without_view_dtype(monkeypatch, dtype):
    monkeypatch.setattr(_threefry, "VIEW_DTYPE_BATCHES", False)
    keys = fr.split(fr.key(3), 4)
    f = lambda k: fr.bits(k, (5,), dtype)  # noqa: E731
    want = torch.stack([f(k) for k in keys])
    assert same(torch.func.vmap(f)(keys), want)
    assert same(fd.vmap(f)(keys.view(torch.uint32)), want)


def test_grad_levels_keep_the_pure_path_and_the_bits(calls):
    keys = fr.split(fr.key(2), 3)

    def loss(w, k):
        return (fr.normal(k, (4,)) * w).sum()

    calls.clear()
    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(torch.ones(4), keys)
    assert calls == []  # a grad level on the stack: the pure ops, which grad can see
    assert bitwise(grads, torch.stack([fr.normal(k, (4,)) for k in keys]))


def test_an_empty_batch_and_empty_draws():
    none = fr.split(fr.key(0), 0)
    assert torch.func.vmap(lambda k: fr.normal(k, (3,)))(none).shape == (0, 3)
    assert torch.func.vmap(lambda k: fr.uniform(k, (0, 2)))(fr.split(fr.key(0), 2)).shape == (
        2,
        0,
        2,
    )


# -- jax.random under jax.vmap: stored vectors -----------------------------------------

LOGITS = torch.tensor([0.0, 1.0, -1.0, 0.5])
P = torch.tensor(0.3)
JAX_SAMPLERS = {
    "split": lambda k: fr.split(k, 2),  # keys: read as jax's uint32 after the vmap
    "fold_in": lambda k: fr.fold_in(k, 7),
    "bits": lambda k: fr.bits(k, (4,), torch.uint32),
    "bits64": lambda k: fr.bits(k, (3,), torch.uint64),
    "uniform": lambda k: fr.uniform(k, (5,)),
    "uniform_range": lambda k: fr.uniform(k, (2, 3), minval=-2.5, maxval=7.25),
    "normal": lambda k: fr.normal(k, (6,)),
    "gumbel": lambda k: fr.gumbel(k, (5,)),
    "exponential": lambda k: fr.exponential(k, (5,)),
    "truncated_normal": lambda k: fr.truncated_normal(k, -1.5, 0.75, (5,)),
    "bernoulli": lambda k: fr.bernoulli(k, P, (6,)),
    "categorical": lambda k: fr.categorical(k, LOGITS, shape=(4,)),
    "randint": lambda k: fr.randint(k, (5,), -3, 100, torch.int32),
    "randint64": lambda k: fr.randint(k, (4,), -(2**62), 2**62 + 12345, torch.int64),
    "permutation": lambda k: fr.permutation(k, 6),
}


def replay(case: dict) -> torch.Tensor:
    seed, how = case["seed"], case["how"]
    if case["fn"] == "fold_in_data":
        data = torch.tensor([0, 1, 7, 2**31 + 11, 2**32 - 1])
        k = fr.split(fr.key(seed), 3)[0]
        return fd.vmap(lambda d: fr.fold_in(k, d))(data).view(torch.uint32)
    f = JAX_SAMPLERS[case["fn"]]
    if how == "vmap":
        out = fd.vmap(f)(fr.split(fr.key(seed), 3))
    elif how == "nested":
        out = torch.func.vmap(fd.vmap(f))(fr.split(fr.key(seed), (2, 3)))
    else:
        out = torch.func.vmap(f, in_dims=1)(fr.split(fr.key(seed), 3).T)
    # (outside the vmap: torch's vmap batches view(dtype) from torch 2.13 only)
    return out.view(torch.uint32) if case["fn"] in ("split", "fold_in") else out


@pytest.mark.parametrize(
    "case", VECTORS["cases"], ids=lambda c: f"{c['fn']}-{c['how']}-{c['seed']}"
)
def test_vmapped_draws_match_jax_vmap(case):
    got, want = replay(case), decode(case["out"])
    assert got.shape == want.shape and got.dtype == want.dtype
    if case["fn"] == "normal":  # XLA's erf_inv ported op for op: within a few ulp
        assert ulp_distance(got, want).max().item() <= 4
    elif case["fn"] in ("gumbel", "exponential", "truncated_normal"):  # torch's log/erf
        torch.testing.assert_close(got, want, rtol=4e-6, atol=2e-6)
    else:
        assert same(got, want)


def test_vmap_vectors_metadata():
    assert VECTORS["threefry_partitionable"] is True
    assert {c["how"] for c in VECTORS["cases"]} == {"vmap", "nested", "in_axes1"}


def test_fold_in_a_0d_index_with_a_key_taken_from_a_batched_split_equals_the_loop():
    # a 0-d data tensor and a batched key: the kernel's lift permuted a 0-d tensor with
    # no dims (TypeError) before
    keys = fd.random.split(fd.random.key(0), 3)

    def f(k):
        k2 = fd.random.split(k).unbind(-2)[1]
        return fd.random.fold_in(k2, torch.arange(4)[2])

    got = fd.vmap(f)(keys)
    assert torch.equal(got, torch.stack([f(k) for k in keys.unbind(0)]))
