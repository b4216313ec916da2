"""One Triton launch per ``functd.random`` draw on CUDA: the launchers of
``_triton_kernels.py``, called by ``_fused.py`` where a CUDA key would otherwise take
the ~100 small kernels of the pure-op path.

``run``/``fold`` take plain keys ``(*batch, 2)`` (under vmap, ``_fused._under_vmap``
unwraps the levels first: one launch over every key of every level) and return a fresh
tensor on the key's device, bitwise equal to the CPU kernel (``_fused_ext.c``) and to
the pure path. ``MODE_NORMAL32`` finishes XLA's ``erf_inv`` in the same launch, with
libdevice's ``log1pf``/``fsqrt_rn``, the functions torch's CUDA ``log1p``/``sqrt`` call:
its bits are meant to be the pure path's on the same GPU (the CUDA-marked test of
tests/test_triton_draws.py checks it). torch's CPU ``log1p`` is another function, so a
CPU and a CUDA normal may differ in the last bit, on the pure path as here.

Nothing is compiled here but Triton's kernels, into Triton's own cache. ``available()``
says whether triton imports (and why not); ``time_draws`` times the draws for the GPU
benchmark.

Example:
    >>> z = run(functd.random.key(0, device="cuda"), MODE_NORMAL32, (1024,), torch.float32)
"""

from __future__ import annotations

import contextlib
import importlib
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

# The modes (the values of _triton_kernels' constexprs; those of _fused_ext.c agree).
MODE_PAIRS, MODE_BITS32, MODE_BITS64, MODE_UNIT32 = 0, 1, 2, 3
MODE_AFFINE32, MODE_NEG32, MODE_UNIT64, MODE_RANGE32 = 5, 6, 7, 9
MODE_NORMAL32, MODE_UNIT16, MODE_UNITBF16 = 100, 101, 102
BLOCK = 1024  # elements per program
_WIDE = 2**31 - BLOCK  # from here on: 64-bit indices and counters
_NEXT_M1 = -(1.0 - 2.0**-24)  # float32 nextafter(-1, 0), exact
_SQRT2_32 = float(torch.tensor(math.sqrt(2.0), dtype=torch.float32))
# bitwise equality with torch's CUDA ops: no FMA contraction, libdevice without FTZ
# (those of the options this triton has: see _options)
_WANTED = {"enable_fp_fusion": False, "enable_reflect_ftz": False}
_OPTIONS: dict[str, bool] | None = None

_kernels: Any = None  # the module _triton_kernels, once imported


def available() -> str | None:
    """None where triton imports (the kernels are ready), else the reason it does not."""
    global _kernels
    if _kernels is None:
        try:
            _kernels = importlib.import_module(f"{__package__}._triton_kernels")
        except Exception as e:  # (ImportError, or a triton that fails on import)
            return f"triton does not import: {type(e).__name__}: {e}"
    return None


