"""The threefry2x32 hash behind ``functd.random``: pure torch ops, and a Python-int
path for tiny eager draws; eager CPU draws take the fused kernel of ``_fused.py``
first (the same bits).

Everything here works on int32 bit patterns with wrapping adds (torch has no
uint32 add or shift kernels on CPU), so CPU and GPU, eager and compiled give
the same bits. ``functd.random`` builds keys and samplers on top; see its
docstring for the counter layout that makes the bits equal jax.random's.

Example:
    >>> x0, x1 = hash_counters(functd.random.key(0), (4,))  # two int32 words per element
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import _fused
from ._eager import plain_tensor
from ._torch import VIEW_DTYPE_BATCHES

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA
MASK32 = 0xFFFFFFFF


def to_i32(x: Tensor) -> Tensor:
    """Low 32 bits of an int64 tensor as an int32 bit pattern (no overflowing cast)."""
    return (((x & MASK32) ^ 0x80000000) - 0x80000000).to(torch.int32)


def bitcast(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x``'s bits read as ``dtype``, an integer dtype of the same width (int32 <->
    uint32, int64 <-> uint64, ...): ``x.view(dtype)`` where torch's vmap batches it
    (torch >= 2.13, ``VIEW_DTYPE_BATCHES``), else the same bits by conversions every
    transform batches (a 64-bit conversion wraps modulo 2**64; narrower ones go
    through the unsigned value in int64).

    >>> bitcast(torch.tensor([-1, 7], dtype=torch.int32), torch.uint32)
    tensor([4294967295,          7], dtype=torch.uint32)
    """
    if x.dtype == dtype:
        return x
    if VIEW_DTYPE_BATCHES:
        return x.view(dtype)
    width = 8 * x.element_size()
    if width == 64:
        return x.to(dtype)
    u = x.to(torch.int64) & ((1 << width) - 1)
    if dtype.is_signed:
        u = (u ^ (1 << (width - 1))) - (1 << (width - 1))
    return u.to(dtype)


# -- threefry2x32 -------------------------------------------------------------


def threefry2x32(
    k0: Tensor, k1: Tensor, x0: Tensor | None, x1: Tensor, fresh: bool = False
) -> tuple[Tensor, Tensor]:
    """Hash int32 counters ``(x0, x1)`` (None: 0) under ``(k0, k1)``; ``fresh``: x1 is ours."""
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    inject = [(ks[(i + 1) % 3], ks[(i + 2) % 3] + (i + 1)) for i in range(5)]
    if not (plain_tensor(x1) and plain_tensor(k0) and plain_tensor(k1)):
        x0, x1 = k0 if x0 is None else x0 + k0, x1 + k1
        for i in range(5):
            for r in _ROTATIONS[i % 2]:
                x0 = x0 + x1
                x1 = ((x1 << r) | ((x1 >> (32 - r)) & ((1 << r) - 1))) ^ x0  # rotl
            x0, x1 = x0 + inject[i][0], x1 + inject[i][1]
        return x0, x1
    # Eager fast path: the same ops in place on fresh buffers; a new 4 MB tensor
    # per op costs more than the op itself (page faults).
    shape = torch.broadcast_shapes(k0.shape, k1.shape, x1.shape)
    out0 = torch.empty(shape, dtype=torch.int32, device=k0.device).copy_(k0)
    x0 = out0 if x0 is None else out0.add_(x0)
    x1 = x1.add_(k1) if fresh and x1.shape == shape else x1 + k1
    tmp = torch.empty_like(x1)
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0.add_(x1)
            torch.bitwise_left_shift(x1, r, out=tmp)
            x1.bitwise_right_shift_(32 - r).bitwise_and_((1 << r) - 1)
            x1.bitwise_or_(tmp).bitwise_xor_(x0)
        x0.add_(inject[i][0])
        x1.add_(inject[i][1])
    return x0, x1


# Below this many hashes, eager CPU calls run threefry on Python ints: a policy's
# few draws per step would otherwise pay ~100 tiny tensor ops each.
_SMALL = 16


def hash_small_ok(key: Tensor, n: int) -> bool:
    # plain_tensor first: under torch.compile it is False, and the size test must not
    # run there (it would guard on a dynamic size: a recompile per batch size)
    return plain_tensor(key) and key.device.type == "cpu" and n * (key.numel() // 2) <= _SMALL


def _threefry_py(k0: int, k1: int, x1: int) -> tuple[int, int]:
    """``threefry2x32`` of one counter ``(0, x1)`` on uint32 Python ints."""
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0, x1 = k0, (x1 + k1) & MASK32
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = (x0 + x1) & MASK32
            x1 = (((x1 << r) & MASK32) | (x1 >> (32 - r))) ^ x0
        x0 = (x0 + ks[(i + 1) % 3]) & MASK32
        x1 = (x1 + ks[(i + 2) % 3] + i + 1) & MASK32
    return x0, x1


def hash_small(key: Tensor, counters: list[int], shape: tuple[int, ...]):
    """The small-size path of ``hash_counters``/``fold_in``: int32 tensors ``(*batch, *shape)``."""
    b0, b1 = [], []
    for k0, k1 in key.reshape(-1, 2).tolist():
        k0, k1 = k0 & MASK32, k1 & MASK32
        for c in counters:
            y0, y1 = _threefry_py(k0, k1, c)
            b0.append(y0 - (y0 >> 31 << 32))
            b1.append(y1 - (y1 >> 31 << 32))
    out = (*key.shape[:-1], *shape)
    return (
        torch.tensor(b0, dtype=torch.int32).reshape(out),
        torch.tensor(b1, dtype=torch.int32).reshape(out),
    )


def hash_counters(key: Tensor, shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """Threefry of the row-major counters of ``shape``: two int32 arrays ``(*batch, *shape)``."""
    n = math.prod(shape)
    if hash_small_ok(key, n):
        return hash_small(key, list(range(n)), shape)
    expand = (..., *([None] * len(shape)))
    k0, k1 = key[..., 0][expand], key[..., 1][expand]
    if n <= 2**31:  # the high counter words are all zero
        lo = torch.arange(n, dtype=torch.int32, device=key.device).reshape(shape)
        return threefry2x32(k0, k1, None, lo, fresh=True)
    idx = torch.arange(n, dtype=torch.int64, device=key.device).reshape(shape)
    return threefry2x32(k0, k1, to_i32(idx >> 32), to_i32(idx), fresh=True)


def random_bits(key: Tensor, nbits: int, shape: tuple[int, ...]) -> Tensor:
    """jax's random bits: int32 patterns (32), int64 patterns (64), values in int64 (8, 16)."""
    if nbits == 64:
        out = _fused.run(_fused.MODE_BITS64, key, shape, torch.int64)
    else:
        out = _fused.run(_fused.MODE_BITS32, key, shape, torch.int32)
    if out is not None:
        return out if nbits >= 32 else out.to(torch.int64) & ((1 << nbits) - 1)
    b0, b1 = hash_counters(key, shape)
    if nbits == 64:
        return (b0.to(torch.int64) << 32) | (b1.to(torch.int64) & MASK32)
    out = b0.bitwise_xor_(b1) if plain_tensor(b0) else b0 ^ b1
    return out if nbits == 32 else out.to(torch.int64) & ((1 << nbits) - 1)
