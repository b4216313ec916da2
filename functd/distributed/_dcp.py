"""Sharded checkpoints: a tree of DTensors (and plain tensors) through torch.distributed.checkpoint.

``save(tree, folder)`` is a collective: every rank of the group calls it with its
shards, and DCP writes each shard once (a plain tensor, the same on every rank,
once by rank 0). The tensors are named as ``fd.save`` names them in a flat file
(``state_dict`` names, ``"0.weight"``), and ``functd.json`` beside DCP's files holds
the tree (TensorDicts with their batch sizes, dicts, lists, scalars): what
``load`` rebuilds.

``load(folder, like=...)`` reads it back on any number of ranks with any sharding:
each leaf of ``like`` gives the layout of the leaf of the same name (a DTensor: its
mesh and placements, each rank reading only its shard; a plain tensor: its device),
and fresh tensors are allocated for it (``like`` is never written). Leaves ``like``
does not name, or all of them without ``like``, load whole as plain tensors on the
CPU (``map_location`` to move them), also in a process without a process group.

The folder is replaced atomically: the ranks write ``folder.tmp``, then rank 0
moves it onto ``folder`` (a crash leaves the old folder or the new one, or, for a
moment during the swap, only ``folder.old``, which ``load`` then reads).

Example:
    >>> fd.distributed.save({"params": sharded, "opt_state": state}, "ckpt")  # on every rank
    >>> back = fd.distributed.load("ckpt", like={"params": resharded, "opt_state": state})
"""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from .._td._atomic import fsync_folder
from .._td._dtensor import is_dtensor
from .._td._safetensors import flat_names, parse_tree, rebuild, tree_json

__all__ = ["load", "save"]

TREE_FILE = "functd.json"
_DCP_META = ".metadata"


