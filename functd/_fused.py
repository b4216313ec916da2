"""Fused eager CPU kernels for ``functd.random``: one C call per draw instead of ~500 ops.

The first eligible draw in a process builds ``_fused_c.SOURCE`` with the system C
compiler (``$CC``, else ``cc``) into a cache folder (``$FUNCTD_CACHE_DIR``, else
``$XDG_CACHE_HOME/functd`` or ``~/.cache/functd``), keyed by a hash of the source,
the flags, Python and the CPU, and loads it: as a CPython extension where Python.h
is found (~0.1 µs a call), else as a plain library through ctypes (~1.5 µs a call);
later processes only load it.
Where that fails (no compiler, a compile error, an unwritable folder), ONE
``RuntimeWarning`` names the reason and every draw keeps the pure-op path, which
gives the same bits. ``FUNCTD_FUSED_RANDOM=0`` chooses the pure path silently.

Only plain eager CPU tensors take the kernel: not under ``torch.func``
transforms, ``torch.compile``/dynamo, ``torch.jit`` tracing, a dispatch mode
(FakeTensor) or a function mode (``with torch.device(...)``), nor for meta/CUDA
keys; there the pure ops run (and the outer transform fuses them).
See notes/prng.md for the design and figures.

Example:
    >>> out = run(MODE_UNIT32, functd.random.key(0), (4,), torch.float32)  # None: pure path
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import math
import os
import pathlib
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings

import torch
from torch import Tensor

from ._fused_c import SOURCE

# The kernel's modes (the enum at the top of SOURCE).
MODE_PAIRS, MODE_BITS32, MODE_BITS64, MODE_UNIT32, MODE_NORMAL_PRE = range(5)
MODE_AFFINE32, MODE_NEG32, MODE_UNIT64, MODE_ERFINV = range(5, 9)
_FLAGS = ("-O3", "-fPIC", "-shared", "-pthread", "-ffp-contract=off", "-fno-math-errno")
_THREADED = 32768  # the kernel's threshold for splitting a draw over threads
_NEXT_M1 = -(1.0 - 2.0**-24)  # float32 nextafter(-1, 0), exact
_SQRT2_32 = float(torch.tensor(math.sqrt(2.0), dtype=torch.float32))

_is_wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None)
_transforms = getattr(torch._C._functorch, "peek_interpreter_stack", None)
_function_mode = torch._C._is_torch_function_mode_enabled
_tracing = torch._C._get_tracing_state
_HOOKS = None not in (_is_wrapped, _dispatch_modes, _transforms)  # else: pure path always
_LOCK = threading.Lock()
_KERNEL = None  # None: not loaded yet; False: unavailable (pure path); else (draw, run)


class _Unavailable(Exception):
    """Why the kernel cannot be built or loaded (the warning's reason)."""


def cache_dir() -> pathlib.Path:
    """Where built kernels live: ``$FUNCTD_CACHE_DIR`` or the user's cache folder."""
    if os.environ.get("FUNCTD_CACHE_DIR"):
        return pathlib.Path(os.environ["FUNCTD_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return pathlib.Path(os.environ["XDG_CACHE_HOME"]) / "functd"
    home = os.path.expanduser("~")
    if home == "~":  # no home folder: never a path relative to the cwd
        return pathlib.Path(tempfile.gettempdir()) / "functd-cache"
    return pathlib.Path(home) / ".cache" / "functd"


def _cpu_tag() -> str:
    """The CPU's feature flags (a kernel built with -march=native runs only there)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def _compile(cc: list[str], extra: list[str], folder: pathlib.Path) -> pathlib.Path:
    """Build (or find) the shared library for these flags; raise _Unavailable on failure."""
    tag = "\0".join([SOURCE, *cc, *_FLAGS, *extra, sys.version, platform.machine(), _cpu_tag()])
    lib = folder / f"threefry-{hashlib.sha256(tag.encode()).hexdigest()[:20]}.so"
    if lib.exists():
        return lib
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(fd)
    try:
        cmd = [*cc, *_FLAGS, *extra, "-x", "c", "-", "-o", tmp]
        done = subprocess.run(cmd, input=SOURCE, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise _Unavailable(f"`{shlex.join(cmd[:1])}` failed: {last}")
        os.replace(tmp, lib)  # atomic: concurrent builders never see half a file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


def _open(lib: pathlib.Path, python: bool):
    """``(draw, run)``: callables taking (op, keys, total, n, first, out[, out2, a, b])."""
    if python:  # the CPython extension: one function for both
        loader = importlib.machinery.ExtensionFileLoader("_functd_threefry", str(lib))
        module = importlib.util.module_from_spec(
            importlib.util.spec_from_loader(loader.name, loader)
        )
        loader.exec_module(module)
        return module.run, module.run
    dll = ctypes.CDLL(str(lib))
    draw, run = dll.fd_draw, dll.fd_run
    i32, i64, ptr, f64 = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_double
    draw.argtypes = [i32, ptr, i64, i64, i64, ptr]
    run.argtypes = [i32, ptr, i64, i64, i64, ptr, ptr, f64, f64]
    draw.restype = run.restype = i32
    return draw, run


def _build():
    """Find or build the kernel and load it: a CPython extension, else a ctypes library."""
    cc = shlex.split(os.environ.get("CC") or "cc")
    if not cc or shutil.which(cc[0]) is None:
        raise _Unavailable(f"no C compiler: {cc[0] if cc else '$CC'!r} was not found (set CC)")
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()  # writable?
    except OSError as e:
        raise _Unavailable(f"the cache folder {str(folder)!r} is not writable ({e})") from None
    # -march=native vectorises the hash for this CPU; Python.h may be missing
    include = sysconfig.get_paths().get("include") or ""
    ext = ["-DFD_PYTHON", f"-I{include}"]
    if sys.platform == "darwin":
        ext += ["-undefined", "dynamic_lookup"]
    tries = [(True, [*ext, "-march=native"]), (False, ["-march=native"]), (False, [])]
    if not os.path.exists(os.path.join(include, "Python.h")):
        tries = tries[1:]
    error: Exception | None = None
    for python, extra in tries:
        try:
            return _open(_compile(cc, extra, folder), python)
        except (
            _Unavailable,
            OSError,
            ImportError,
            AttributeError,
            subprocess.SubprocessError,
        ) as e:
            error = e
    raise _Unavailable(f"compiling the kernel failed ({error})")


def _load():
    """The kernel, built once per process (under a lock); False where unavailable."""
    global _KERNEL
    reason = None
    with _LOCK:
        if _KERNEL is None:
            if os.environ.get("FUNCTD_FUSED_RANDOM", "1").strip() in ("0", "false", "off"):
                _KERNEL = False
            else:
                try:
                    _KERNEL = _build()
                except _Unavailable as e:
                    _KERNEL, reason = False, str(e)
    if reason is not None:
        warnings.warn(
            f"functd.random: the fused CPU kernel is unavailable: {reason}. Draws use the "
            "pure torch-op path (the same bits, slower); set FUNCTD_FUSED_RANDOM=0 to "
            "choose it without this warning.",
            RuntimeWarning,
            stacklevel=4,
        )
    return _KERNEL


def usable(key: Tensor) -> bool:
    """Whether a draw from ``key`` may take the kernel: a plain eager CPU tensor."""
    return (
        not torch.compiler.is_compiling()  # first: dynamo must see nothing else here
        and type(key) is Tensor
        and key.is_cpu
        and _HOOKS
        and _transforms() is None  # under grad/vmap even a fresh torch.empty is wrapped
        and not _is_wrapped(key)
        and not _dispatch_modes()
        and not _function_mode()  # e.g. `with torch.device(...)`
        and _tracing() is None
    )


def _empty(key: Tensor, shape: tuple[int, ...], dtype: torch.dtype, pairs: bool = False):
    """A fresh CPU output ``(*key.shape[:-1], *shape)`` (``pairs``: a trailing 2).

    No device mode is on (``usable``), so it lands on the CPU; sizes as separate ints
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
    if not usable(key) or not (fns := _KERNEL if _KERNEL is not None else _load()):
        return None
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
        if mode == MODE_AFFINE32:
            fns[1](op, ptr, total, n, first, out.data_ptr(), 0, a, b)
        else:
            fns[0](op, ptr, total, n, first, out.data_ptr())
    return out


def normal32(key: Tensor, shape: tuple[int, ...]) -> Tensor | None:
    """float32 ``normal``: the kernel, torch's ``log1p`` and ``sqrt`` (their bits), the kernel."""
    if not usable(key) or not (fns := _KERNEL if _KERNEL is not None else _load()):
        return None
    key = key.contiguous()
    n = math.prod(shape)
    total = n if key.ndim == 1 else n * (key.numel() // 2)
    x, t = _empty(key, shape, torch.float32), _empty(key, shape, torch.float32)
    if total:
        fn = fns[1]
        threads = (torch.get_num_threads() if total >= _THREADED else 1) << 8
        ptr = x.data_ptr()
        fn(MODE_NORMAL_PRE | threads, key.data_ptr(), total, n, 0, ptr, t.data_ptr(), _NEXT_M1, 0.0)
        # the pure path's torch ops on buffers of the same size and layout: the same bits
        w = t.log1p_().neg_()
        s = torch.sqrt(w)
        fn(MODE_ERFINV | threads, ptr, total, n, 0, w.data_ptr(), s.data_ptr(), _SQRT2_32, 0.0)
    return t
