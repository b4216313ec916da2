"""Operations on the batch dims of TensorDicts: indexing, stack, cat, reshape...

They are free functions (``fd.stack``, ``fd.cat``); TensorDict methods of the
same name call them. None changes its inputs.

This file sits below the class (``_tensordict`` imports it, never the reverse): it
reaches TensorDict through the instances it is given, ``type(td)`` for nesting
checks and ``td._from_parts`` (the class's unchecked constructor) for results.

Example:
    >>> a = fd.TensorDict({"x": torch.zeros(3, 2)}, [3])
    >>> fd.stack([a, a]).batch_size, fd.cat([a, a]).batch_size, a[0:2].batch_size
    (torch.Size([2, 3]), torch.Size([6]), torch.Size([2]))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch

from .. import _errors as E

#: A TensorDict, named by a type variable: this file never imports the class.
TensorDict = TypeVar("TensorDict")

__all__ = [
    "cat",
    "expand",
    "index",
    "reshape",
    "squeeze",
    "stack",
    "unbind",
    "unsqueeze",
    "unstack",
]


def _normalize_index(idx: Any, bs: torch.Size) -> tuple[Any, ...]:
    items = list(idx) if isinstance(idx, tuple) else [idx]
    used, ellipsis = 0, None
    for i, it in enumerate(items):
        if it is Ellipsis:
            if ellipsis is not None:
                raise IndexError("an index can only have a single ellipsis ('...')")
            ellipsis = i
        elif it is None:
            continue
        elif isinstance(it, bool):
            raise TypeError("TensorDict indices may not be Python bools; use a bool tensor mask")
        elif isinstance(it, int | torch.SymInt | slice):
            used += 1
        elif isinstance(it, list | range):
            items[i] = it = (
                torch.as_tensor(list(it)) if len(it) else torch.zeros(0, dtype=torch.long)
            )
            used += it.ndim if it.dtype == torch.bool else 1
        elif isinstance(it, torch.Tensor):
            if it.dtype != torch.bool and (it.dtype.is_floating_point or it.dtype.is_complex):
                raise TypeError(
                    f"TensorDict index {idx!r}: an index tensor must hold integers or be a bool "
                    f"mask; got dtype {it.dtype}."
                )
            used += it.ndim if it.dtype == torch.bool else 1
        elif isinstance(it, str):
            raise TypeError(
                f"index {idx!r} mixes keys and batch indices: get the entry first, "
                f"td[{it!r}][...], or index the batch first, td[...][{it!r}]."
            )
        else:
            raise TypeError(
                f"TensorDict index of type {type(it).__name__} is not supported: use str or "
                "tuple-of-str keys, or int, slice, None, ..., bool masks and index tensors."
            )
    if used > len(bs):
        raise IndexError(E.index_too_many(used, bs))
    if ellipsis is not None:
        items[ellipsis : ellipsis + 1] = [slice(None)] * (len(bs) - used)
    _check_bounds(idx, items, bs)
    return tuple(items)


def _check_bounds(idx: Any, items: list[Any], bs: torch.Size) -> None:
    """Integers within their batch dim, bool masks of the shape of the dims they cover."""
    d = 0
    for it in items:
        if it is None:
            continue
        if type(it) is int:
            if not -bs[d] <= it < bs[d]:
                raise IndexError(
                    f"TensorDict index {idx!r}: {it} is out of range for batch dim {d} of size "
                    f"{bs[d]} (batch_size {list(bs)}; valid: {-bs[d]} to {bs[d] - 1})."
                )
        elif isinstance(it, torch.Tensor) and it.dtype == torch.bool:
            if it.shape != bs[d : d + it.ndim]:
                raise IndexError(
                    f"TensorDict index {idx!r}: a bool mask of shape {list(it.shape)} on batch "
                    f"dims {d}.. of sizes {list(bs[d : d + it.ndim])} (batch_size {list(bs)}); "
                    "a mask must have the shape of the batch dims it covers."
                )
            d += it.ndim
            continue
        d += 1


def index(td: TensorDict, idx: Any) -> TensorDict:
    """Index the batch dims of ``td`` as a tensor of shape ``td.batch_size`` would be.

    Supports int, slice, None, ``...``, bool masks and integer index tensors.

    Raises:
        IndexError: the index uses more dims than the batch has.
    """
    items = _normalize_index(idx, td._batch_size)
    if torch.compiler.is_compiling():
        scalar = _traced_scalar(items)
        if scalar is not None:
            return _index_traced_scalar(td, items, scalar)
    try:
        return _index(td, items)
    except (IndexError, RuntimeError) as e:  # e.g. an index tensor's value out of range
        raise IndexError(
            f"TensorDict index {idx!r} on batch_size {list(td._batch_size)}: {e}"
        ) from None


def _traced_scalar(items: tuple[Any, ...]) -> int | None:
    """The position of the index's one 0-d integer tensor, if it is the only tensor among
    ints, slices and None: while tracing, ``v[i]`` with such an ``i`` reads its value
    (``__index__``), which is data-dependent; ``_index_traced_scalar`` gathers instead."""
    found = None
    for p, it in enumerate(items):
        if isinstance(it, torch.Tensor):
            if found is not None or it.ndim or it.dtype == torch.bool:
                return None
            found = p
    return found


def _index_traced_scalar(td: TensorDict, items: tuple[Any, ...], p: int) -> TensorDict:
    """``td[items]`` whose item ``p`` is a traced 0-d integer tensor: index with it as a
    one-element index tensor (negative values wrapped as Python does), then drop the
    size-1 dim it leaves. Out-of-range values are not checked (as in jax.jit)."""
    d = sum(1 for it in items[:p] if it is not None)  # the batch dim it indexes
    i = items[p]
    i = torch.where(i < 0, i + td._batch_size[d], i).reshape(1)
    out = _index(td, (*items[:p], i, *items[p + 1 :]))
    at = sum(1 for it in items[:p] if type(it) is not int)  # its dim in the result
    return _index(out, (*(slice(None),) * at, 0))


def _index(td: TensorDict, items: tuple[Any, ...]) -> TensorDict:
    n = len(td._batch_size)
    cls = type(td)
    data, new_bs = {}, None
    for k, v in td._data.items():
        if isinstance(v, cls):
            r = _index(v, items)
            extra, shape = len(v._batch_size) - n, r._batch_size
        else:
            r = v[items]
            extra, shape = v.ndim - n, r.shape
        if new_bs is None:
            new_bs = shape[: len(shape) - extra]
        data[k] = r
    if new_bs is None:  # no leaves: the batch size a tensor of the batch shape would get
        new_bs = _leafless_shape(td._batch_size, items)
    return td._from_parts(data, new_bs)


def _leafless_shape(bs: torch.Size, items: tuple[Any, ...]) -> torch.Size:
    """``torch.empty(bs)[items].shape``, allocating nothing even for a huge (forged)
    batch: a stride-0 dummy for ints, slices and None (a view); on the meta device
    when index tensors are used (masks as their ``nonzero()``), their values checked
    against their batch dim here."""
    cpu = [i.cpu() if isinstance(i, torch.Tensor) else i for i in items]
    scalar_mask = any(
        isinstance(i, torch.Tensor) and i.ndim == 0 and i.dtype == torch.bool for i in cpu
    )
    if (
        scalar_mask
        or torch.compiler.is_compiling()
        or not any(isinstance(i, torch.Tensor) for i in cpu)
    ):
        return torch.zeros((), dtype=torch.uint8).expand(bs)[tuple(cpu)].shape
    meta: list[Any] = []
    d = 0
    for it in cpu:
        if not isinstance(it, torch.Tensor):
            meta.append(it)
            d += it is not None
            continue
        if it.dtype == torch.bool:  # its shape was checked: the dims it covers
            meta.extend(t.to("meta") for t in it.nonzero(as_tuple=True))
            d += it.ndim
            continue
        if it.numel() and not (-bs[d] <= int(it.min()) and int(it.max()) < bs[d]):
            raise IndexError(
                f"an index tensor holds values out of range for batch dim {d} of size {bs[d]} "
                f"(valid: {-bs[d]} to {bs[d] - 1})"
            )
        meta.append(int(it) if it.ndim == 0 else it.to("meta"))  # a 0-d one: an int
        d += 1
    return torch.empty(bs, dtype=torch.uint8, device="meta")[tuple(meta)].shape


def _check_same_keys(tds: Sequence[TensorDict], where: str, prefix: tuple[Any, ...] = ()) -> None:
    keys0 = tds[0]._data.keys()
    for i, t in enumerate(tds[1:], 1):
        if t._data.keys() != keys0:
            full0 = [(*prefix, k) for k in keys0]
            raise ValueError(E.stack_keys(i, full0, [(*prefix, k) for k in t._data], where))


def _is_td(x: Any) -> bool:
    """A functd TensorDict: its class carries the unchecked constructor ``_from_parts``."""
    return getattr(type(x), "_from_parts", None) is not None


def _check_list(tds: Any, where: str) -> list[TensorDict]:
    if _is_td(tds) or not isinstance(tds, Sequence) or not tds:
        raise TypeError(f"{where} takes a non-empty list of TensorDicts, e.g. {where}([a, b])")
    for i, t in enumerate(tds):
        if not _is_td(t):
            raise TypeError(f"{where}: element {i} is a {type(t).__name__}, not a TensorDict")
    return list(tds)


def _norm_dim(dim: int, ndim: int, where: str) -> int:
    if not -ndim <= dim < ndim:
        raise IndexError(
            f"{where}: dim {dim} is out of range for {ndim} batch dims "
            f"(valid: {-ndim} to {ndim - 1})"
        )
    return dim % ndim


def stack(tds: Sequence[TensorDict], dim: int = 0) -> TensorDict:
    """Stack TensorDicts with equal keys and shapes along a new batch dim ``dim``.

    Raises:
        ValueError: the keys, batch sizes or feature shapes differ (names them).

    Example:
        >>> fd.stack([td, td]).batch_size  # td.batch_size == [5]
        torch.Size([2, 5])
    """
    tds, dim = _check_join(tds, dim, "stack")
    return _join(tds, dim, (), None, "stack")


def cat(tds: Sequence[TensorDict], dim: int = 0) -> TensorDict:
    """Concatenate TensorDicts along the existing batch dim ``dim``.

    Raises:
        ValueError: the keys, other batch dims or feature shapes differ.
    """
    tds, dim = _check_join(tds, dim, "cat")
    return _join(tds, dim, (), dim, "cat")


def _check_join(tds: Any, dim: int, where: str) -> tuple[list[TensorDict], int]:
    """The list checks of ``stack`` (equal batch sizes) and ``cat`` (equal but in ``dim``)."""
    tds = _check_list(tds, where)
    bs = tds[0]._batch_size
    skip = dim if where == "cat" else None
    dim = _norm_dim(dim, len(bs) + (skip is None), where)
    skip = None if skip is None else dim
    for i, t in enumerate(tds[1:], 1):
        tb = t._batch_size
        if len(tb) != len(bs) or any(a != b for j, (a, b) in enumerate(zip(tb, bs)) if j != skip):
            why = (
                "stacked TensorDicts must have the same batch size."
                if skip is None
                else f"they may differ only in dim {dim}."
            )
            raise ValueError(
                f"{where}: TensorDict 0 has batch_size {list(bs)} but TensorDict {i} has "
                f"{list(tb)}; {why}"
            )
    return tds, dim


def _join(tds: list[TensorDict], dim: int, prefix: tuple[Any, ...], skip: int | None, where: str):
    """Stack (``skip=None``: along a new dim ``dim``) or cat (``skip=dim``) the entries
    of ``tds`` with the same keys; nested levels recurse."""
    _check_same_keys(tds, where, prefix)
    first = tds[0]
    cls = type(first)
    bs = first._batch_size
    n = len(bs)
    data = {}
    for k, v in first._data.items():
        vals = [t._data[k] for t in tds]
        key = (*prefix, k)
        _same_types(vals, key, where, cls)
        if isinstance(v, cls):
            _same_batch(vals, key, where, skip)
            data[k] = _join(vals, dim, key, skip, where)
        else:
            _same_shapes(vals, key, n, where, skip)
            data[k] = torch.stack(vals, dim) if skip is None else torch.cat(vals, dim)
    if skip is None:
        size = (*bs[:dim], len(tds), *bs[dim:])
    else:
        size = (*bs[:dim], sum(t._batch_size[dim] for t in tds), *bs[dim + 1 :])
    return first._from_parts(data, torch.Size(size))


def _same_types(vals: list[Any], key: tuple[Any, ...], where: str, cls: type) -> None:
    is_td = isinstance(vals[0], cls)
    for i, v in enumerate(vals[1:], 1):
        if isinstance(v, cls) != is_td:
            raise ValueError(
                f"{where}: entry {E.fmt_key(key)} is a {type(vals[0]).__name__} in "
                f"TensorDict 0 but a {type(v).__name__} in TensorDict {i}."
            )


def _same_batch(vals: list[Any], key: tuple[Any, ...], where: str, skip: int | None) -> None:
    """Nested TensorDicts (which may have more batch dims) must agree, but in dim ``skip``."""
    b0 = vals[0]._batch_size
    for i, v in enumerate(vals[1:], 1):
        b = v._batch_size
        if len(b) != len(b0) or any(x != y for j, (x, y) in enumerate(zip(b, b0)) if j != skip):
            raise ValueError(
                f"{where}: entry {E.fmt_key(key)} is a TensorDict of batch_size {list(b0)} in "
                f"TensorDict 0 but {list(b)} in TensorDict {i}. All entries must match."
            )


def _same_shapes(
    vals: list[Any], key: tuple[Any, ...], n: int, where: str, skip: int | None
) -> None:
    s0 = vals[0].shape
    for i, v in enumerate(vals[1:], 1):
        s = v.shape
        if len(s) != len(s0) or any(
            a != b
            for j, (a, b) in enumerate(zip(s, s0))
            if j >= n or (skip is not None and j != skip)
        ):
            raise ValueError(E.stack_shapes(i, key, s0[n:], s[n:], where))


def unbind(td: TensorDict, dim: int = 0) -> tuple[TensorDict, ...]:
    """Split along batch dim ``dim`` (the inverse of ``stack``): ``fd.unbind(td)``."""
    n = len(td._batch_size)
    dim = _norm_dim(dim, n, "unbind")
    lead = (slice(None),) * dim
    return tuple(_index(td, (*lead, i)) for i in range(td._batch_size[dim]))


def _infer_shape(shape: tuple[Any, ...], numel) -> torch.Size:
    if len(shape) == 1 and isinstance(shape[0], Sequence):
        shape = tuple(shape[0])
    unknown = [i for i, s in enumerate(shape) if s == -1]
    if len(unknown) > 1:
        raise ValueError(f"reshape: only one dim can be -1, got {list(shape)}")
    if unknown:
        known = 1
        for s in shape:
            if s != -1:
                known *= s
        filled = list(shape)
        filled[unknown[0]] = numel // known if known else 0
        return torch.Size(filled)
    return torch.Size(shape)


def _map_batch(td: TensorDict, fn, new_bs: torch.Size) -> TensorDict:
    """Apply ``fn(leaf, rest)`` to each leaf, where ``rest`` is the leaf's shape after
    ``td``'s batch dims (for a leaf of a nested TensorDict with extra batch dims, those
    extra dims come first in ``rest``). A nested level's new batch size is ``new_bs``
    followed by its own extra dims."""
    return _map_level(td, fn, new_bs, len(td._batch_size), new_bs)


def _map_level(td: TensorDict, fn, top_bs: torch.Size, n: int, new_bs: torch.Size):
    cls = type(td)
    data = {}
    for k, v in td._data.items():
        if isinstance(v, cls):
            sub = torch.Size((*top_bs, *v._batch_size[n:]))
            data[k] = _map_level(v, fn, top_bs, n, sub)
        else:
            data[k] = fn(v, v.shape[n:])
    return td._from_parts(data, new_bs)


def reshape(td: TensorDict, *shape: int) -> TensorDict:
    """Reshape the batch dims: ``td.reshape(2, -1)`` (feature dims are kept)."""
    new_bs = _infer_shape(shape, td._batch_size.numel())
    if new_bs.numel() != td._batch_size.numel():
        raise ValueError(
            f"reshape: batch_size {list(td._batch_size)} ({td._batch_size.numel()} elements) "
            f"cannot become {list(new_bs)} ({new_bs.numel()} elements)"
        )
    return _map_batch(td, lambda x, f: x.reshape((*new_bs, *f)), new_bs)


def unsqueeze(td: TensorDict, dim: int) -> TensorDict:
    """Insert a batch dim of size 1 at ``dim`` (negative counts from the last batch dim)."""
    n = len(td._batch_size)
    d = _norm_dim(dim, n + 1, "unsqueeze")
    bs = td._batch_size
    return _map_batch(td, lambda x, f: x.unsqueeze(d), torch.Size((*bs[:d], 1, *bs[d:])))


def squeeze(td: TensorDict, dim: int | None = None) -> TensorDict:
    """Remove batch dims of size 1 (all of them, or only ``dim`` if it has size 1)."""
    bs = td._batch_size
    if dim is None:
        dims = tuple(i for i, s in enumerate(bs) if s == 1)
    else:
        d = _norm_dim(dim, len(bs), "squeeze")
        dims = (d,) if bs[d] == 1 else ()
    if not dims:
        return td
    new_bs = torch.Size(s for i, s in enumerate(bs) if i not in dims)
    return _map_batch(td, lambda x, f: x.squeeze(dims), new_bs)


def expand(td: TensorDict, *shape: int) -> TensorDict:
    """Expand the batch dims to ``shape`` (new dims on the left; -1 keeps a dim), no copy."""
    if len(shape) == 1 and isinstance(shape[0], Sequence):
        shape = tuple(shape[0])
    bs = td._batch_size
    if len(shape) < len(bs):
        raise ValueError(f"expand: shape {list(shape)} has fewer dims than batch_size {list(bs)}")
    lead = len(shape) - len(bs)
    new = []
    for i, s in enumerate(shape):
        old = bs[i - lead] if i >= lead else None
        if s == -1:
            if old is None:
                raise ValueError(f"expand: -1 is not allowed for the new leading dim {i}")
            s = old
        elif old is not None and old != 1 and old != s:
            raise ValueError(f"expand: batch dim {i - lead} of size {old} cannot expand to {s}")
        new.append(s)
    new_bs = torch.Size(new)
    return _map_batch(td, lambda x, f: x.expand((*new_bs, *f)), new_bs)


def unstack(td: TensorDict) -> tuple[TensorDict, ...]:
    """Split an ensemble (or any stack) along batch dim 0: the inverse of ``fd.stack``.

    Raises:
        TypeError: ``td`` is not a TensorDict.
        ValueError: ``td`` has no batch dim (``batch_size=[]``): there is nothing to split.

    Example:
        >>> members = fd.unstack(fd.stack([p0, p1, p2]))   # (p0, p1, p2), as values
        >>> len(members)
        3
    """
    if not _is_td(td):
        raise TypeError(
            f"unstack takes a TensorDict (e.g. stacked params); got {type(td).__name__}"
        )
    if not td._batch_size:
        raise ValueError(
            "unstack: the TensorDict has batch_size [], so there is no member dim to split. "
            "An ensemble made by fd.stack(params_list) or fd.vmap(m.init)(keys) has its members "
            "in batch dim 0."
        )
    return unbind(td, 0)
