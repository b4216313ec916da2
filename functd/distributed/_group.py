"""The process group of a collective, and the cross-rank structure check.

Every collective of :mod:`functd.distributed` starts here: ``resolve`` finds the
group (a clear error when none is initialised) and ``check_structure`` makes
sure every rank passes a tree of the same structure, shapes and dtypes before
any data moves, so a mismatch is an error naming the first differing key on
every rank instead of a hang or silently mixed buffers.

The check is one ``all_gather`` of an 8-byte fingerprint (blake2b of the tree
structure, leaf shapes and dtypes). On this machine a tiny gloo collective
costs about as much as a whole small training step, so by default it runs on
the first call with each structure in each group only (``check="first"``); the
verified fingerprints are cached per process group (a bounded set in a
``WeakKeyDictionary``, so a destroyed group takes its cache with it).
``check=True`` verifies every call, ``check=False`` never.
"""

from __future__ import annotations

import datetime
import hashlib
import time
import weakref
from typing import Any

import torch
import torch.distributed as dist

from ._faults import failed


def _named(new: str, old: str) -> Any:
    """torch's collective ``new``, or ``old`` on a torch that predates the name (torch
    2.13 named all_gather_single and reduce_scatter_single and deprecated the old
    names, all_gather_into_tensor and reduce_scatter_tensor)."""
    return getattr(dist, new, None) or getattr(dist, old, None)


all_gather_single = _named("all_gather_single", "all_gather_into_tensor")
reduce_scatter_single = _named("reduce_scatter_single", "reduce_scatter_tensor")

__all__ = [
    "check_structure",
    "describe",
    "gather_ints",
    "gather_objects",
    "get_timeout",
    "mismatch_detail",
    "resolve",
    "set_timeout",
]

_MAX_CACHED = 256  # verified structures kept per group (cleared when full)
_verified: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_sizes: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # group -> (world, rank)


