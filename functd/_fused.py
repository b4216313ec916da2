"""Fused CPU kernels for ``functd.random``: one C call per draw instead of ~500 ops.

The kernels are the extension module ``functd._fused_ext`` (``functd/_fused_ext.c``),
compiled when the package is built or installed (setup.py); nothing is compiled or
loaded from elsewhere at run time. Where the extension is missing (an sdist installed
without a compiler, a platform without a build), or was built for another version of
this file, ONE ``RuntimeWarning`` names the reason and every draw keeps the pure-op
path, which gives the same bits. ``FUNCTD_FUSED_RANDOM=0`` chooses the pure path
silently.

Keys served: plain eager CPU tensors, and under ``torch.func.vmap``/``fd.vmap`` (nested
too, any ``in_dims``) batched CPU keys: their batch dims are unwrapped, the draw runs as
ONE kernel call over every key of every level, and the result is wrapped back at the
same levels (``_lift``/``_wrap``). CUDA keys (NVIDIA) in the same two cases take one
Triton launch per draw instead (``_triton_draws.py``, where triton imports; the same
bits). Everywhere else the pure ops run: under ``torch.compile``/dynamo (inductor fuses
them), ``torch.func.grad``/``jvp`` levels, ``torch.jit`` tracing, a dispatch mode
(FakeTensor), a function mode (``with torch.device(...)``), meta keys, CUDA keys where
triton does not import. See notes/prng.md for the design and figures.

Example:
    >>> u = run(MODE_UNIT32, functd.random.key(0), (4,), torch.float32)  # None: pure path
    >>> variant()  # the instruction set the kernel runs with
    'avx2'
"""

from __future__ import annotations

import importlib
import math
import os
import threading
import warnings
from typing import Any

import torch
from torch import Tensor

from ._eager import is_wrapped, plain_tensor
from ._torch import functorch, ops

# The kernel's modes: the values of the enum of _fused_ext.c, one by one (a test reads
# the C enum and compares). A call passes ``mode | threads << 8``. Plain ints: a module
# global is read ~4x faster than an enum member, and a draw reads one per call.
MODE_PAIRS = 0  # the counters' hash as uint32 pairs (new keys: split, fold_in)
MODE_BITS32 = 1  # uint32 words (x0 ^ x1)
MODE_BITS64 = 2  # uint64 words (x0 << 32 | x1)
MODE_UNIT32 = 3  # float32 uniforms in [0, 1)
MODE_NORMAL_PRE = 4  # float32 normal, first pass: x = max(a, 2u + a) and -(x * x)
MODE_AFFINE32 = 5  # float32 max(b, u * a + b)
MODE_NEG32 = 6  # float32 -u
MODE_UNIT64 = 7  # float64 uniforms in [0, 1)
MODE_ERFINV_LT = 8  # float32 normal: erf_inv's first polynomial, listing the rest
MODE_RANGE32 = 9  # float32 max(lo, float(double(u) * a + b)) (uniform in a range)
MODE_FOLD = 10  # fold_in: one counter (0, data[k]) per key, as pairs
MODE_ERFINV_GATHER = 11  # float32 normal: list the elements past the first polynomial again
MODE_ERFINV_GT = 12  # float32 normal: erf_inv's second polynomial on the listed elements
# Triton-only modes (CUDA keys; the C kernel has none of them, so no CPU key reaches them)
TRITON_NORMAL32 = 100  # the whole float32 normal in one launch
TRITON_UNIT16, TRITON_UNITBF16 = 101, 102  # float16 / bfloat16 uniforms in [0, 1)
VERSION = 4  # the calling convention's version (the extension's VERSION)
_THREADED = 1 << 18  # draws this large are shared by torch.get_num_threads() threads
_NEXT_M1 = -(1.0 - 2.0**-24)  # float32 nextafter(-1, 0), exact
_SQRT2_32 = float(torch.tensor(math.sqrt(2.0), dtype=torch.float32))

_F = functorch.C
_is_batched = functorch.is_batchedtensor
_dispatch_modes = ops.len_dispatch_stack
_transforms = functorch.peek_interpreter_stack
_stack = functorch.get_interpreter_stack
_function_mode = ops.function_mode_enabled
_tracing = ops.tracing_state
_VMAP = getattr(functorch.TransformType, "Vmap", None)
_HOOKS = None not in (is_wrapped, _is_batched, _dispatch_modes, _transforms, _stack, _VMAP)
_VMAP_HOOKS = all(  # what _lift/_wrap/_under_vmap use; else vmapped draws take the pure ops
    hasattr(_F, name)
    for name in (
        "maybe_get_level", "_unwrap_batched", "_add_batch_dim",
        "pop_dynamic_layer_stack", "push_dynamic_layer_stack",
    )
)  # fmt: skip
_EXT = f"{__package__}._fused_ext"  # compiled from functd/_fused_ext.c by setup.py
_LOCK = threading.Lock()
_KERNEL = None  # None: not loaded yet; False: unavailable (pure path); else the run function
_TRITON: Any = None  # None: not tried yet; False: unavailable; else the module _triton_draws


