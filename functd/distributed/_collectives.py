"""Pure collectives over trees: ``all_reduce``, ``broadcast``, ``all_gather``, ``reduce_scatter``.

Each takes a tree (a TensorDict, a dict, a list... any pytree that
``functd.tree`` flattens) and returns a new tree of the same structure; the
caller's tensors are never written. The leaves are copied into flat buffers,
one run of buffers per ``(dtype, device)``, each at most ``bucket_cap_mb``
megabytes (25, DDP's default); one collective a bucket is issued
asynchronously for all buckets and then all are waited, so the buckets'
transfers overlap (a lone bucket runs synchronously, which is cheaper on
gloo). The bucket plan is cached per tree layout. The results are views into
those fresh buffers.

Under ``torch.compile`` the same buckets go through torch's functional
collectives (``torch.distributed._functional_collectives``), which dynamo
traces into the graph: a compiled train step with its all-reduce is one graph.
The cross-rank structure check (see ``_group``) runs in eager mode only.

Example:
    >>> grads = fd.distributed.all_reduce(grads, op="mean")
    >>> params = fd.distributed.broadcast(params, src=0)
    >>> everyone = fd.distributed.all_gather(metrics)  # a new leading dim of size world
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from .._td import TensorDict
from .._td._tree import tree as fdtree
from .._td._tree import unflatten_like
from .._torch.functorch import is_wrapped
from .._torch.ops import flatten_dense_tensors, unflatten_dense_tensors
from ._faults import failed
from ._group import all_gather_single, check_structure, reduce_scatter_single, resolve

__all__ = ["all_gather", "all_reduce", "broadcast", "reduce_scatter"]

OPS = ("mean", "sum", "max", "min")
_DEFAULT_CAP_MB = 25.0


_OPS = {"mean": "SUM", "sum": "SUM", "max": "MAX", "min": "MIN"}


def _reduce_op(where: str, op: str):
    if op not in _OPS:
        raise ValueError(f"{where}: op must be one of {OPS}, got {op!r}.")
    return getattr(dist.ReduceOp, _OPS[op])


def _flatten(where: str, tree: Any) -> tuple[list[Tensor], Any]:
    leaves, spec = fdtree.flatten(tree)
    for i, x in enumerate(leaves):
        if not isinstance(x, Tensor):
            path = fdtree.paths(tree)[i]
            raise TypeError(
                f"{where}: the leaf at {'.'.join(map(str, path))!r} is a {type(x).__name__}, "
                "not a tensor; collectives move tensors only (make it a tensor or leave it "
                "out of the tree)."
            )
        if _is_dtensor(x):
            path = fdtree.paths(tree)[i]
            raise TypeError(
                f"{where}: the leaf at {'.'.join(map(str, path))!r} is a DTensor; it carries "
                "its own placements: use x.redistribute(...) or x.full_tensor(), or "
                "fd.distributed.mean_updates(), which resolves Partial DTensor grads."
            )
    return leaves, spec


def _is_dtensor(x: Tensor) -> bool:
    return type(x).__name__ == "DTensor"


class _Bucket:
    __slots__ = ("_like", "floating", "idx", "numel", "shapes", "sizes")
    _like: Any
    floating: Any
    idx: Any
    numel: Any
    shapes: Any
    sizes: Any

    def __init__(self, idx: list[int], leaves: list[Tensor]) -> None:
        self.idx = idx
        self.shapes = [leaves[i].shape for i in idx]
        self.sizes = [leaves[i].numel() for i in idx]
        self.numel = sum(self.sizes)
        self._like = None
        self.floating = False  # set on the first bucket of a plan: all leaves floating

    @property
    def like(self) -> list[Tensor]:
        """Meta tensors of the leaves' shapes (no data), the layout for
        ``unflatten_dense_tensors``."""
        if self._like is None:
            self._like = [torch.empty(s, device="meta") for s in self.shapes]
        return self._like


def _buckets(where: str, leaves: list[Tensor], cap_mb: float) -> list[_Bucket]:
    """Leaves grouped by (dtype, device) in tree order, cut at ``cap_mb`` megabytes
    (a leaf larger than the cap gets a bucket of its own)."""
    if isinstance(cap_mb, bool) or not isinstance(cap_mb, int | float) or cap_mb <= 0:
        raise ValueError(f"{where}: bucket_cap_mb must be a positive number, got {cap_mb!r}.")
    cap = cap_mb * 1024 * 1024
    runs: dict[tuple[Any, ...], list[int]] = {}
    for i, x in enumerate(leaves):
        runs.setdefault((x.dtype, x.device), []).append(i)
    out: list[_Bucket] = []
    for idx in runs.values():
        cur: list[int] = []
        size = 0
        for i in idx:
            nbytes = leaves[i].numel() * leaves[i].element_size()
            if cur and size + nbytes > cap:
                out.append(_Bucket(cur, leaves))
                cur, size = [], 0
            cur.append(i)
            size += nbytes
        if cur:
            out.append(_Bucket(cur, leaves))
    return out


def _pack(leaves: list[Tensor], b: _Bucket) -> Tensor:
    """A new flat buffer holding the bucket's leaves (never a view of them)."""
    parts = [leaves[i] for i in b.idx]
    if torch.compiler.is_compiling():
        return torch.cat([x.reshape(-1) for x in parts])
    if len(parts) == 1:
        return parts[0].reshape(-1).clone()
    return flatten_dense_tensors(parts)  # one C++ call (as DDP); copies


