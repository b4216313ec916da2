"""Saving and loading TensorDicts (and any pytree of them): atomic, verified files.

``save`` writes torch's zip format through ``_atomic.atomic_write`` (temporary
file, fsync, ``os.replace``, fsync of the folder): a crash leaves the old file
or the new one. It writes only what the tree holds: a leaf that is a view of a
larger storage (``big[:10]``) is copied first, because torch saves a tensor's
whole storage.

``load`` reads only regular files, verifies the archive (``_archive.verify``:
layout, declared sizes, compression ratio, every CRC-32) before anything is
unpickled, then uses ``torch.load(weights_only=True)``: a file that holds
pickled code (any global other than tensors, containers and TensorDict) fails
to load, with a ``pickle.UnpicklingError``, and runs nothing. Its errors say
which of these it is: empty, truncated, damaged, not a torch file, a bomb, an
invalid TensorDict, refused code; a tensordict memmap folder gets the way to
convert it, and a ``tensordict.TensorDict`` saved with ``torch.save`` loads as
an ``fd.TensorDict``.

Example:
    >>> fd.save(td, "td.pt")
    >>> fd.testing.assert_close(fd.load("td.pt"), td)
"""

from __future__ import annotations

import errno
import os
import pickle
import pickletools
import stat
import sys
from typing import Any

import optree
import torch

from . import _safetensors
from ._archive import pickle_member, verify
from ._atomic import atomic_write
from ._tensordict import TensorDict
from ._tree import NAMESPACE

__all__ = ["load", "save"]


def _compact(t: Any) -> Any:
    """A copy of a tensor that views a larger storage; anything else as is."""
    if type(t) is not torch.Tensor or t.layout is not torch.strided or t.is_meta:
        return t
    try:
        held = t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):  # no plain storage (e.g. a functorch wrapper)
        return t
    return t.clone() if held > t.numel() * t.element_size() else t


def save(obj: Any, path: str | os.PathLike[str]) -> None:
    """Save a TensorDict (or a pytree of tensors and TensorDicts) to ``path``, atomically.

    A path ending in ``.safetensors`` writes the safetensors format (needs the
    ``safetensors`` package): ``state_dict``-style dotted names that
    ``safetensors.torch.load_file`` + ``nn.Module.load_state_dict`` read, the tree and
    batch sizes in the metadata, a CRC-32 per tensor; any other path writes torch's
    zip format (``torch.save``), which holds any dtype and any pytree.

    Only what the tree holds is written: a leaf that views a larger tensor
    (``x[:10]``) is saved as a copy of those elements, not with the storage
    it shares. (Leaves that shared a storage are loaded as separate tensors.)

    The file is written whole to a temporary file in the same folder, flushed
    and fsynced, then moved onto ``path`` with ``os.replace`` and the folder is
    fsynced: a crash or a ``kill -9`` at any moment leaves either the previous
    file or the new one at ``path``, never a partial one. If ``path`` is a
    symlink, the link itself is replaced by the new file (the file it pointed
    to is left unchanged). An existing file's permission bits are kept. A kill
    during the write may leave a temporary ``.<name>.fdsave-*.tmp`` beside
    ``path``; the next ``save`` of the same path on the same machine removes it.

    Raises:
        FileNotFoundError: the folder of ``path`` does not exist.
        IsADirectoryError: ``path`` is a folder.
        TypeError: a ``.safetensors`` path and a leaf the format cannot hold (a DTensor,
            a dtype it lacks such as complex128, an object that is not a tensor, None,
            bool, int, float or str); the message names the key path.
        ModuleNotFoundError: a ``.safetensors`` path without the safetensors package.

    Example:
        >>> fd.save({"params": params, "opt_state": opt_state}, "ckpt.pt")
        >>> fd.save(params, "model.safetensors")   # read by torch, HF and others
    """
    if isinstance(path, str | bytes | os.PathLike) and os.fsdecode(path).endswith(".safetensors"):
        _safetensors.save(obj, os.fsdecode(path))
        return
    obj = optree.tree_map(_compact, obj, namespace=NAMESPACE)
    if not isinstance(path, str | bytes | os.PathLike):  # a file-like object: no atomicity
        torch.save(obj, path)
        return
    atomic_write(os.fsdecode(path), lambda f: torch.save(obj, f), "functd.save")


def _memmap_folder(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "meta.json"))


def _from_tensordict(obj: Any) -> Any:
    """Turn tensordict's TensorDicts in a loaded tree into fd.TensorDicts."""
    td_mod = sys.modules.get("tensordict")
    base = getattr(td_mod, "TensorDictBase", None)
    if base is None:
        return obj

    def convert(x: Any) -> Any:
        if isinstance(x, base):
            data = {k: convert(v) for k, v in x.items()}
            return TensorDict(data, batch_size=x.batch_size)
        if isinstance(x, torch.Tensor) or not isinstance(x, dict | list | tuple):
            return x
        if isinstance(x, dict):
            return type(x)((k, convert(v)) for k, v in x.items())
        if isinstance(x, tuple) and hasattr(x, "_fields"):  # a namedtuple
            return type(x)(*(convert(v) for v in x))
        return type(x)(convert(v) for v in x)

    return convert(obj)