def _import():
    """The extension's ``run``; raise ImportError naming why it cannot serve."""
    ext = importlib.import_module(_EXT)
    if getattr(ext, "VERSION", None) != VERSION:
        raise ImportError(
            f"{ext.__file__} was built from another version of the kernel "
            f"(version {getattr(ext, 'VERSION', None)}, this functd needs {VERSION})"
        )
    return ext.run


def _load():
    """The kernel, imported once per process (under a lock); False where unavailable."""
    global _KERNEL
    reason = None
    with _LOCK:
        if _KERNEL is None:
            if os.environ.get("FUNCTD_FUSED_RANDOM", "1").strip() in ("0", "false", "off"):
                _KERNEL = False
            else:
                try:
                    _KERNEL = _import()
                except ImportError as e:
                    _KERNEL, reason = False, str(e)
    if reason is not None:
        warnings.warn(
            "functd.random: the fused CPU kernel (the extension module functd._fused_ext, "
            f"compiled when functd is installed) is unavailable: {reason}. Draws use the pure "
            "torch-op path (the same bits, slower). Reinstall functd where a C compiler is "
            "found (`pip install -e .` in a checkout) to build it, or set "
            "FUNCTD_FUSED_RANDOM=0 to choose the pure path without this warning.",
            RuntimeWarning,
            stacklevel=4,
        )
    return _KERNEL


def variant() -> str | None:
    """The instruction set the loaded kernel runs with (``avx512f``, ``avx2``,
    ``baseline``), or None on the pure path."""
    if not (_KERNEL if _KERNEL is not None else _load()):
        return None
    return importlib.import_module(_EXT).VARIANT


def _vmap_only() -> bool:
    """Whether every active torch.func level is a vmap (no grad/jvp/functionalize)."""
    return all(i.key() == _VMAP for i in _stack())


#: What ``_serves`` answers: the pure ops run (falsy), or the kernel serves a plain eager
#: CPU key, or a CPU key under vmap levels only (unwrapped, drawn, wrapped back); the
#: ``CUDA_`` cases: the same for a CUDA key, served by a Triton launch.
PURE, EAGER, UNDER_VMAP, CUDA_EAGER, CUDA_UNDER_VMAP = 0, 1, 2, 3, 4


def _serves(key: Tensor) -> int:
    """``PURE``, ``EAGER``, ``UNDER_VMAP`` or their ``CUDA_`` cases: how a draw from
    ``key`` may be served."""
    plain = plain_tensor(key)  # (False under dynamo, which then sees nothing else here)
    if (
        (not plain and (torch.compiler.is_compiling() or type(key) is not Tensor))
        or not ((cpu := key.is_cpu) or _cuda_key(key))
        or not _HOOKS
        or _dispatch_modes()
        or _function_mode()  # e.g. `with torch.device(...)`
        or _tracing() is not None
    ):
        return PURE
    if _transforms() is None:  # no torch.func level: only a plain key
        if cpu:
            return EAGER if plain else PURE
        return CUDA_EAGER if plain else PURE
    how = UNDER_VMAP if _VMAP_HOOKS and _vmap_only() else PURE
    return how if cpu or not how else CUDA_UNDER_VMAP


def _cuda_key(key: Tensor) -> bool:
    """Whether ``key`` is on an NVIDIA GPU and the Triton kernels are ready (triton is
    imported at the first CUDA draw; where it does not import, CUDA draws stay pure)."""
    global _TRITON
    if not key.is_cuda or torch.version.hip is not None:
        return False
    if _TRITON is None:
        from . import _triton_draws

        _TRITON = _triton_draws if _triton_draws.available() is None else False
    return bool(_TRITON)


def _on_cuda(how: int, fn, tensors: tuple[Tensor, ...], *args):
    """``fn(*tensors, *args)``, a Triton launcher (under vmap: the levels unwrapped). A
    launch that fails (a GPU or toolkit triton cannot compile for) warns once and turns
    the Triton path off: the pure ops serve from then on (the same bits)."""
    global _TRITON
    try:
        return fn(*tensors, *args) if how == CUDA_EAGER else _under_vmap(fn, tensors, *args)
    except torch.OutOfMemoryError:
        raise
    except Exception as e:
        _TRITON = False
        warnings.warn(
            f"functd.random: the Triton kernel for CUDA draws failed ({type(e).__name__}: "
            f"{e}); CUDA draws use the pure torch-op path from now on (the same bits).",
            RuntimeWarning,
            stacklevel=4,
        )
        return None


