"""Saving and loading TensorDicts (and any pytree of them) with torch's safe loader.

``load`` uses ``torch.load(weights_only=True)``: a file that holds pickled code
(any global other than tensors, containers and TensorDict) fails to load, with
a ``pickle.UnpicklingError``, and runs nothing.

``save`` writes only what the tree holds: a leaf that is a view of a larger
storage (``big[:10]``) is copied first, because torch saves a tensor's whole
storage. ``load`` gives a clear error for a truncated or foreign file and for a
tensordict memmap folder, and turns a ``tensordict.TensorDict`` saved with
``torch.save`` into an ``fd.TensorDict``.

Example:
    >>> fd.save(td, "td.pt")
    >>> fd.testing.assert_close(fd.load("td.pt"), td)
"""

from __future__ import annotations

import os
import pickle
import sys
import zipfile
from typing import Any

import optree
import torch

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


def save(obj: Any, path: str | os.PathLike) -> None:
    """Save a TensorDict (or a pytree of tensors and TensorDicts) to ``path``.

    Only what the tree holds is written: a leaf that views a larger tensor
    (``x[:10]``) is saved as a copy of those elements, not with the storage
    it shares. (Leaves that shared a storage are loaded as separate tensors.)

    Example:
        >>> fd.save({"params": params, "opt_state": opt_state}, "ckpt.pt")
    """
    torch.save(optree.tree_map(_compact, obj, namespace=NAMESPACE), path)


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


def load(path: str | os.PathLike, map_location: Any = None) -> Any:
    """Load what ``save`` wrote, with ``torch.load(weights_only=True)``.

    A ``tensordict.TensorDict`` saved with ``torch.save`` loads as an
    ``fd.TensorDict`` (same entries and batch size; never the mutable type).

    Raises:
        pickle.UnpicklingError: the file holds objects other than tensors,
            containers and TensorDicts (e.g. pickled code); nothing was run.
        ValueError: the file is truncated or not a torch file; or ``path`` is
            a folder (a tensordict memmap folder says how to convert it).

    Example:
        >>> params = fd.load("params.pt", map_location="cpu")
    """
    where = f"functd.load({os.fspath(path)!r})"
    if os.path.isdir(path):
        if _memmap_folder(os.fspath(path)):
            raise ValueError(
                f"{where}: this is a folder written by tensordict's TensorDict.memmap/save "
                "(it holds meta.json), not a file written by functd.save. Load it with "
                "tensordict and convert it: `t = tensordict.TensorDict.load_memmap(path)"
                ".clone()` (in memory), then `fd.TensorDict(t, batch_size=t.batch_size)`; "
                "fd.save that to get a functd file."
            )
        raise ValueError(f"{where}: this is a folder; functd.load reads a file that fd.save wrote.")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if "tensordict" in str(e) and "tensordict" not in sys.modules:
            raise pickle.UnpicklingError(
                f"{where}: the file holds a tensordict.TensorDict (saved with torch.save). "
                "`import tensordict` first (it allows its own types in the safe loader); "
                "fd.load then returns it as an fd.TensorDict."
            ) from None
        if "weights_only" in str(e) or "Weights only" in str(e):
            raise pickle.UnpicklingError(
                f"{where} refused the file: it holds objects that the safe loader "
                "(torch.load(weights_only=True)) does not allow, such as pickled code, and "
                "nothing was run. Only load such a file if you trust it, with "
                f"torch.load(path, weights_only=False). Details: {e}"
            ) from None
        _unreadable(where, path, e)
    except (RuntimeError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as e:
        if isinstance(e, RuntimeError) and zipfile.is_zipfile(path) and _zip_intact(path):
            raise  # a readable archive: a real loading error (e.g. map_location), as torch said
        _unreadable(where, path, e)
    return _from_tensordict(obj)


def _zip_intact(path: Any) -> bool:
    try:
        with zipfile.ZipFile(path) as z:
            return z.testzip() is None
    except (zipfile.BadZipFile, OSError, EOFError):
        return False


def _unreadable(where: str, path: Any, e: BaseException) -> None:
    size = os.path.getsize(path)
    raise ValueError(
        f"{where}: the file ({size} bytes) is truncated or is not a functd/torch file "
        "(fd.save and torch.save write a zip archive that torch.load reads); it could not "
        f"be read: {type(e).__name__}: {e}"
    ) from None
