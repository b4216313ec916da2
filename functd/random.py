"""Explicit, splittable PRNG keys: JAX's threefry2x32 in pure torch ops.

Key layout:
    A key is a plain ``torch.int32`` tensor with a trailing dim of size 2: the
    two words of jax's ``uint32[2]`` raw threefry key (``jax.random.PRNGKey``),
    each word's bits read as a two's-complement int32 (``key.view(torch.uint32)``
    shows jax's numbers; uint32 keys are accepted). A batch of keys has shape
    ``(..., 2)`` and every function maps over the leading dims:
    ``uniform(split(k, 8), (3,))`` equals ``vmap(lambda k: uniform(k, (3,)))(split(k, 8))``.

JAX compatibility:
    Counters follow jax's default ``jax_threefry_partitionable=True``: element ``i``
    (row-major) of a draw hashes ``(i >> 32, i & 0xFFFFFFFF)``; ``split(k, n)[i]``
    and ``fold_in(k, i)`` hash ``(0, i)``; 32-bit ``bits`` xor the two output
    words, 64-bit ones concatenate them, 8/16-bit ones keep the low bits of the
    xor. Floats are built like jax's: mantissa bits under the exponent of 1.0,
    minus 1, scaled, then ``max(minval, .)``.

    Bit-exact with ``jax.random`` (with ``jax_enable_x64`` semantics: int seeds
    are int64, the same as jax's default mode for seeds in ``[0, 2**31)``):
    ``key``, ``split``, ``fold_in``, ``bits`` (8/16/32/64), ``uniform`` (float16,
    bfloat16, float32, float64; float64 with a custom range may be 1-2 ulp
    off jax's FMA), ``bernoulli``, ``randint`` and ``permutation``. ``normal`` and
    ``truncated_normal`` port XLA's float32 ``erf_inv`` (within 3 ulp of jax over
    1e6 draws; float64 uses ``torch.erfinv``); ``gumbel``/``exponential`` use
    torch's ``log``/``log1p`` (1 ulp), so ``categorical`` matches unless values
    tie within an ulp. The bit path is integer-only (wrapping int32 adds, shifts,
    xor): CPU and GPU, eager and compiled, give identical bits.

Everything is a pure function of its inputs (no global RNG, no ``.item()``, no
data-dependent Python control flow): it works under ``torch.func.vmap`` and
``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Size, Tensor

from . import _fused
from ._bits_to_numbers import (
    _FLOATS,
    _MAX32,
    _MAX64,
    _MIN32,
    _MIN64,
    _range32,
    _scaled,
    _unit,
    _urem,
)
from ._eager import plain_tensor
from ._erfinv import erfinv32, sqrt2_erfinv
from ._threefry import (
    MASK32,
    bitcast,
    hash_counters,
    hash_small,
    hash_small_ok,
    random_bits,
    threefry2x32,
    to_i32,
)

__all__ = [
    "as_key", "bernoulli", "bits", "categorical", "exponential", "fold_in", "gumbel", "key",
    "normal", "permutation", "randint", "split", "truncated_normal", "uniform",
]  # fmt: skip

Shape = int | Sequence[int]

# bits dtype -> (bit width, signed dtype with the same bits).
_BITS = {
    torch.uint8: (8, torch.int8), torch.int8: (8, torch.int8),
    torch.uint16: (16, torch.int16), torch.int16: (16, torch.int16),
    torch.uint32: (32, torch.int32), torch.int32: (32, torch.int32),
    torch.uint64: (64, torch.int64), torch.int64: (64, torch.int64),
}  # fmt: skip
_INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


# -- validation ---------------------------------------------------------------


_I32 = torch.int32


def check_key(fn: str | Callable[[], str], key: Any, one: bool = False) -> Tensor:
    """``key`` as an int32 PRNG key (a uint32 one is viewed as int32), or a TypeError /
    ValueError that says how to make one: the one test of "is this a key" (every
    sampler here and the probabilistic modules call it on every draw, so the common
    case is one line).

    Args:
        fn: the caller's name for the message, or a function returning it (called
            only to raise).
        key: the value to check: shape ``(..., 2)``, or exactly ``(2,)`` with ``one``.
        one: a single key only (a probabilistic module's draw takes one key).

    Example:
        >>> check_key("split", key(0))
        tensor([0, 0], dtype=torch.int32)
    """
    if (
        type(key) is Tensor
        and key.dtype is _I32
        and (key.ndim == 1 if one else key.ndim)
        and key.shape[-1] == 2
    ):
        return key  # the common case, fast
    return _bad_key(fn, key, one)


def _bad_key(fn: str | Callable[[], str], key: Any, one: bool) -> Tensor:
    name = fn if isinstance(fn, str) else fn()
    shape = "(2,)" if one else "(..., 2)"
    if not isinstance(key, Tensor) or key.dtype not in (torch.int32, torch.uint32):
        what = f"dtype {key.dtype}" if isinstance(key, Tensor) else type(key).__name__
        raise TypeError(
            f"{name}: `key` must be a functd.random key (an int32 or uint32 tensor of shape "
            f"{shape}), got {what}; make keys with functd.random.key(seed), split or fold_in."
        )
    if one and tuple(key.shape) != (2,):
        raise ValueError(
            f"{name}: `key` must be one key of shape (2,), got shape {tuple(key.shape)}. For "
            "a batch of keys map over them: fd.vmap(lambda k: m(params, td, key=k))(keys)."
        )
    if key.ndim == 0 or key.shape[-1] != 2:
        raise ValueError(
            f"{name}: `key` must have shape (..., 2), got {tuple(key.shape)}; make keys with "
            "functd.random.key(seed), split or fold_in."
        )
    return bitcast(key, torch.int32)


def _check_shape(fn: str, shape: Shape, name: str = "shape") -> tuple[int, ...]:
    if type(shape) is int and shape >= 0:
        return (shape,)  # the common cases, fast (SymInts under compile take the long way)
    if type(shape) in (tuple, Size) and {int} >= {*map(type, shape)} and min((0, *shape)) >= 0:
        return tuple(shape)  # (C-level tests: no generator frames; torch.Size -> tuple)
    dims = (shape,) if not isinstance(shape, (Sequence, Tensor)) else shape
    try:
        if isinstance(shape, Tensor) or any(isinstance(d, bool) for d in dims):
            raise TypeError
        if torch.compiler.is_compiling():
            # keep dynamic sizes symbolic: operator.index would specialise them (a recompile
            # per batch size); an invalid size fails in the torch op that uses it
            out = tuple(dims)
        else:
            out = tuple(operator.index(d) for d in dims)
    except TypeError:
        raise TypeError(f"{fn}: `{name}` must be a tuple of ints, got {shape!r}.") from None
    if any(d < 0 for d in out):
        raise ValueError(f"{fn}: `{name}` must contain non-negative sizes, got {out}.")
    return out


def _check_float(fn: str, dtype: torch.dtype, name: str = "`dtype`") -> None:
    if dtype not in _FLOATS:
        raise TypeError(
            f"{fn}: {name} must be torch.float16/bfloat16/float32/float64, not {dtype}."
        )


def _check_broadcast(fn: str, shape: tuple[int, ...], *shapes: Sequence[int]) -> None:
    got = [tuple(s) for s in shapes]
    try:
        out = tuple(torch.broadcast_shapes(shape, *shapes))
    except RuntimeError:
        out = None
    if out != shape:
        raise ValueError(f"{fn}: parameter shapes {got} must broadcast to `shape`={shape}.")


def _is_int(t: Tensor) -> bool:
    return not (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool)


def _prologue(
    fn: str, key: Tensor, shape: Shape, dtype: torch.dtype
) -> tuple[Tensor, tuple[int, ...]]:
    key = check_key(fn, key)
    _check_float(fn, dtype)
    return key, _check_shape(fn, shape)


# -- public API ---------------------------------------------------------------


def key(seed: int | Tensor, *, device: torch.device | str | None = None) -> Tensor:
    """Make a raw threefry2x32 key from an integer seed, like ``jax.random.PRNGKey``.

    An int64 seed becomes ``[seed >> 32, seed & 0xFFFFFFFF]`` (two's complement),
    as in jax; integer tensor seeds of <= 32 bits get a zero high word (like jax),
    and a tensor of seeds gives a batch of keys.

    Args:
        seed: a Python int in ``[-2**63, 2**63)`` or an integer tensor.
        device: where to put the key (tensor seeds keep theirs).

    Returns:
        An int32 tensor of shape ``(2,)`` (``(*seed.shape, 2)`` for tensor seeds).

    Example:
        >>> key(42)
        tensor([ 0, 42], dtype=torch.int32)
    """
    if isinstance(seed, Tensor):
        if not _is_int(seed):
            raise TypeError(f"key: `seed` must be an integer tensor, got dtype {seed.dtype}.")
        wide = seed.element_size() == 8  # narrower seeds get a zero high word, like jax
        s = bitcast(seed, torch.int64) if wide else seed.to(torch.int64)
        return torch.stack([to_i32(s >> 32 if wide else s * 0), to_i32(s)], dim=-1)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"key: `seed` must be an int or an integer tensor, got {seed!r}.")
    if not _MIN64 <= seed <= _MAX64:
        raise ValueError(f"key: `seed` must lie in [-2**63, 2**63) (int64), got {seed}.")
    return to_i32(torch.tensor([seed >> 32, seed], dtype=torch.int64, device=device))


_seed_key = key  # (as_key takes an argument named key)


def as_key(key: int | Tensor) -> Tensor:
    """Return a PRNG key: a Python int seed becomes ``functd.random.key(seed)``.

    Raises:
        TypeError: ``key`` is neither an int nor a tensor.

    Example:
        >>> as_key(0)
        tensor([0, 0], dtype=torch.int32)
    """
    if isinstance(key, Tensor):
        return key
    if isinstance(key, int) and not isinstance(key, bool):
        return _seed_key(key)
    raise TypeError(
        f"expected a PRNG key (a tensor made by functd.random.key(seed)) or an int seed; "
        f"got a {type(key).__name__}. Example: layer.init(functd.random.key(0))."
    )


def split(key: Tensor, num: int = 2) -> Tensor:
    """Split a key into ``num`` new independent keys, like ``jax.random.split``.

    Args:
        key: a key of shape ``(..., 2)``.
        num: the number of keys, >= 0 (a tuple gives a shape of keys; 0: an empty array).

    Returns:
        Keys of shape ``(..., num, 2)``.

    Example:
        >>> k1, k2 = split(key(0))
    """
    key = check_key("split", key)
    if type(num) is int and num >= 0:
        shape = (num,)  # the common case, fast
    elif isinstance(num, int) and not isinstance(num, bool) and num < 0:
        raise ValueError(f"split: `num` must be >= 0, got {num}.")
    else:
        shape = _check_shape("split", num, "num")
    out = _fused.run(_fused.MODE_PAIRS, key, shape, torch.int32)
    return torch.stack(hash_counters(key, shape), dim=-1) if out is None else out


def fold_in(key: Tensor, data: int | Tensor) -> Tensor:
    """Derive a new key from an integer, like ``jax.random.fold_in``: ``split(k, n)[data]``.

    Args:
        key: a key of shape ``(..., 2)``.
        data: an int in ``[0, 2**32)`` or an integer tensor (low 32 bits, like jax).

    Returns:
        A key of shape ``(..., 2)`` (broadcast with a tensor ``data``).

    Example:
        >>> step_key = fold_in(key(0), 7)
    """
    key = check_key("fold_in", key)
    if isinstance(data, Tensor):
        if not _is_int(data):
            raise TypeError(f"fold_in: `data` must be an integer tensor, got dtype {data.dtype}.")
        d = (data if data.dtype == torch.int32 else to_i32(data.to(torch.int64))).to(key.device)
        if (out := _fused.fold(key, d)) is not None:
            return out
    elif isinstance(data, bool) or not isinstance(data, int):
        raise TypeError(f"fold_in: `data` must be an int or an integer tensor, got {data!r}.")
    elif not 0 <= data <= MASK32:
        raise ValueError(f"fold_in: `data` must be in [0, 2**32), got {data}; use data % 2**32.")
    elif (out := _fused.run(_fused.MODE_PAIRS, key, (), torch.int32, first=data)) is not None:
        return out
    elif hash_small_ok(key, 1):
        return torch.stack(hash_small(key, [data], ()), dim=-1)
    else:
        d = to_i32(_const(data, torch.int64, key.device))
    b0, b1 = torch.broadcast_tensors(*threefry2x32(key[..., 0], key[..., 1], None, d))
    return torch.stack([b0, b1], dim=-1)


def bits(key: Tensor, shape: Shape = (), dtype: torch.dtype = torch.int32) -> Tensor:
    """Sample raw random bits, like ``jax.random.bits``.

    Args:
        key: as for :func:`uniform`.
        shape: as for :func:`uniform`.
        dtype: ``torch.{u,}int{8,16,32,64}``, the bit width (signed dtypes hold
            the bit pattern of jax's unsigned value).

    Returns:
        A tensor of shape ``(*key.shape[:-1], *shape)``.

    Example:
        >>> b = bits(key(0), (2,), torch.uint32)
    """
    key, shape = check_key("bits", key), _check_shape("bits", shape)
    if dtype not in _BITS:
        raise TypeError(f"bits: `dtype` must be an 8/16/32/64-bit integer dtype, got {dtype}.")
    width, signed = _BITS[dtype]
    out = random_bits(key, width, shape)
    if width < 32:
        out = ((out ^ (1 << (width - 1))) - (1 << (width - 1))).to(signed)
    return bitcast(out, dtype)


def _const(v: float, dtype: torch.dtype, device: torch.device | None) -> Tensor:
    """A 0-d tensor of ``v``, made where it is used by a fill kernel: ``torch.tensor``
    would copy it from the host, which a CUDA graph cannot record (``fd.cuda_graph``).
    The value is ``torch.tensor(v, dtype=dtype)``'s (one rounding to ``dtype``)."""
    return torch.full((), v, dtype=dtype, device=device)


def _param(
    fn: str, name: str, v: float | Tensor, dtype: torch.dtype, device: torch.device | None
) -> Tensor:
    if isinstance(v, Tensor):
        return v.to(device=device, dtype=dtype)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{fn}: `{name}` must be a number or a tensor, got {v!r}.")
    return _const(v, dtype, device)


def uniform(
    key: Tensor,
    shape: Shape = (),
    dtype: torch.dtype = torch.float32,
    minval: float | Tensor = 0.0,
    maxval: float | Tensor = 1.0,
) -> Tensor:
    """Sample floats in ``[minval, maxval)``, bit-exact with ``jax.random.uniform``.

    Args:
        key: a key of shape ``(..., 2)``.
        shape: the sample shape.
        dtype: float16, bfloat16, float32 or float64.
        minval: inclusive lower bound, a number or a tensor broadcasting to ``shape``.
        maxval: exclusive upper bound, likewise.

    Returns:
        A tensor of shape ``(*key.shape[:-1], *shape)``.

    Example:
        >>> u = uniform(key(0), (3,), minval=-1.0, maxval=1.0)
    """
    key, shape = _prologue("uniform", key, shape, dtype)
    numbers = type(minval) in (int, float) and type(maxval) in (int, float)
    unit = numbers and minval == 0 and maxval == 1
    if numbers and not unit and dtype == torch.float32:
        out = _range32(key, shape, minval, maxval)  # one kernel call where it serves
        if out is not None:
            return out
    u = _unit(key, shape, dtype)
    if unit:
        return u  # u * 1 + 0 and max(0, u) are exact no-ops
    lo = _param("uniform", "minval", minval, dtype, key.device)
    hi = _param("uniform", "maxval", maxval, dtype, key.device)
    _check_broadcast("uniform", shape, lo.shape, hi.shape)
    return _scaled(u, lo, hi)


def normal(key: Tensor, shape: Shape = (), dtype: torch.dtype = torch.float32) -> Tensor:
    """Sample standard normals like ``jax.random.normal``.

    Args:
        key: as for :func:`uniform`.
        shape: as for :func:`uniform`.
        dtype: as for :func:`uniform`.

    Returns:
        ``sqrt(2) * erf_inv(uniform(key, shape, dtype, nextafter(-1, 0), 1))``, with
        a port of XLA's float32 ``erf_inv`` (float64: ``torch.erfinv``).

    Example:
        >>> z = normal(key(0), (1000,))
    """
    key, shape = _prologue("normal", key, shape, dtype)
    if dtype == torch.float32 and (z := _fused.normal32(key, shape)) is not None:
        return z
    u = _unit(key, shape, dtype)
    if dtype == torch.float32 and plain_tensor(u) and plain_tensor(key):
        # eager fast path: the same float32 ops with constants as Python floats
        # (nextafter(-1, 0) and 1 - nextafter(-1, 0) == 2 are exact in float32)
        u.mul_(2.0).add_(_NEXT_M1).clamp_min_(_NEXT_M1)
        return erfinv32(u).mul_(_SQRT2_32)
    one = _const(1.0, dtype, key.device)
    lo = torch.nextafter(-one, torch.zeros_like(one))
    return sqrt2_erfinv(_scaled(u, lo, one, exact=True), dtype)


_NEXT_M1 = -(1.0 - 2.0**-24)  # float32 nextafter(-1, 0), exact
_SQRT2_32 = float(torch.tensor(math.sqrt(2.0), dtype=torch.float32))  # as the tensor path


def gumbel(key: Tensor, shape: Shape = (), dtype: torch.dtype = torch.float32) -> Tensor:
    """Sample standard Gumbels like ``jax.random.gumbel`` (``mode="low"``).

    Args:
        key: as for :func:`uniform`.
        shape: as for :func:`uniform`.
        dtype: as for :func:`uniform`.

    Returns:
        ``-log(-log(uniform(key, shape, dtype, tiny, 1)))``.

    Example:
        >>> g = gumbel(key(0), (5,))
    """
    key, shape = _prologue("gumbel", key, shape, dtype)
    if dtype == torch.float32:  # max(tiny, u * (1 - tiny) + tiny); 1 - tiny rounds to 1
        u = _fused.run(_fused.MODE_AFFINE32, key, shape, dtype, 1.0, torch.finfo(dtype).tiny)
        if u is not None:
            return u.log_().neg_().log_().neg_()
    tiny = _const(torch.finfo(dtype).tiny, dtype, key.device)
    u = _scaled(_unit(key, shape, dtype), tiny, torch.ones_like(tiny), exact=True)
    return u.log_().neg_().log_().neg_() if plain_tensor(u) else -torch.log(-torch.log(u))


def exponential(key: Tensor, shape: Shape = (), dtype: torch.dtype = torch.float32) -> Tensor:
    """Sample standard exponentials like ``jax.random.exponential``.

    Args:
        key: as for :func:`uniform`.
        shape: as for :func:`uniform`.
        dtype: as for :func:`uniform`.

    Returns:
        ``-log1p(-uniform(key, shape, dtype))``.

    Example:
        >>> e = exponential(key(0), (5,))
    """
    key, shape = _prologue("exponential", key, shape, dtype)
    if dtype == torch.float32:
        u = _fused.run(_fused.MODE_NEG32, key, shape, dtype)
        if u is not None:
            return u.log1p_().neg_()
    u = _unit(key, shape, dtype)
    return u.neg_().log1p_().neg_() if plain_tensor(u) else -torch.log1p(-u)


def truncated_normal(
    key: Tensor,
    lower: float | Tensor,
    upper: float | Tensor,
    shape: Shape | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Sample normals truncated to ``(lower, upper)``, like ``jax.random.truncated_normal``.

    Args:
        key: as for :func:`uniform`.
        dtype: as for :func:`uniform`.
        lower: the lower bound, a number or a tensor.
        upper: the upper bound, a number or a tensor.
        shape: the sample shape; default: ``lower`` and ``upper`` broadcast.

    Returns:
        ``sqrt(2) * erf_inv(uniform(erf(lower/sqrt2), erf(upper/sqrt2)))``,
        clipped to the open interval.

    Example:
        >>> t = truncated_normal(key(0), -2.0, 2.0, (4,))
    """
    key = check_key("truncated_normal", key)
    _check_float("truncated_normal", dtype)
    lo = _param("truncated_normal", "lower", lower, dtype, key.device)
    hi = _param("truncated_normal", "upper", upper, dtype, key.device)
    if shape is None:
        shape = tuple(torch.broadcast_shapes(lo.shape, hi.shape))
    shape = _check_shape("truncated_normal", shape)
    _check_broadcast("truncated_normal", shape, lo.shape, hi.shape)
    sqrt2 = _const(math.sqrt(2.0), dtype, key.device)
    a, b = torch.erf(lo / sqrt2), torch.erf(hi / sqrt2)
    out = sqrt2_erfinv(_scaled(_unit(key, shape, dtype), a, b), dtype)
    inf = _const(math.inf, dtype, key.device)
    return torch.clamp(out, torch.nextafter(lo, inf), torch.nextafter(hi, -inf))


def bernoulli(key: Tensor, p: float | Tensor = 0.5, shape: Shape | None = None) -> Tensor:
    """Sample booleans, True with probability ``p``, like ``jax.random.bernoulli``.

    Args:
        key: a key of shape ``(..., 2)``.
        p: a float (in torch's default dtype) or a floating tensor.
        shape: the sample shape; default ``p.shape``.

    Returns:
        ``uniform(key, shape, p.dtype) < p``.

    Example:
        >>> coin = bernoulli(key(0), 0.5, (10,))
    """
    key = check_key("bernoulli", key)
    if isinstance(p, Tensor):
        p = p.to(key.device)
    elif isinstance(p, bool) or not isinstance(p, (int, float)):
        raise TypeError(f"bernoulli: `p` must be a float or a floating tensor, got {p!r}.")
    else:
        p = _const(float(p), torch.get_default_dtype(), key.device)
    _check_float("bernoulli", p.dtype, "the dtype of `p`")
    shape = tuple(p.shape) if shape is None else _check_shape("bernoulli", shape)
    _check_broadcast("bernoulli", shape, p.shape)
    return _unit(key, shape, p.dtype) < p


def categorical(key: Tensor, logits: Tensor, axis: int = -1, shape: Shape | None = None) -> Tensor:
    """Sample categories from unnormalized log-probabilities, like ``jax.random.categorical``.

    Args:
        key: a key of shape ``(..., 2)``.
        logits: a floating tensor whose ``axis`` indexes the categories.
        axis: the category axis of ``logits``.
        shape: the sample shape: (a broadcast of) ``logits.shape`` without ``axis``,
            after optional extra leading dims that draw more samples.

    Returns:
        ``argmax(gumbel(...) + logits, axis)`` (int64).

    Example:
        >>> idx = categorical(key(0), torch.tensor([0.0, 1.0, 2.0]), shape=(8,))
    """
    key = check_key("categorical", key)
    if not isinstance(logits, Tensor) or logits.ndim == 0:
        raise TypeError("categorical: `logits` must be a floating tensor with at least one dim.")
    _check_float("categorical", logits.dtype, "the dtype of `logits`")
    nd = logits.ndim
    if not -nd <= axis < nd:
        raise ValueError(f"categorical: `axis`={axis} is out of range for logits of ndim {nd}.")
    axis %= nd
    batch_shape = tuple(logits.shape[:axis] + logits.shape[axis + 1 :])
    shape = batch_shape if shape is None else _check_shape("categorical", shape)
    _check_broadcast("categorical", shape, batch_shape)
    npre = len(shape) - len(batch_shape)
    rest = list(shape[npre:])
    rest.insert(axis, logits.shape[axis])
    g = gumbel(key, (*shape[:npre], *rest), logits.dtype)
    return torch.argmax(g + logits.to(key.device), dim=axis - nd)


def _int_param(name: str, v: int | Tensor, device: torch.device | None) -> Tensor:
    if isinstance(v, Tensor) and _is_int(v):
        return v.to(device=device, dtype=torch.int64)
    if isinstance(v, (Tensor, bool)) or not isinstance(v, int):
        raise TypeError(f"randint: `{name}` must be an int or an integer tensor, got {v!r}.")
    if not _MIN64 <= v <= _MAX64:
        raise ValueError(f"randint: `{name}` must fit in int64, got {v}.")
    return _const(v, torch.int64, device)


def randint(
    key: Tensor,
    shape: Shape,
    minval: int | Tensor,
    maxval: int | Tensor,
    dtype: torch.dtype = torch.int64,
) -> Tensor:
    """Sample integers in ``[minval, maxval)``, bit-exact with ``jax.random.randint``.

    jax's algorithm: two draws of random bits combined modulo the span (biased
    unless the span is a power of 2; 8/16-bit dtypes draw 32 bits). Bounds are
    clipped to the dtype; ``maxval <= minval`` gives ``minval``.

    Args:
        key: as for :func:`uniform`.
        shape: as for :func:`uniform`.
        minval: the lower bound (included), an int or an integer tensor broadcasting to
            ``shape``.
        maxval: the upper bound (excluded), an int or an integer tensor broadcasting to
            ``shape``.
        dtype: torch.int8, int16, int32, int64 or uint8.

    Returns:
        A tensor of shape ``(*key.shape[:-1], *shape)``.

    Example:
        >>> dice = randint(key(0), (10,), 1, 7)
    """
    key, shape = check_key("randint", key), _check_shape("randint", shape)
    if dtype not in _INTS:
        raise TypeError(f"randint: `dtype` must be one of {_INTS}, got {dtype}.")
    lo, hi = _int_param("minval", minval, key.device), _int_param("maxval", maxval, key.device)
    _check_broadcast("randint", shape, lo.shape, hi.shape)
    info, nbits = torch.iinfo(dtype), 64 if dtype == torch.int64 else 32
    if info.bits < 32:  # like jax: astype(int32), then clip (maxval up to max + 1)
        lo = to_i32(lo).to(torch.int64).clamp(info.min, info.max)
        hi = to_i32(hi).to(torch.int64).clamp(info.min, info.max + 1)
    mask, oor = -1, torch.zeros_like(hi, dtype=torch.bool)
    if nbits == 32:  # maxval beyond int32: the span is one larger
        mask, oor = MASK32, hi > _MAX32
        lo, hi = lo.clamp(_MIN32, _MAX32), hi.clamp(_MIN32, _MAX32)
    span = torch.where(hi <= lo, 1, (hi - lo) & mask)  # 64-bit: wrapping = uint64 diff
    span = torch.where(oor & (hi > lo), (span + 1) & mask, span)
    mult = _urem(torch.full_like(span, 1 << (nbits // 2)), span, nbits)  # 2**nbits % span
    mult = _urem((mult * mult) & mask, span, nbits)  # int64 products wrap like uint64
    k = split(key)
    high, low = (random_bits(k[..., i, :], nbits, shape) for i in (0, 1))
    if nbits == 32:
        high, low = high.to(torch.int64) & MASK32, low.to(torch.int64) & MASK32
    off = (_urem(high, span, nbits) * mult + _urem(low, span, nbits)) & mask
    out = lo + _urem(off, span, nbits)
    return (to_i32(out) if nbits == 32 else out).to(dtype)


def _shuffle(key: Tensor, x: Tensor, axis: int) -> Tensor:
    """jax's shuffle by sorting: stable sorts by fresh 32-bit keys, enough rounds for n**3."""
    rounds = math.ceil(3 * math.log(max(1, x.numel())) / math.log(2**32 - 1))
    shape, dim = tuple(x.shape), axis - x.ndim
    x = x.expand(*key.shape[:-1], *shape)
    if rounds == 0:
        return x.clone()
    for _ in range(rounds):
        k = split(key)
        key = k[..., 0, :]
        sort_keys = random_bits(k[..., 1, :], 32, shape) ^ _MIN32  # uint32 order as int32 order
        x = torch.take_along_dim(x, torch.sort(sort_keys, dim=dim, stable=True).indices, dim=dim)
    return x


def permutation(
    key: Tensor, x_or_n: int | Tensor, axis: int = 0, independent: bool = False
) -> Tensor:
    """Randomly permute ``arange(n)`` or a tensor along ``axis``, like ``jax.random.permutation``.

    Args:
        key: a key of shape ``(..., 2)``.
        x_or_n: an int ``n`` (permute ``arange(n)``, int64) or a tensor with ndim >= 1.
        axis: the axis to permute.
        independent: if True, permute each slice along ``axis`` independently.

    Returns:
        The permuted values, of shape ``(*key.shape[:-1], *x.shape)``.

    Example:
        >>> sorted(permutation(key(0), 5).tolist())
        [0, 1, 2, 3, 4]
    """
    key = check_key("permutation", key)
    if isinstance(x_or_n, Tensor) and x_or_n.ndim > 0:
        x = x_or_n.to(key.device)
    elif isinstance(x_or_n, (Tensor, bool)) or not isinstance(x_or_n, int):
        msg = "a Python int (pass int(x) for a 0-d tensor) or a tensor with ndim >= 1"
        raise TypeError(f"permutation: `x_or_n` must be {msg}, got {x_or_n!r}.")
    elif x_or_n < 0:
        raise ValueError(f"permutation: `x_or_n` must be >= 0, got {x_or_n}.")
    else:
        x = torch.arange(x_or_n, device=key.device)
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"permutation: `axis`={axis} is out of range for ndim {x.ndim}.")
    axis %= x.ndim
    if independent or x.ndim == 1:
        return _shuffle(key, x, axis)
    perm = _shuffle(key, torch.arange(x.shape[axis], device=key.device), 0)
    nb = perm.ndim - 1
    return x.movedim(axis, 0)[perm].movedim(nb, nb + axis)