def usable(key: Tensor) -> bool:
    """Whether a draw from ``key`` may take the kernel (a plain key or one under vmap)."""
    return bool(_serves(key)) and bool(_KERNEL if _KERNEL is not None else _load())


# -- under vmap: unwrap the levels, one draw, wrap back -------------------------------


def _lift(tensors: tuple[Tensor, ...]):
    """Plain tensors ``(*level sizes, *logical shape)`` and the vmap levels, lowest first.

    Each batched tensor is unwrapped level by level; its batch dims move to the front,
    in level order, with a size-1 dim for a level it is not batched at. None where a
    tensor holds another torch.func wrapper.
    """
    unwrapped = []
    for t in tensors:
        dims: dict[int, int] = {}
        bdims = []
        while _is_batched(t):
            level = _F.maybe_get_level(t)
            t, bdim = _F._unwrap_batched(t, level)
            bdims.append((level, bdim))
        if is_wrapped(t):
            return None
        phys = list(range(t.ndim))
        for level, bdim in reversed(bdims):  # the lowest level wraps the plain tensor
            dims[level] = phys.pop(bdim)
        unwrapped.append((t, dims, phys))
    levels = sorted({lv for _, dims, _ in unwrapped for lv in dims})
    out = []
    for t, dims, phys in unwrapped:
        t = t.permute([*[dims[lv] for lv in levels if lv in dims], *phys])  # a list: 0-d too
        for i, lv in enumerate(levels):
            if lv not in dims:
                t = t.unsqueeze(i)
        out.append(t)
    return out, levels


def _wrap(out: Tensor, levels: list[int]) -> Tensor:
    """Wrap a plain ``(*level sizes, ...)`` result back at ``levels`` (lowest first)."""
    for level in levels:
        out = _F._add_batch_dim(out, 0, level)
    return out


def _under_vmap(fn, tensors: tuple[Tensor, ...], *args):
    """``fn(*plain tensors, *args, number of levels)`` with every torch.func level
    popped (plain eager ops), its result wrapped back at the levels."""
    popped, out = [], None
    try:
        while _transforms() is not None:
            popped.append(_F.pop_dynamic_layer_stack())
        if (lifted := _lift(tensors)) is not None:
            plain, levels = lifted
            out = fn(*plain, *args, len(levels))
    finally:
        while popped:
            _F.push_dynamic_layer_stack(popped.pop())
    return None if out is None else _wrap(out, levels)


# -- the draws --------------------------------------------------------------------------


def _empty(key: Tensor, shape: tuple[int, ...], dtype: torch.dtype, pairs: bool = False):
    """A fresh CPU output ``(*key.shape[:-1], *shape)`` (``pairs``: a trailing 2).

    No device mode is on (``_serves``), so it lands on the CPU; sizes as separate ints
    parse quicker than a tuple.
    """
    if key.ndim == 1:
        dims = (*shape, 2) if pairs else shape
    else:
        dims = (*key.shape[:-1], *shape, 2) if pairs else (*key.shape[:-1], *shape)
    return torch.empty(*dims, dtype=dtype) if dims else torch.empty((), dtype=dtype)


def run(
    mode: int,
    key: Tensor,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    a: float = 0.0,
    b: float = 0.0,
    first: int = 0,
) -> Tensor | None:
    """One kernel call over counters ``first + range(prod(shape))`` of every key in ``key``.

    Returns a fresh ``(*key.shape[:-1], *shape)`` tensor (``MODE_PAIRS``: a trailing 2),
    or None where the kernel may not serve (the caller runs the pure ops).
    """
    how = _serves(key)
    if not how or not (fn := _KERNEL if _KERNEL is not None else _load()):
        return None
    if how >= UNDER_VMAP:  # (one test for the rarer cases: the eager CPU draw pays one)
        if how == UNDER_VMAP:
            return _under_vmap(_run, (key,), fn, mode, shape, dtype, a, b, first)
        return _on_cuda(how, _TRITON.run, (key,), mode, shape, dtype, a, b, first)
    return _run(key, fn, mode, shape, dtype, a, b, first)