def _device(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """Triton launches on the current CUDA device: make ``device`` current where it is not."""
    if device.type == "cuda" and device.index not in (None, torch.cuda.current_device()):
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def _options(device: torch.device) -> dict[str, bool]:
    """Compile options for a launch on ``device`` (the interpreter takes none)."""
    global _OPTIONS
    if device.type != "cuda":
        return {}
    if _OPTIONS is None:  # (a triton without an option would refuse the keyword)
        from triton.backends.nvidia.compiler import CUDAOptions

        fields = getattr(CUDAOptions, "__dataclass_fields__", {})
        _OPTIONS = {k: v for k, v in _WANTED.items() if k in fields}
    return _OPTIONS


def run(
    key: Tensor,
    mode: int,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    a: float = 0.0,
    b: float = 0.0,
    first: int = 0,
    nlev: int = 0,
) -> Tensor:
    """One launch over counters ``first + range(prod(shape))`` of every key in ``key``:
    a fresh ``(*key.shape[:-1], *shape)`` tensor (``MODE_PAIRS``: a trailing 2).

    ``MODE_NORMAL32`` ignores ``a``/``b`` (its constants are fixed); ``nlev``: the vmap
    levels ``_fused._under_vmap`` unwrapped (their dims lead ``key``'s batch)."""
    key = key.contiguous()
    n = math.prod(shape)
    total = n * (key.numel() // 2)
    dims = (*key.shape[:-1], *shape, 2) if mode == MODE_PAIRS else (*key.shape[:-1], *shape)
    out = torch.empty(dims, dtype=dtype, device=key.device)
    if total:
        if mode == MODE_NORMAL32:
            a, b = _NEXT_M1, _SQRT2_32
        wide = total >= _WIDE or first + n > 2**31 - 1
        with _device(key.device):
            _kernels.draw_kernel[(_cdiv(total, BLOCK),)](
                key, out, n, total, first, a, b, MODE=mode, ONE_KEY=key.numel() == 2,
                WIDE=wide, BLOCK=BLOCK, **_options(key.device),
            )  # fmt: skip
    return out


def _cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ints."""
    return -(-a // b)


def fold(key: Tensor, data: Tensor, nlev: int = 0) -> Tensor:
    """``fold_in(key, data)`` for int32 ``data`` broadcast with the key batch: one launch.

    Under vmap (``nlev`` levels unwrapped) the logical batch dims align on the right."""
    kb, db = key.shape[nlev:-1], data.shape[nlev:]
    nd = max(len(kb), len(db))
    key = key.reshape((*key.shape[:nlev], *[1] * (nd - len(kb)), *kb, 2))
    data = data.reshape((*data.shape[:nlev], *[1] * (nd - len(db)), *db))
    shape = tuple(torch.broadcast_shapes(key.shape[:-1], data.shape))  # type: ignore[no-untyped-call]
    out = torch.empty((*shape, 2), dtype=torch.int32, device=key.device)
    total = math.prod(shape)
    if total:  # one key or one datum is read by every element, else one each
        one_key, one_datum = key.numel() == 2, data.numel() == 1
        key = key.reshape(2) if one_key else key.expand((*shape, 2)).contiguous()
        data = data.reshape(1) if one_datum else data.expand(shape).contiguous()
        with _device(key.device):
            _kernels.fold_kernel[(_cdiv(total, BLOCK),)](
                key, data, out, total, KEY_STEP=int(not one_key),
                DATA_STEP=int(not one_datum), BLOCK=BLOCK, **_options(key.device),
            )  # fmt: skip
    return out


def time_draws(
    n: int = 1024,
    *,
    keys: int = 1,
    device: str | torch.device = "cuda",
    reps: int = 50,
) -> dict[str, float]:
    """Median microseconds of one launch of each kernel (``n`` values under each of
    ``keys`` keys; ``split``: ``n`` keys; ``fold_in``: one per key), the launch and a
    device synchronize timed together, beside ``torch.randn``/``torch.rand`` of as many
    values timed the same way. For ``benchmarks/gpu_check.py``; ``device="cpu"`` runs
    Triton's interpreter where ``TRITON_INTERPRET=1`` was set before the import.

    Example:
        >>> time_draws(2**24)["normal"]  # microseconds
        412.5
    """
    if (why := available()) is not None:
        raise RuntimeError(f"time_draws: {why}")
    dev = torch.device(device)
    key = torch.zeros((keys, 2) if keys > 1 else (2,), dtype=torch.int32, device=dev)
    key[..., 1] = torch.arange(keys, dtype=torch.int32, device=dev).reshape(key.shape[:-1])
    size = (keys, n) if keys > 1 else (n,)
    data = torch.arange(keys, dtype=torch.int32, device=dev).reshape(key.shape[:-1])
    cases: dict[str, Callable[[], Tensor]] = {
        "normal": lambda: run(key, MODE_NORMAL32, (n,), torch.float32),
        "uniform": lambda: run(key, MODE_UNIT32, (n,), torch.float32),
        "bits": lambda: run(key, MODE_BITS32, (n,), torch.int32),
        "split": lambda: run(key, MODE_PAIRS, (n,), torch.int32),
        "fold_in": lambda: fold(key, data),
        "torch.randn": lambda: torch.randn(size, device=dev),
        "torch.rand": lambda: torch.rand(size, device=dev),
    }
    sync: Callable[[], None] = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    out = {}
    for name, fn in cases.items():
        fn()  # (the first launch compiles, or loads from Triton's cache)
        sync()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        out[name] = 1e6 * statistics.median(times)
    return out
