"""fd.jit and inductor's on-disk caches: a warm start loads the compiled code from disk.

A second process that compiles the same function with the same signature finds
inductor's compiled graph in its FX graph cache instead of generating and building
the code again. inductor keys that cache on the graph (the bodies of loop ops
included: they are submodules of the keyed graph), the inputs' metadata, its config
(fd.jit's options; its passes through their ``uuid()``) and torch's version; it
looks the key up only when a shape env is current (``_jit_trace.compile_graph``
makes the trace's current), and refuses higher-order ops it does not know to be
cacheable: ``disk_cache`` marks the loop ops fd.scan/fd.while_loop trace to
(``scan``, ``while_loop``) for the compile.

The cache directory is torch's: ``TORCHINDUCTOR_CACHE_DIR``, by default
``<tmp>/torchinductor_<user>``. torch loads code from it without checking who can
write it, so fd.jit does (``unsafe_reason``): a directory owned by another user, or
that group or others can write (itself, or a parent without the sticky bit), turns
the caches off for the compile, which writes its files into a new private temporary
directory instead, with one ``JitWarning`` per directory naming it and the fix. A
directory that does not exist yet is created private (mode 0o700), whatever the umask.

Example:
    >>> with disk_cache("fd.jit(f)", UserWarning) as disk:
    ...     run, source = compile_graph(traced, "inductor")
    >>> disk.hit  # True: the compiled code came from inductor's cache on disk
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import warnings
from collections.abc import Iterator

__all__ = ["Disk", "cache_dir", "disk_cache", "unsafe_reason"]

#: the loop ops fd.scan / fd.while_loop trace to (``functd._torch.hop``), by the name
#: inductor's ``unsafe_marked_cacheable_functions`` knows them under
LOOP_OPS = ("torch.ops.higher_order.scan", "torch.ops.higher_order.while_loop")
_WARNED: set[str] = set()  # directories warned about (at most _MAX_WARNED)
_MAX_WARNED = 16

UNSAFE_DIR = (
    "{name}: inductor's cache directory {path} {why}; code loaded from it would run in "
    "this process, so fd.jit compiled without the on-disk caches, in a private temporary "
    "directory (no warm start from disk). Fix: `chmod go-w {path}` if it is yours, or point TORCHINDUCTOR_CACHE_DIR at "
    "a directory only you can write (e.g. one under your home). Shown once per directory."
)


class Disk:
    """What ``disk_cache`` found: ``hit`` (the code came from disk), ``enabled``."""

    __slots__ = ("enabled", "hit")

    def __init__(self) -> None:
        self.hit = False
        self.enabled = False


def cache_dir() -> str:
    """inductor's cache directory (``TORCHINDUCTOR_CACHE_DIR`` or torch's default),
    absolute; not created."""
    from .._torch.inductor import default_cache_dir

    return os.path.abspath(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir())


def unsafe_reason(path: str) -> str | None:
    """Why another user could write the code in ``path`` (None: they cannot): the
    directory is not ours or others can write it, or a parent directory is another
    user's (root's is fine) or writable by others without the sticky bit (/tmp's
    is set), so they could swap ``path`` for their own. A missing directory is
    created with mode 0o700 (its missing parents too)."""
    getuid = getattr(os, "getuid", None)
    if getuid is None:  # Windows: no owner and mode bits to read
        return None
    try:
        _makedirs_private(path)
        st = os.stat(path)
    except OSError as e:
        return f"cannot be created or read ({e.strerror})"
    if st.st_uid != getuid():
        return f"belongs to another user (uid {st.st_uid}, not {getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"can be written by its group or by others (mode {stat.filemode(st.st_mode)})"
    parent = os.path.dirname(path)
    while parent != path:
        up = os.stat(parent)
        if up.st_uid not in (0, getuid()):
            return f"is inside {parent}, which belongs to another user (uid {up.st_uid})"
        if up.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not up.st_mode & stat.S_ISVTX:
            return f"is inside {parent}, which others can write (mode {stat.filemode(up.st_mode)})"
        path, parent = parent, os.path.dirname(parent)
    return None


def _makedirs_private(path: str) -> None:
    """``os.makedirs`` with mode 0o700 for every directory it creates (makedirs gives
    the parents it creates the umask's default mode)."""
    missing = []
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    for p in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(p, 0o700)


@contextlib.contextmanager
def _private_dir() -> Iterator[None]:
    """inductor's caches off and its files in a new private temporary directory."""
    from .._torch.inductor import config

    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="functd_inductor_")
    try:
        with config.patch(force_disable_caches=True):
            yield
    finally:
        if old is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old


@contextlib.contextmanager
def disk_cache(name: str, category: type[Warning], inductor: bool = True) -> Iterator[Disk]:
    """inductor's on-disk caches for the compile inside the block: the loop ops marked
    cacheable, or every cache off where the directory is unsafe (one warning of
    ``category`` per directory). ``Disk.hit``: the FX graph cache answered.
    ``inductor=False`` (fd.jit's "fx" backend): nothing to do."""
    from .._torch.dynamo import counters
    from .._torch.inductor import config

    disk = Disk()
    if not inductor or config.force_disable_caches or not config.fx_graph_cache:
        yield disk  # caches off by the user: nothing is read from disk
        return
    path = cache_dir()
    why = unsafe_reason(path)
    if why is not None:
        if path not in _WARNED:
            if len(_WARNED) >= _MAX_WARNED:
                _WARNED.clear()
            _WARNED.add(path)
            warnings.warn(UNSAFE_DIR.format(name=name, path=path, why=why), category, 4)
        with _private_dir():
            yield disk
        return
    marked = {**config.unsafe_marked_cacheable_functions}
    marked.update(dict.fromkeys(LOOP_OPS, "functd"))
    hits = counters["inductor"]["fxgraph_cache_hit"]
    disk.enabled = True
    with config.patch(unsafe_marked_cacheable_functions=marked):
        yield disk
    disk.hit = counters["inductor"]["fxgraph_cache_hit"] > hits