def _unpack(flat: Tensor, b: _Bucket, out: list[Any], lead: tuple[Any, ...] = ()) -> None:
    """Views of ``flat`` (shaped ``lead + [numel]``) into ``out`` at the bucket's indices."""
    if not lead and not torch.compiler.is_compiling():
        if len(b.idx) == 1:
            out[b.idx[0]] = flat.view(b.shapes[0])
            return
        for i, v in zip(b.idx, unflatten_dense_tensors(flat, b.like)):
            out[i] = v
        return
    for i, piece, shape in zip(b.idx, flat.split(b.sizes, dim=-1), b.shapes):
        out[i] = piece.reshape((*lead, *shape))


_plans: dict[Any, Any] = {}  # (structure, cap) -> buckets; bounded, holds no tensors
_MAX_PLANS = 256


_is_wrapped = is_wrapped


class Prepared(NamedTuple):
    """What every collective starts from: the tree's leaves and spec, the group, its
    size and this rank, and the bucket plan (cached by layout)."""

    leaves: list[Any]
    spec: Any
    group: Any
    world: int
    rank: int
    buckets: list[Any]


def _prepare(where, tree, group, check, cap_mb, given=None) -> Prepared:
    leaves, spec = _flatten(where, tree) if given is None else given
    g, world, rank = resolve(where, group)
    if torch.compiler.is_compiling():
        return Prepared(leaves, spec, g, world, rank, _buckets(where, leaves, cap_mb))
    if any(_is_wrapped(x) for x in leaves):
        raise TypeError(
            f"{where}: called inside torch.func.vmap/grad (fd.vmap, fd.grad); process-group "
            "collectives have no batching rule. Reduce outside the transform: vmap the step "
            "without fd.distributed.mean_updates() in its optimizer, or all-reduce the stacked "
            "results after the vmap."
        )
    layout = (spec, tuple((x.shape, x.dtype, x.device) for x in leaves))
    check_structure(where, g, world, tree, layout, leaves, check)
    plan = _plans.get((layout, cap_mb))
    if plan is None:
        plan = _buckets(where, leaves, cap_mb)
        if plan and all(x.is_floating_point() or x.is_complex() for x in leaves):
            plan[0].floating = True  # op="mean" needs no per-call dtype check
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[(layout, cap_mb)] = plan
    return Prepared(leaves, spec, g, world, rank, plan)


def _rebuild(tree: Any, spec: Any, out: list[Any]) -> Any:
    """The result tree: laid out as ``tree`` itself when it is a TensorDict and the
    shapes are kept (reuses its cached layout), else through ``functd.tree``."""
    if type(tree) is TensorDict:
        return unflatten_like(tree, out)
    return fdtree.unflatten(spec, out)


def _check_mean(where: str, op: str, leaves: list[Tensor], buckets: list[Any]) -> None:
    if op == "mean" and not (buckets and getattr(buckets[0], "floating", False)):
        for x in leaves:
            if not (x.is_floating_point() or x.is_complex()):
                raise TypeError(
                    f"{where}: op='mean' needs floating-point leaves, got a {x.dtype} leaf; "
                    "use op='sum' for integer tensors."
                )


def _issue(where: str, collective, buffers: list[Any], *args, **kwargs) -> None:
    """Run ``collective(*buffer, *args, **kwargs)`` on every buffer (a tuple of
    tensors); asynchronously when there are several, so their transfers overlap,
    then wait for all. A single one runs synchronously: on gloo that saves the
    hand-off to the worker thread (about 40% of a small all-reduce here).

    Raises:
        CollectiveError: the backend failed (a timeout, a dead peer); its error
            is the cause.
    """
    started = time.monotonic()
    try:
        if len(buffers) == 1:
            collective(*buffers[0], *args, **kwargs)
            return
        works = [collective(*b, *args, **kwargs, async_op=True) for b in buffers]
        for w in works:
            w.wait()
    except RuntimeError as e:
        raise failed(where, collective.__name__.removesuffix("_single"), e, started) from e


