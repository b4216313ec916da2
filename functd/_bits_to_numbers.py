"""How jax turns random bits into numbers, under ``functd.random``'s samplers.

Floats in ``[0, 1)`` from mantissa bits (``_unit``), the affine map to ``[lo, hi)``
with XLA's single rounding (``_scaled``, and ``_range32``: the float32 case in one
kernel call), and the unsigned remainder ``randint`` reduces by (``_urem``). Each is
bit-exact with jax's; ``functd.random`` checks the arguments and calls these.

Example:
    >>> u = _unit(functd.random.key(0), (3,), torch.float32)  # what uniform(key, (3,)) is
"""

from __future__ import annotations

import math
import struct

import torch
from torch import Tensor

from . import _fused
from ._eager import plain_tensor
from ._threefry import random_bits

_MIN32, _MAX32 = -(2**31), 2**31 - 1
_MIN64, _MAX64 = -(2**63), 2**63 - 1
# float dtype -> (total bits, mantissa bits, same-size int dtype), as jnp.finfo.
_FLOATS = {
    torch.float16: (16, 10, torch.int16), torch.bfloat16: (16, 7, torch.int16),
    torch.float32: (32, 23, torch.int32), torch.float64: (64, 52, torch.int64),
}  # fmt: skip
_F32 = struct.Struct("f")


def _unit(key: Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """jax's floats in [0, 1): random mantissa bits | exponent of 1.0, minus 1.

    Outside the eager fast paths the mantissa ``m`` becomes ``m * 2**-nmant``, which
    is the same number exactly (``m < 2**nmant`` fits the float's significand, and the
    scale is a power of two) without a bit-cast: torch's vmap has no batching rule for
    ``view(dtype)`` before torch 2.13, and the arithmetic compiles to the same kernel."""
    nbits, nmant, _ = _FLOATS[dtype]
    if nbits >= 32:
        out = _fused.run(
            _fused.MODE_UNIT32 if nbits == 32 else _fused.MODE_UNIT64, key, shape, dtype
        )
        if out is not None:
            return out
    if nbits == 32:
        b = random_bits(key, 32, shape)
        if plain_tensor(b):
            b.bitwise_right_shift_(9).bitwise_and_(0x7FFFFF).bitwise_or_(0x3F800000)
            return b.view(torch.float32).sub_(1.0)
        m = (b >> 9) & 0x7FFFFF
    elif nbits == 64:
        m = (random_bits(key, 64, shape) >> 12) & ((1 << 52) - 1)
    else:  # bfloat16 (7 mantissa bits) uses 8 random bits, like jax
        if not key.is_cpu:  # a CUDA key: one Triton launch where it serves
            mode = _fused.TRITON_UNIT16 if dtype == torch.float16 else _fused.TRITON_UNITBF16
            if (out := _fused.run(mode, key, shape, dtype)) is not None:
                return out
        rng_bits = 8 if dtype == torch.bfloat16 else 16
        m = random_bits(key, rng_bits, shape) >> (rng_bits - nmant)
    return m.to(dtype) * 2.0**-nmant


def _scaled(u: Tensor, lo: Tensor, hi: Tensor, exact: bool = False) -> Tensor:
    """jax's ``max(minval, u * (maxval - minval) + minval)``; ``exact``: the product is exact.

    XLA fuses float32 multiply-adds into an FMA (one rounding): we round once too,
    via float64. It does not fuse 16-bit floats; float64 may differ by 1-2 ulp.
    """
    scale = hi - lo
    if exact and lo.ndim == 0 and plain_tensor(u) and plain_tensor(lo):
        return u.mul_(scale).add_(lo).clamp_min_(lo)
    if exact or u.dtype != torch.float32:
        return torch.maximum(lo, u * scale + lo)
    return torch.maximum(lo, (u.double() * scale.double() + lo.double()).float())


def _f32(x: float) -> float | None:
    """``x`` rounded to float32 as ``torch.tensor(x, dtype=float32)`` does; None: not finite."""
    try:
        y = _F32.unpack(_F32.pack(x))[0]
    except OverflowError:
        return None
    return y if math.isfinite(y) else None


def _range32(key: Tensor, shape: tuple[int, ...], minval: float, maxval: float) -> Tensor | None:
    """float32 ``uniform`` with number bounds in one kernel call: ``_scaled``'s float64
    steps (``u * (hi - lo)`` is exact there, then one rounded add, one rounding to
    float32) and ``max(lo, .)``; None where the kernel does not serve or the bounds are
    not finite or ``lo`` is -0.0 (``maximum``'s choice between zeros)."""
    if torch.compiler.is_compiling():  # (dynamo traces the torch ops, not struct)
        return None
    lo, hi = _f32(minval), _f32(maxval)
    if lo is None or hi is None or (lo == 0 and math.copysign(1.0, lo) < 0):
        return None
    scale = _f32(hi - lo)  # float32 hi - lo: exact in float64 or far below an ulp
    if scale is None:
        return None
    return _fused.run(_fused.MODE_RANGE32, key, shape, torch.float32, scale, lo)


def _urem(a: Tensor, s: Tensor, nbits: int) -> Tensor:
    """Unsigned ``a % s`` with XLA's ``a % 0 == a``, on int64 bit patterns."""
    if nbits <= 32:  # the values are non-negative int64
        return torch.where(s == 0, a, a % torch.where(s == 0, 1, s))
    pos = s > 0
    s1 = torch.where(pos, s, 1)
    r1 = (a & _MAX64) % s1
    t = torch.full_like(s1, _MAX64) % s1 + 1  # 2**63 mod s (or s)
    t = torch.where(t == s1, 0, t)
    d = s1 - t
    r_pos = torch.where(a < 0, torch.where(r1 >= d, r1 - d, r1 + t), r1)
    r_big = torch.where((a ^ _MIN64) < (s ^ _MIN64), a, a - s)  # s >= 2**63
    return torch.where(pos, r_pos, torch.where(s == 0, a, r_big))