def _run(key, fn, mode, shape, dtype, a, b, first, nlev=0):
    key = key.contiguous()
    n = math.prod(shape)
    if key.ndim == 1:  # one key: the common case, inlined (no device mode is on: cpu)
        total = n
        if mode == MODE_PAIRS:
            out = torch.empty(*shape, 2, dtype=dtype)
        else:
            out = torch.empty(*shape, dtype=dtype) if shape else torch.empty((), dtype=dtype)
    else:
        total = n * (key.numel() // 2)
        out = _empty(key, shape, dtype, mode == MODE_PAIRS)
    if total:
        threads = torch.get_num_threads() if total >= _THREADED else 1
        op, ptr = mode | threads << 8, key.data_ptr()
        if mode in (MODE_AFFINE32, MODE_RANGE32):
            fn(op, ptr, total, n, first, out.data_ptr(), 0, a, b)
        else:
            fn(op, ptr, total, n, first, out.data_ptr())
    return out


def fold(key: Tensor, data: Tensor) -> Tensor | None:
    """``fold_in(key, data)`` for an int32 tensor ``data`` (broadcast with the key batch)."""
    how = _serves(key)
    if not how or not (fn := _KERNEL if _KERNEL is not None else _load()):
        return None
    if how >= UNDER_VMAP:
        if data.device != key.device:
            return None
        if how == UNDER_VMAP:
            return _under_vmap(_fold, (key, data), fn)
        if how == CUDA_EAGER and not plain_tensor(data):
            return None
        return _on_cuda(how, _TRITON.fold, (key, data))
    return _fold(key, data, fn) if data.is_cpu and plain_tensor(data) else None


def _fold(key: Tensor, data: Tensor, fn, nlev: int = 0) -> Tensor:
    # under vmap: (*levels, *batch) - the logical batch dims align on the right
    kb, db = key.shape[nlev:-1], data.shape[nlev:]
    nd = max(len(kb), len(db))
    key = key.reshape((*key.shape[:nlev], *[1] * (nd - len(kb)), *kb, 2))
    data = data.reshape((*data.shape[:nlev], *[1] * (nd - len(db)), *db))
    shape = torch.broadcast_shapes(key.shape[:-1], data.shape)
    keys = key.expand((*shape, 2)).contiguous()
    data = data.expand(shape).contiguous()
    out = torch.empty((*shape, 2), dtype=torch.int32)
    if total := math.prod(shape):
        op = MODE_FOLD | (torch.get_num_threads() if total >= _THREADED else 1) << 8
        fn(op, keys.data_ptr(), total, 1, 0, out.data_ptr(), data.data_ptr(), 0.0, 0.0)
    return out


def normal32(key: Tensor, shape: tuple[int, ...]) -> Tensor | None:
    """float32 ``normal``: the kernel, torch's ``log1p`` and ``sqrt`` (their bits), the kernel."""
    how = _serves(key)
    if not how or not (fn := _KERNEL if _KERNEL is not None else _load()):
        return None
    if how >= UNDER_VMAP:
        if how == UNDER_VMAP:
            return _under_vmap(_normal32, (key,), fn, shape)
        return _on_cuda(how, _TRITON.run, (key,), TRITON_NORMAL32, shape, torch.float32)
    return _normal32(key, fn, shape)


def _gt_room(total: int) -> int:
    """Room for the elements of a normal draw past XLA's first polynomial (~1 in 300)."""
    return total // 64 + 64


def _normal32(key: Tensor, fn, shape: tuple[int, ...], nlev: int = 0) -> Tensor:
    key = key.contiguous()
    n = math.prod(shape)
    total = n if key.ndim == 1 else n * (key.numel() // 2)
    x, t = _empty(key, shape, torch.float32), _empty(key, shape, torch.float32)
    if total:
        threads = (torch.get_num_threads() if total >= _THREADED else 1) << 8
        xp, tp = x.data_ptr(), t.data_ptr()
        fn(MODE_NORMAL_PRE | threads, key.data_ptr(), total, n, 0, xp, tp, _NEXT_M1, 0.0)
        t.log1p_()  # torch's log1p: its bits (the same at any position of any buffer)
        # erf_inv's first polynomial, listing the |x| > 0.9966 that need the second one
        # (one float32 buffer: room int64 indices, then room values of w)
        room = _gt_room(total)
        buf = torch.empty(3 * room)
        at, wp = buf.data_ptr(), buf.data_ptr() + 8 * room
        count = fn(MODE_ERFINV_LT, tp, total, room, at, xp, wp, _SQRT2_32, 0.0)
        if count:
            if count > room:  # (no room for all: list them again)
                room, buf = count, torch.empty(3 * count)
                at, wp = buf.data_ptr(), buf.data_ptr() + 8 * room
                fn(MODE_ERFINV_GATHER, tp, total, 0, at, 0, wp, 0.0, 0.0)
            buf[2 * room : 2 * room + count].sqrt_()  # torch's sqrt: its bits
            fn(MODE_ERFINV_GT, 0, count, 0, at, xp, wp, _SQRT2_32, 0.0)
    return x