# ------------------------------------------------------------------ all_reduce
def all_reduce(
    tree: Any,
    op: str = "mean",
    group: Any = None,
    *,
    bucket_cap_mb: float = _DEFAULT_CAP_MB,
    check: bool | str = "first",
) -> Any:
    """Reduce every leaf over the ranks of ``group``; a new tree, the same on every rank.

    Args:
        tree: a TensorDict or any pytree of tensors (the same structure, shapes
            and dtypes on every rank).
        op: ``"mean"`` (floating leaves; divided by the world size before the
            sum, as DDP does), ``"sum"``, ``"max"`` or ``"min"``.
        group: a ``torch.distributed`` process group; ``None`` is the default one.
        bucket_cap_mb: the largest flat buffer, in megabytes (25 as DDP).
        check: the cross-rank structure check: ``"first"`` call per structure,
            ``True`` every call, ``False`` never.

    Raises:
        RuntimeError: no process group is initialised.
        ValueError: the ranks' trees differ (names the first differing key), a
            bad ``op``.
        TypeError: a leaf is not a tensor, ``op="mean"`` on integer leaves.

    Example:
        >>> grads = fd.distributed.all_reduce(grads)  # the mean over the ranks
    """
    return _all_reduce("fd.distributed.all_reduce", tree, op, group, bucket_cap_mb, check)


def _all_reduce(where, tree, op, group, bucket_cap_mb, check, given=None):
    """``all_reduce``; ``given``: the ``(leaves, treespec)`` of ``tree`` when the
    caller has them (mean_updates: a TensorDict of plain tensors, already checked)."""
    rop = _reduce_op(where, op)
    leaves, spec, g, world, _, buckets = _prepare(where, tree, group, check, bucket_cap_mb, given)
    _check_mean(where, op, leaves, buckets)
    out: list[Any] = [None] * len(leaves)
    if torch.compiler.is_compiling():
        import torch.distributed._functional_collectives as funcol

        for b in buckets:
            flat = _pack(leaves, b)
            if op == "mean" and world > 1:
                flat = flat / world
            name = "sum" if op == "mean" else op
            _unpack(funcol.wait_tensor(funcol.all_reduce(flat, name, g)), b, out)
        return out if given is not None else _rebuild(tree, spec, out)
    flats = [_pack(leaves, b) for b in buckets]
    if world > 1:
        if op == "mean":
            torch._foreach_div_(flats, world)  # our own buffers
        _issue(where, dist.all_reduce, [(f,) for f in flats], rop, group=g)
    for flat, b in zip(flats, buckets):
        _unpack(flat, b, out)
    return out if given is not None else _rebuild(tree, spec, out)


# ------------------------------------------------------------------ broadcast
def broadcast(
    tree: Any,
    src: int = 0,
    group: Any = None,
    *,
    bucket_cap_mb: float = _DEFAULT_CAP_MB,
    check: bool | str = "first",
) -> Any:
    """Rank ``src``'s tree on every rank (a new tree everywhere, ``src`` included).

    ``src`` is a rank within ``group``. Arguments and errors as :func:`all_reduce`;
    every rank passes a tree of the same structure (its values are ignored
    except on ``src``).

    Example:
        >>> params = fd.distributed.broadcast(params, src=0)  # same init everywhere
    """
    where = "fd.distributed.broadcast"
    leaves, spec, g, world, _, buckets = _prepare(where, tree, group, check, bucket_cap_mb)
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < world:
        raise ValueError(f"{where}: src must be a rank in [0, {world}), got {src!r}.")
    out: list[Any] = [None] * len(leaves)
    if torch.compiler.is_compiling():
        import torch.distributed._functional_collectives as funcol

        gsrc = dist.get_global_rank(g, src)
        for b in buckets:
            flat = funcol.wait_tensor(funcol.broadcast(_pack(leaves, b), gsrc, g))
            _unpack(flat, b, out)
        return _rebuild(tree, spec, out)
    flats = [_pack(leaves, b) for b in buckets]
    if world > 1:
        _issue(where, dist.broadcast, [(f,) for f in flats], group=g, group_src=src)
    for flat, b in zip(flats, buckets):
        _unpack(flat, b, out)
    return _rebuild(tree, spec, out)