def resolve(where: str, group: Any) -> tuple[Any, int, int]:
    """``(group, world_size, rank)`` of ``group`` (``None``: the default group).

    Raises:
        RuntimeError: torch.distributed is unavailable or no process group is
            initialised; the message says how to start one.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            f"{where}: no torch.distributed process group is initialised. Launch the script "
            "with `torchrun --nproc-per-node 2 script.py` and call "
            "torch.distributed.init_process_group('gloo') (or 'nccl' on GPUs) before any "
            "collective; in a single process, init_process_group('gloo', rank=0, "
            "world_size=1, init_method='tcp://127.0.0.1:29500') works too."
        )
    g = dist.group.WORLD if group is None else group
    if torch.compiler.is_compiling():
        return g, dist.get_world_size(g), dist.get_rank(g)
    sizes = _sizes.get(g)
    if sizes is None:
        sizes = _sizes[g] = (dist.get_world_size(g), dist.get_rank(g))
    return g, *sizes


def _describe(x: torch.Tensor) -> str:
    return f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)} on {x.device.type}"


def _fingerprint(spec: Any, leaves: list[Any]) -> int:
    text = (
        repr(spec)
        + "|"
        + ";".join(
            _describe(x) if isinstance(x, torch.Tensor) else type(x).__name__ for x in leaves
        )
    )
    return int.from_bytes(
        hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True
    )


def _check_device(group: Any, leaves: list[torch.Tensor]) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_structure(
    where: str,
    group: Any,
    world: int,
    tree: Any,
    layout: tuple[Any, ...],
    leaves: list[Any],
    check: Any,
) -> None:
    """Raise the same ``ValueError`` on every rank when the ranks' trees differ.

    ``layout`` is ``(treespec, ((shape, dtype, device), ...))``; ``check``:
    ``"first"`` (once per layout and group), ``True`` (every call) or ``False``.
    """
    if check is False or world == 1:
        return
    if check not in ("first", True):
        raise ValueError(f"{where}: check must be 'first', True or False, got {check!r}.")
    key = layout
    spec = layout[0]
    seen = _verified.get(group)
    if check == "first" and seen is not None and key in seen:
        return
    mine = torch.tensor([_fingerprint(spec, leaves)], dtype=torch.int64)
    mine = mine.to(_check_device(group, leaves))
    every = torch.empty(world, dtype=torch.int64, device=mine.device)
    started = time.monotonic()
    try:
        all_gather_single(every, mine, group=group)
    except RuntimeError as e:
        raise failed(where, "all_gather", e, started) from e
    if bool((every == every[0]).all()):
        if seen is None or len(seen) >= _MAX_CACHED:
            seen = _verified[group] = set()
        seen.add(key)
        return
    _raise_mismatch(where, group, world, tree, leaves, every.tolist())


def _raise_mismatch(where, group, world, tree, leaves, prints) -> None:
    detail = mismatch_detail(where, group, world, describe(tree, leaves), prints)
    raise ValueError(
        f"{where}: the ranks passed different trees: {detail}. Every rank must pass the "
        "same structure (keys, shapes and dtypes) to a collective; build the params and "
        "batches the same way on every rank (e.g. the same init key, the same batch size)."
    )


def describe(tree: Any, leaves: list[Any]) -> list[tuple[str, str]]:
    """``(dotted key path, "dtype[shape] on device")`` for each leaf of ``tree``
    (a leaf that is not a tensor: its type name)."""
    from .._td._tree import tree as fdtree

    paths = [".".join(map(str, p)) or "<root>" for p in fdtree.paths(tree)]
    return [
        (p, _describe(x) if isinstance(x, torch.Tensor) else type(x).__name__)
        for p, x in zip(paths, leaves)
    ]


def mismatch_detail(where: str, group: Any, world: int, desc: list[Any], prints: list[Any]) -> str:
    """Which key differs between rank 0 and the first rank whose fingerprint in
    ``prints`` differs: gathers every rank's ``desc`` (a collective: every rank
    calls it when the fingerprints differ)."""
    everyone: list[Any] = [None] * world
    started = time.monotonic()
    try:
        dist.all_gather_object(everyone, desc, group=group)
    except RuntimeError as e:
        raise failed(where, "all_gather_object", e, started) from e
    ref = everyone[0]
    other = next(r for r in range(world) if prints[r] != prints[0])
    theirs = everyone[other]
    a, b = dict(ref), dict(theirs)
    for p, d in ref:
        if p not in b:
            return f"rank 0 has the key {p!r} ({d}), rank {other} does not"
        if b[p] != d:
            return f"at the key {p!r}, rank 0 has {d} and rank {other} has {b[p]}"
    extra = next((p for p, _ in theirs if p not in a), None)
    if extra is not None:
        return f"rank {other} has the key {extra!r} ({b[extra]}), rank 0 does not"
    return f"rank 0 and rank {other} have the same keys in a different tree layout"


def gather_ints(where: str, group: Any, world: int, values: list[int]) -> list[list[int]]:
    """Every rank's ``values`` (int64s, the same count on every rank): one
    ``all_gather``; entry ``r`` is rank ``r``'s."""
    mine = torch.tensor(values, dtype=torch.int64).to(_check_device(group, []))
    every = torch.empty(world * len(values), dtype=torch.int64, device=mine.device)
    started = time.monotonic()
    try:
        all_gather_single(every, mine, group=group)
    except RuntimeError as e:
        raise failed(where, "all_gather", e, started) from e
    return every.view(world, len(values)).tolist()


def gather_objects(where: str, group: Any, world: int, obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable; for error messages only)."""
    everyone: list[Any] = [None] * world
    started = time.monotonic()
    try:
        dist.all_gather_object(everyone, obj, group=group)
    except RuntimeError as e:
        raise failed(where, "all_gather_object", e, started) from e
    return everyone


def get_timeout(group: Any) -> datetime.timedelta | None:
    """The group's current collective timeout (None when the backend does not say)."""
    try:
        backend = group._get_backend(_check_device(group, []))
        return backend.options._timeout
    except (AttributeError, RuntimeError):
        return None


def set_timeout(group: Any, timeout: datetime.timedelta) -> None:
    """Set the timeout of the group's later collectives (gloo and NCCL)."""
    from torch.distributed.distributed_c10d import _set_pg_timeout

    _set_pg_timeout(timeout, group)
