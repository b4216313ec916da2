"""The eager hot path of ``mean_updates``/``sum_updates``: a TensorDict of plain tensors.

A data-parallel step calls ``mean_updates().update`` once a step with a grads
TensorDict of the same layout every time. The general ``all_reduce`` flattens
it with ``functd.tree`` (optree), builds and hashes a layout key holding the
tree structure, and looks up the bucket plan and the verified structures on
every call. Here the leaves are collected by a direct walk of the TensorDicts,
and the plan is found by the identity of the TensorDicts' key specs (grads,
params and updates built from one another share them) and the leaves'
``(shape, dtype, device)``; the entry holds what the call needs (group, world
size, buckets), so a call is: walk, key, pack, divide, all-reduce, unpack.

The cross-rank structure check is unchanged: an entry is made only after the
general path has run it for the layout (a collective on the first call with
each layout, as ``check="first"``), and it is dropped when that group's
verified set is reset, so every rank issues the same checks as before.

``rider`` lets ``fd.fit(data_parallel=True)`` send one number with the
gradients (whether this rank has a next batch, when its batches have no
``len()``): one more element in the one flat buffer, no extra collective.

Returns ``None`` (the caller takes the general path, with its errors) under
``torch.compile``, for leaves that are DTensors, parameters or tensors wrapped
by ``torch.func``, and for anything that is not a TensorDict of tensors.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from .._td import TensorDict
from .._td._tree import flat_leaves
from .._torch.functorch import is_wrapped
from .._torch.ops import flatten_dense_tensors, unflatten_dense_tensors
from . import _group
from ._collectives import _all_reduce, _issue, _pack, _prepare, _reduce_op, _unpack
from ._faults import failed

__all__ = ["reduce_td", "rider"]

_MAX_ENTRIES = 64  # layouts kept per group (cleared when full)
_entries: weakref.WeakKeyDictionary[Any, Any] = (
    weakref.WeakKeyDictionary()
)  # group -> {key: _Entry}
_is_wrapped = is_wrapped
_is_compiling = torch.compiler.is_compiling
_monotonic = time.monotonic
_flatten = flatten_dense_tensors  # one C++ copy, as DDP's buckets
_unflatten = unflatten_dense_tensors  # views of the flat buffer


class _Rider(threading.local):
    """A number that ``fit(data_parallel=True)`` has the next one-buffer
    ``mean_updates``/``sum_updates`` of this thread carry: ``arm(v)`` appends ``v`` to the
    buffer (no extra collective), ``take()`` returns the sum over the ranks, or
    None when no such call came (then ``fit`` asks the store instead). Every
    rank arms the same calls, so the buffers keep equal sizes."""

    flag: float | None = None
    result: int | None = None

    def arm(self, value: float) -> None:
        self.flag, self.result = value, None

    def take(self) -> int | None:
        result, self.flag, self.result = self.result, None, None
        return result


rider = _Rider()


class _Entry:
    __slots__ = ("buckets", "seen", "specs", "world")
    buckets: Any
    seen: Any
    specs: Any
    world: Any

    def __init__(self, specs: list[Any], buckets: list[Any], world: int, seen: Any) -> None:
        self.specs = specs  # held so that their ids in the key stay theirs
        self.buckets = buckets
        self.world = world
        self.seen = seen  # the group's verified set when the entry was made


def reduce_td(where: str, updates: Any, op: str, group: Any, cap_mb: float) -> list[Any] | None:
    """The reduced leaves of ``updates`` (in ``functd.tree`` order), or ``None``
    when the fast path does not apply."""
    if type(updates) is not TensorDict or _is_compiling():
        return None
    specs: list[Any] = []
    leaves = flat_leaves(updates, specs)
    if not leaves or any(type(x) is not Tensor or _is_wrapped(x) for x in leaves):
        return None  # empty, or a Parameter, DTensor, torch.func-wrapped or non-tensor leaf
    g = _group.resolve(where, group)[0]
    table = _entries.get(g)
    key = (
        tuple(map(id, specs)),
        tuple([(x.shape, x.dtype, x.device) for x in leaves]),
        op,
        cap_mb,
    )
    entry = None if table is None else table.get(key)
    if entry is None or entry.seen is not _group._verified.get(g):
        # the general path (structure check, plan, dtype errors) makes the entry
        out = _all_reduce(where, updates, op, group, cap_mb, "first")
        buckets = _prepare(where, updates, group, False, cap_mb).buckets
        if table is None or len(table) >= _MAX_ENTRIES:
            table = _entries[g] = {}
        world = _group.resolve(where, group)[1]
        table[key] = _Entry(specs, buckets, world, _group._verified.get(g))
        return flat_leaves(out)
    buckets, world = entry.buckets, entry.world
    if len(buckets) == 1 and len(leaves) > 1:  # the common case: one flat buffer
        flag = rider.flag
        if flag is None:
            flat = _flatten(leaves)  # a copy: the caller's tensors are never written
        else:  # fit's flag rides at the end of the buffer
            rider.flag = None
            x = leaves[0]
            flat = _flatten([*leaves, torch.full((1,), flag, dtype=x.dtype, device=x.device)])
        if world > 1:
            if op == "mean":
                flat.div_(world)
            started = _monotonic()
            try:
                dist.all_reduce(flat, _reduce_op(where, op), group=g)
            except RuntimeError as e:
                raise failed(where, "all_reduce", e, started) from e
        if flag is not None:
            rider.result = round(float(flat[-1]) * (world if op == "mean" else 1))
        # the leaves as the layout: cheaper than meta tensors, only their shapes are read
        return _unflatten(flat, leaves)
    flats = [_pack(leaves, b) for b in buckets]
    if world > 1:
        if op == "mean":
            for f in flats:
                f.div_(world)  # our own buffers
        _issue(where, dist.all_reduce, [(f,) for f in flats], _reduce_op(where, op), group=g)
    out: list[Any] = [None] * len(leaves)  # type: ignore[no-redef]
    for f, b in zip(flats, buckets):
        _unpack(f, b, out)
    return out