# ------------------------------------------------------------------ all_gather
def all_gather(
    tree: Any,
    group: Any = None,
    *,
    bucket_cap_mb: float = _DEFAULT_CAP_MB,
    check: bool | str = "first",
) -> Any:
    """Every rank's tree, stacked along a new leading dim of size ``world_size``.

    A leaf of shape ``s`` becomes ``[world_size, *s]`` (entry ``r`` is rank
    ``r``'s); a TensorDict of batch size ``b`` gets batch size ``[world_size, *b]``.
    Arguments and errors as :func:`all_reduce`.

    Example:
        >>> losses = fd.distributed.all_gather(metrics)["loss"]  # one per rank
    """
    where = "fd.distributed.all_gather"
    leaves, spec, g, world, _, buckets = _prepare(where, tree, group, check, bucket_cap_mb)
    out: list[Any] = [None] * len(leaves)
    if torch.compiler.is_compiling():
        import torch.distributed._functional_collectives as funcol

        for b in buckets:
            flat = funcol.wait_tensor(funcol.all_gather_tensor(_pack(leaves, b), 0, g))
            _unpack(flat.view(world, b.numel), b, out, (world,))
        return fdtree.unflatten(spec, out)
    pairs = []
    for b in buckets:
        flat = _pack(leaves, b) if len(b.idx) > 1 else leaves[b.idx[0]].reshape(-1)
        every = torch.empty(world * b.numel, dtype=flat.dtype, device=flat.device)
        pairs.append((every, flat.contiguous()))
    _issue(where, all_gather_single, pairs, group=g)
    gathered = [every for every, _ in pairs]
    for every, b in zip(gathered, buckets):
        _unpack(every.view(world, b.numel), b, out, (world,))
    return fdtree.unflatten(spec, out)


# ------------------------------------------------------------------ reduce_scatter
def reduce_scatter(
    tree: Any,
    op: str = "mean",
    group: Any = None,
    *,
    bucket_cap_mb: float = _DEFAULT_CAP_MB,
    check: bool | str = "first",
) -> Any:
    """Reduce over the ranks, then keep this rank's slice of every leaf along dim 0.

    The split rule: every leaf's first dim must be divisible by the world size
    ``W``; rank ``r`` gets rows ``[r * n / W, (r + 1) * n / W)`` of the reduced
    leaf (so ``all_gather`` of the result, flattened over its two leading dims,
    is ``all_reduce`` of the input). A TensorDict of batch size ``[n, ...]``
    comes back with ``[n / W, ...]``. Arguments and errors as :func:`all_reduce`.

    Raises:
        ValueError: a leaf has no dims or its first dim is not divisible by ``W``.

    Example:
        >>> shard = fd.distributed.reduce_scatter(grads, op="sum")
    """
    where = "fd.distributed.reduce_scatter"
    rop = _reduce_op(where, op)
    leaves, spec, g, world, _, buckets = _prepare(where, tree, group, check, bucket_cap_mb)
    _check_mean(where, op, leaves, buckets)
    for i, x in enumerate(leaves):
        if x.ndim == 0 or x.shape[0] % world:
            path = ".".join(map(str, fdtree.paths(tree)[i]))
            raise ValueError(
                f"{where}: the leaf at {path!r} has shape {list(x.shape)}; reduce_scatter "
                f"splits every leaf along dim 0 into {world} equal parts (one a rank), so dim "
                f"0 must exist and be divisible by the world size {world}."
            )
    out: list[Any] = [None] * len(leaves)
    shards = [_Shard(b, world) for b in buckets]
    if torch.compiler.is_compiling():
        import torch.distributed._functional_collectives as funcol

        name = "sum" if op == "mean" else op
        for s in shards:
            flat = s.pack(leaves)
            if op == "mean" and world > 1:
                flat = flat / world
            _unpack(funcol.wait_tensor(funcol.reduce_scatter_tensor(flat, name, 0, g)), s, out)
        return fdtree.unflatten(spec, out)
    pairs = []
    for s in shards:
        flat = s.pack(leaves)
        if op == "mean" and world > 1:
            flat.div_(world)
        pairs.append((torch.empty(s.numel, dtype=flat.dtype, device=flat.device), flat))
    _issue(where, reduce_scatter_single, pairs, rop, group=g)
    results = [mine for mine, _ in pairs]
    for mine, s in zip(results, shards):
        _unpack(mine, s, out)
    return fdtree.unflatten(spec, out)


class _Shard(_Bucket):
    """A bucket laid out rank-major: the input is ``[W, numel]`` (rank ``r``'s rows
    of every leaf, in order), the output one rank's ``numel``."""

    __slots__ = ("world",)
    world: Any

    def __init__(self, b: _Bucket, world: int) -> None:
        self.idx = b.idx
        self.world = world
        self.shapes = [torch.Size([s[0] // world, *s[1:]]) for s in b.shapes]
        self.sizes = [n // world for n in b.sizes]
        self.numel = b.numel // world
        self._like = None

    def pack(self, leaves: list[Tensor]) -> Tensor:
        parts = [leaves[i].reshape(self.world, -1) for i in self.idx]
        return torch.cat(parts, dim=1).reshape(-1)  # cat always copies