def _group_info(group: Any) -> tuple[bool, int]:
    """(distributed?, rank): a process group is in use when one is initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return False, 0
    return True, dist.get_rank(group)


def _barrier(group: Any) -> None:
    kw: dict[str, Any] = {}
    if dist.get_backend(group) == "nccl":
        kw["device_ids"] = [torch.cuda.current_device()]
    dist.barrier(group, **kw)


@contextlib.contextmanager
def _single(distributed: bool) -> Iterator[None]:
    """Without a process group DCP warns that it assumes one process: that is the intent."""
    with warnings.catch_warnings():
        if not distributed:
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def save(tree: Any, folder: str | os.PathLike[str], *, group: Any = None) -> None:
    """Write ``tree`` (DTensor and plain tensor leaves) to ``folder`` with DCP; collective.

    Every rank of ``group`` (default: the default process group; none: this process
    alone) calls it with the same tree layout. Replaces ``folder`` atomically.

    Args:
        tree: a TensorDict, dict, list or tuple of tensors, DTensors, TensorDicts,
            None and JSON scalars (``fd.fit``'s checkpoint dict, params and state).
        folder: the checkpoint folder (created; its parent must exist and be shared
            by the ranks).
        group: the process group of the ranks that hold the shards.

    Raises:
        TypeError: a leaf that is not a tensor, None or a JSON scalar (the message
            names its key path).
        FileNotFoundError: the parent folder does not exist.

    Example:
        >>> fd.distributed.save({"params": sharded, "opt_state": opt_state}, "ckpt")
    """
    import torch.distributed.checkpoint as dcp

    where = "fd.distributed.save"
    folder = os.fspath(folder)
    tensors, desc = flat_names(tree, where)
    parent = os.path.dirname(os.path.abspath(folder))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"{where}({folder!r}): the folder {parent!r} does not exist.")
    distributed, rank = _group_info(group)
    tmp = folder + ".tmp"
    if rank == 0 and os.path.lexists(tmp):
        shutil.rmtree(tmp)  # a save that did not finish
    if distributed:
        _barrier(group)
    state = {n: t.detach() for n, t in tensors.items()}
    with _single(distributed):
        dcp.save(state, checkpoint_id=tmp, process_group=group, no_dist=not distributed)
    if rank == 0:
        with open(os.path.join(tmp, TREE_FILE), "w") as f:
            f.write(tree_json(desc))
            f.flush()
            os.fsync(f.fileno())
        fsync_folder(tmp)
        _swap(tmp, folder)
    if distributed:
        _barrier(group)  # the folder is in place for every rank


def _swap(tmp: str, folder: str) -> None:
    old = folder + ".old"
    if os.path.lexists(old):
        shutil.rmtree(old)
    if os.path.lexists(folder):
        os.replace(folder, old)
    os.replace(tmp, folder)
    fsync_folder(os.path.dirname(os.path.abspath(folder)))
    if os.path.lexists(old):
        shutil.rmtree(old)


def exists(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` holds a complete checkpoint written by ``save``."""
    folder = os.fspath(folder)
    return all(os.path.isfile(os.path.join(folder, f)) for f in (_DCP_META, TREE_FILE))


def load(
    folder: str | os.PathLike[str], like: Any = None, *, group: Any = None, map_location: Any = None
) -> Any:
    """Read what :func:`save` wrote, placed like ``like``; collective when ``like`` holds DTensors.

    Args:
        folder: a folder written by ``fd.distributed.save``.
        like: a tree whose leaves give the layout of the leaves of the same key paths
            (a DTensor: mesh and placements, which may differ from the saved ones; a
            plain tensor: its device). Never written. Leaves it does not have load
            whole, as plain tensors.
        group: the process group of the ranks (with DTensors in ``like``).
        map_location: the device of the leaves that load whole (default: the CPU).

    Returns:
        The saved tree (its TensorDicts, batch sizes, dicts, lists and scalars), with
        fresh tensors.

    Raises:
        FileNotFoundError: ``folder`` holds no checkpoint.
        ValueError: a leaf of ``like`` has no saved tensor of its name, or another
            shape or dtype (the message names it).

    Example:
        >>> params = fd.distributed.load("ckpt", like={"params": sharded})["params"]
    """
    import torch.distributed.checkpoint as dcp

    where = f"fd.distributed.load({os.fspath(folder)!r})"
    folder = _readable(os.fspath(folder), where)
    with open(os.path.join(folder, TREE_FILE)) as f:
        desc = parse_tree(f.read(), where)
    saved = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata
    targets = _targets(saved, like, where, map_location)
    distributed, _ = _group_info(group)
    if targets:
        with _single(distributed):
            dcp.load(targets, checkpoint_id=folder, process_group=group, no_dist=not distributed)
    return rebuild(desc, targets, where)


def _readable(folder: str, where: str) -> str:
    if exists(folder):
        return folder
    if exists(folder + ".old"):  # a save was swapping the folders when it stopped
        return folder + ".old"
    raise FileNotFoundError(
        f"{where}: no checkpoint there (a folder written by fd.distributed.save holds "
        f"{_DCP_META} and {TREE_FILE})."
    )


def _targets(saved: dict[Any, Any], like: Any, where: str, map_location: Any) -> dict[str, Any]:
    """A fresh tensor for every saved name: like ``like``'s leaf of that name, or whole."""
    given = flat_names(like, where)[0] if like is not None else {}
    out: dict[str, Any] = {}
    for name, t in given.items():
        meta = saved.get(name)
        if meta is None or not hasattr(meta, "size"):
            raise ValueError(
                f"{where}: `like` has the key path {name!r}, which the checkpoint does not "
                f"hold (it holds {sorted(saved)[:8]}...). Give the layout of what was saved."
            )
        shape, dtype = tuple(t.shape), t.dtype
        if shape != tuple(meta.size) or dtype != meta.properties.dtype:
            raise ValueError(
                f"{where}: at {name!r}, the checkpoint holds {meta.properties.dtype} "
                f"{list(meta.size)} and `like` has {dtype} {list(shape)}; shapes and dtypes "
                "must match (only the sharding may differ)."
            )
        out[name] = torch.empty_like(t)
    device = torch.device("cpu") if map_location is None else torch.device(map_location)
    for name, meta in saved.items():
        if name not in out and hasattr(meta, "size"):
            out[name] = torch.empty(tuple(meta.size), dtype=meta.properties.dtype, device=device)
    return out


def holds_dtensors(tree: Any) -> bool:
    """Whether any tensor leaf of ``tree`` is a DTensor (its checkpoint needs DCP)."""
    from .._td._tree import tree as fdtree

    return any(is_dtensor(x) for x in fdtree.leaves(tree))


class ShardedStore:
    """``fd.fit``'s checkpoints of params that hold DTensors: each one a DCP folder that
    every rank writes its shards into and reads with the run's own sharding (``like``);
    rank 0 rotates the folders (``functd/_checkpoint.py``)."""

    collective = True
    folders = True

    def __init__(self, like: Any, group: Any = None) -> None:
        self.like, self.group = like, group

    def main(self) -> bool:
        return _group_info(self.group)[1] == 0

    def exists(self, name: str) -> bool:
        return exists(name) or exists(name + ".old")

    def save(self, state: dict[Any, Any], name: str) -> None:
        save(state, name, group=self.group)

    def load(self, name: str, map_location: Any) -> Any:
        return load(name, like=self.like, group=self.group, map_location=map_location)