def load(path: str | os.PathLike[str], map_location: Any = None) -> Any:
    """Load what ``save`` wrote, verified, with ``torch.load(weights_only=True)``.

    A safetensors file (its name ends in ``.safetensors``, or its first bytes say so)
    gives back the tree ``fd.save`` wrote (its CRC-32s checked), or, written by another
    tool (an HF ``model.safetensors``), a nested TensorDict of batch size ``[]`` split
    at the dots of its names: the params ``fd.from_module`` gives for that model
    (without the non-persistent buffers, which the file does not hold).
    ``map_location`` is then a device.

    Before anything is unpickled the file is checked (``_archive.verify``): it
    must be a regular file (a FIFO, a device or a folder is refused without
    being read), a zip archive as torch.save writes it, with every member inside
    the file, no member expanding more than 8x, and every CRC-32 matching: a
    flipped byte, a truncated copy or a zip bomb gives a clear error, and no
    allocation beyond the file's own content. The check reads the file once
    more than ``torch.load`` alone (about +50% of the load time on a cached file).

    A ``tensordict.TensorDict`` saved with ``torch.save`` loads as an
    ``fd.TensorDict`` (same entries and batch size; never the mutable type).

    Raises:
        pickle.UnpicklingError: the file holds objects other than tensors,
            containers and TensorDicts (e.g. pickled code); nothing was run.
        ValueError: the file is empty, truncated, damaged (a checksum fails),
            not a torch file, a compressed bomb, not a regular file, or it holds
            an invalid TensorDict (each says which); or ``path`` is a folder (a
            tensordict memmap folder says how to convert it).

    Example:
        >>> params = fd.load("params.pt", map_location="cpu")
        >>> hf_params = fd.load("model.safetensors")   # e.g. written by save_pretrained
    """
    if not isinstance(path, str | bytes | os.PathLike):  # a file-like object
        where = f"functd.load(<{type(path).__name__}>)"
        path.seek(0, os.SEEK_END)
        verify(path, path.tell(), where)
        path.seek(0)
        return _from_tensordict(_torch_load(path, map_location, where))
    path = os.fsdecode(path)
    where = f"functd.load({path!r})"
    _check_kind(path, _stat(path, where), where)
    if _safetensors.is_safetensors(path):
        return _safetensors.load(path, map_location, where)
    fd = os.open(path, os.O_RDONLY | _NONBLOCK | getattr(os, "O_BINARY", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        _check_kind(path, st, where)  # the path may have changed since the first look
        verify(f, st.st_size, where)
        f.seek(0)
        obj = _torch_load(f, map_location, where)
    return _from_tensordict(obj)


_NONBLOCK = getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)


def _stat(path: str, where: str) -> os.stat_result:
    try:
        return os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError(
                f"{where}: the path is a loop of symlinks (it never reaches a file). Fix the link."
            ) from None
        raise


def _check_kind(path: str, st: os.stat_result, where: str) -> None:
    if stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISDIR(st.st_mode):
        if _memmap_folder(path):
            raise ValueError(
                f"{where}: this is a folder written by tensordict's TensorDict.memmap/save "
                "(it holds meta.json), not a file written by functd.save. Load it with "
                "tensordict and convert it: `t = tensordict.TensorDict.load_memmap(path)"
                ".clone()` (in memory), then `fd.TensorDict(t, batch_size=t.batch_size)`; "
                "fd.save that to get a functd file."
            )
        raise ValueError(f"{where}: this is a folder; functd.load reads a file that fd.save wrote.")
    kind = (
        "a FIFO (named pipe)"
        if stat.S_ISFIFO(st.st_mode)
        else "a device"
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
        else "a socket"
        if stat.S_ISSOCK(st.st_mode)
        else "not a regular file"
    )
    raise ValueError(
        f"{where}: this is {kind}, not a regular file. fd.load reads only regular files "
        "(it verifies a file before loading it, which a stream cannot offer); copy the data "
        "to a file first."
    )


def _torch_load(f: Any, map_location: Any, where: str) -> Any:
    """``torch.load(f, weights_only=True)`` of a verified archive, its errors explained."""
    try:
        return torch.load(f, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, EOFError) as e:
        _refused(f, e, where)
    except Exception as e:
        if _raised_in(e, TensorDict.__init__):
            raise ValueError(
                f"{where}: the archive is intact (its checksums verify) but holds an invalid "
                f"TensorDict, which was not built: {type(e).__name__}: {e}"
            ) from None
        raise ValueError(
            f"{where}: the archive is intact (its checksums verify) but torch.load could not "
            f"rebuild what it holds: {type(e).__name__}: {e}"
        ) from e


def _refused(f: Any, e: BaseException, where: str) -> None:
    """Explain an UnpicklingError: a damaged pickle, tensordict not imported, or refused code."""
    try:
        for _ in pickletools.genops(pickle_member(f)):  # parses; runs nothing
            pass
    except Exception as bad:  # the pickle does not even parse: nothing was refused
        raise ValueError(
            f"{where}: the archive is intact (its checksums verify) but its pickle (data.pkl) "
            f"is malformed, so it was not written by torch.save: {type(bad).__name__}: {bad}"
        ) from None
    if "tensordict" in str(e) and "tensordict" not in sys.modules:
        raise pickle.UnpicklingError(
            f"{where}: the file holds a tensordict.TensorDict (saved with torch.save). "
            "`import tensordict` first (it allows its own types in the safe loader); "
            "fd.load then returns it as an fd.TensorDict."
        ) from None
    raise pickle.UnpicklingError(
        f"{where} refused the file: it holds objects that the safe loader "
        "(torch.load(weights_only=True)) does not allow, such as pickled code, and "
        "nothing was run. Only load such a file if you trust it, with "
        f"torch.load(path, weights_only=False). Details: {e}"
    ) from None


def _raised_in(e: BaseException, fn: Any) -> bool:
    """True when ``fn``'s code is on the traceback of ``e`` (it raised inside ``fn``)."""
    code, tb = fn.__code__, e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return True
        tb = tb.tb_next
    return False
