"""Pytree registration of TensorDict with optree (namespace "functd") and torch.

Both registries give the same leaves in the same canonical order: keys sorted,
nested TensorDicts flattened in place. The static part (the "spec") holds the
sorted keys and, for each entry, its rank beyond the batch dims; two specs are
equal when their keys are, so TensorDicts with the same keys have equal tree
structures whatever their batch size or construction order. The spec also keeps
the insertion order (not compared), so unflattening gives ``keys()`` back in it.

The batch size is *not* static: unflattening derives it from the first leaf
that holds a tensor (its ndim minus its feature rank); nested TensorDicts
without any tensor take theirs from the parent. So inside ``torch.func.vmap``
the mapped dim drops out of ``batch_size`` by itself, and ``torch.compile`` does
not specialise on it.

This file is also the one owner of the fast flat-leaf paths for a single
TensorDict (optimizers, training step, collectives): ``flat_leaves`` lists the
leaves in the same order by a direct walk, ``unflatten_like`` puts a list of new
leaves back into the layout of a template TensorDict, and ``same_keys`` compares
two layouts.

Example:
    >>> leaves, spec = fd.tree.flatten(td)          # optree, namespace "functd"
    >>> fd.tree.unflatten(spec, leaves)
    >>> torch.utils._pytree.tree_flatten(td)        # same leaves, same order
    >>> unflatten_like(td, [x * 2 for x in flat_leaves(td)])   # td.apply(lambda x: x * 2)
"""

from __future__ import annotations

import json
from typing import Any

import optree
import optree.pytree
import torch
import torch.utils._pytree as torch_pytree
from torch import Tensor

from ._marks import carry
from ._tensordict import (
    TensorDict,
    from_parts,
    is_dynamo_compiling,
    new_unchecked,
    set_spec_slot,
)

__all__ = [
    "NAMESPACE",
    "flat_leaves",
    "same_keys",
    "spec_of",
    "tree",
    "unflatten_like",
]

NAMESPACE = "functd"


class _Spec:
    """Static part of a flattened TensorDict; compares and hashes by its keys only."""

    __slots__ = ("_inorder", "all_full", "batch_size", "full", "keys", "order", "ranks")
    _inorder: Any
    all_full: Any
    batch_size: Any
    full: Any
    keys: Any
    order: Any
    ranks: Any

    def __init__(
        self,
        keys: tuple[Any, ...],
        ranks: tuple[Any, ...],
        batch_size: tuple | None,
        full: tuple,
        order=None,
    ) -> None:
        self.keys = keys  # sorted entry names
        self.order = order  # the insertion order, when it is not the sorted one
        self.ranks = ranks  # per entry: ndim beyond the batch dims (None: not a tensor)
        self.full = full  # per entry: holds a tensor (so its shape tells the batch size)
        self.all_full = bool(full) and all(full)
        self._inorder = None  # cache of ``_inorder``
        self.batch_size = batch_size  # only kept for a TensorDict without any tensor

    def __eq__(self, other: object) -> bool:
        return type(other) is _Spec and other.keys == self.keys

    def __hash__(self) -> int:
        return hash(self.keys)

    def __repr__(self) -> str:
        return f"TensorDictSpec(keys={list(self.keys)})"


def spec_of(td: TensorDict) -> _Spec:
    """The static part of ``td`` (its keys, ranks...), computed once and cached on ``td``.

    Its ``keys`` are the leaf order (sorted keys): the one place that says it; both
    registries, ``flat_leaves``, ``fd.vmap`` and the Jacobians walk ``spec.keys``."""
    spec = td._spec
    if spec is None:
        data = td._data
        keys = tuple(sorted(data))
        n = len(td._batch_size)
        ranks, full = [], []  # one pass, no per-entry calls (as _rank and _full)
        for k in keys:
            v = data[k]
            if isinstance(v, torch.Tensor):
                ranks.append(v.ndim - n)
                full.append(True)
            else:
                ranks.append(_rank(v, n))
                full.append(_full(v))
        order = tuple(data)
        order = None if order == keys else order  # type: ignore[assignment]
        bs = None if any(full) else tuple(td._batch_size)
        spec = _Spec(keys, tuple(ranks), bs, tuple(full), order)
        if not is_dynamo_compiling():
            set_spec_slot(td, spec)
    return spec


def _rank(v, n: int):
    if isinstance(v, torch.Tensor):
        return v.ndim - n
    if isinstance(v, TensorDict):
        return len(v._batch_size) - n
    return None


def _full(v) -> bool:
    if isinstance(v, torch.Tensor):
        return True
    return isinstance(v, TensorDict) and any(spec_of(v).full)


def _inorder(spec: _Spec) -> tuple[tuple[Any, ...], _Spec]:
    """(permutation, spec) that put the sorted entries back in insertion order (cached)."""
    if spec._inorder is None:
        i = {k: n for n, k in enumerate(spec.keys)}
        perm = tuple(i[k] for k in spec.order)
        ranks, full = tuple(spec.ranks[j] for j in perm), tuple(spec.full[j] for j in perm)
        spec._inorder = (perm, _Spec(spec.order, ranks, spec.batch_size, full))
    return spec._inorder


def _rebatch(td: TensorDict, bs: torch.Size) -> TensorDict:
    """Give a TensorDict without tensors (only empty nested ones) the batch size ``bs``."""
    n = len(td._batch_size)
    data = {
        k: _rebatch(v, torch.Size((*bs, *v._batch_size[n:]))) if isinstance(v, TensorDict) else v
        for k, v in td._data.items()
    }
    return from_parts(data, bs)


def _flatten(td: TensorDict):
    spec = td._spec or spec_of(td)
    if spec.order is None:  # inserted in sorted order
        return list(td._data.values()), spec
    return list(map(td._data.__getitem__, spec.keys)), spec


def _unflatten(values, spec: _Spec) -> TensorDict:
    canon = spec
    if spec.order is not None:  # give back the insertion order (keys() is ordered)
        perm, spec = spec._inorder or _inorder(spec)
        values = [values[j] for j in perm]
    if spec.all_full:  # fast path: the first entry tells the batch size
        v = values[0]
        if isinstance(v, torch.Tensor):
            shape = v.shape
            n = len(shape) - spec.ranks[0]
            td = from_parts(dict(zip(spec.keys, values)), shape[: max(n, 0)])
            if n >= 0 and not is_dynamo_compiling():
                _keep_spec(td, values, spec.ranks, n, canon)
            return td
    values = list(values)
    for v, rank, full in zip(values, spec.ranks, spec.full):
        if full and isinstance(v, torch.Tensor | TensorDict):
            shape = v.shape if isinstance(v, torch.Tensor) else v._batch_size
            bs = shape[: max(len(shape) - rank, 0)]  # a leaf mapped by vmap in a [] td
            break
    else:  # no tensor among the leaves (a tree of ints, None, empty TensorDicts...)
        return from_parts(dict(zip(spec.keys, values)), torch.Size(spec.batch_size or ()))
    if not all(spec.full):
        # entries without tensors kept a static batch size (stale inside vmap): rederive
        for i, (v, r, full) in enumerate(zip(values, spec.ranks, spec.full)):
            if not full and isinstance(v, TensorDict):
                values[i] = _rebatch(v, torch.Size((*bs, *v._batch_size[len(v._batch_size) - r :])))
    td = from_parts(dict(zip(spec.keys, values)), bs)
    if spec.all_full and not is_dynamo_compiling():  # (e.g. a TensorDict of TensorDicts)
        _keep_spec(td, values, spec.ranks, len(bs), canon)
    return td


def _keep_spec(
    td: TensorDict, values: list[Any], ranks: tuple[Any, ...], n: int, spec: _Spec
) -> None:
    """Give a TensorDict rebuilt from ``spec`` that spec when it is its own: every entry
    keeps its rank beyond the ``n`` batch dims and holds a tensor (so the next flatten of
    it, e.g. by torch.func after vmap or grad, skips recomputing it)."""
    for v, r in zip(values, ranks):
        if isinstance(v, torch.Tensor):
            if v.ndim - n != r:
                return
        elif not (
            isinstance(v, TensorDict)
            and (s := v._spec) is not None
            and s.all_full
            and len(v._batch_size) - n == r
        ):
            return
    set_spec_slot(td, spec)


# ------------------------------------------------------------------ flat leaves
# The leaves of one TensorDict in optree's order (sorted keys, depth first), by a direct
# walk (cheaper than a generic pytree flatten), and a list of new leaves put back into
# the layout of a template TensorDict whose leaves have the same shapes (the template's
# batch sizes and cached specs are reused). No checks: callers check their inputs.
def flat_leaves(td: TensorDict, specs: list[Any] | None = None) -> list[Tensor]:
    """The leaves of ``td`` in the order of ``fd.tree.leaves(td)``; when ``specs`` is a
    list, the key spec of every TensorDict met is appended to it (in walk order).

    Example:
        >>> flat_leaves(fd.TensorDict({"b": torch.ones(1), "a": {"x": torch.zeros(1)}}))
        [tensor([0.]), tensor([1.])]
    """
    out: list[Tensor] = []
    _walk(td, out, specs)
    return out


def _walk(td: TensorDict, out: list[Any], specs: list[Any] | None) -> None:
    data = td._data
    spec = td._spec or spec_of(td)
    if specs is not None:
        specs.append(spec)
    for k in spec.keys:
        v = data[k]
        if type(v) is TensorDict:
            _walk(v, out, specs)
        else:
            out.append(v)


def unflatten_like(template: TensorDict, leaves: list[Tensor]) -> TensorDict:
    """A TensorDict laid out as ``template`` (same keys, order and batch sizes) holding
    ``leaves`` (in the order of ``flat_leaves``, with the shapes of the template's).

    Example:
        >>> unflatten_like(td, flat_leaves(td)).keys() == td.keys()
        True
    """
    return _build(template, iter(leaves))


def _build(td: TensorDict, it) -> TensorDict:
    data = td._data
    spec = td._spec or spec_of(td)
    vals = {}
    for k in spec.keys:
        v = data[k]
        vals[k] = _build(v, it) if type(v) is TensorDict else next(it)
    if spec.order is not None:  # insertion order differs from the sorted one
        vals = {k: vals[k] for k in spec.order}
    if is_dynamo_compiling():  # dynamo cannot trace the slot setters
        out = from_parts(vals, td._batch_size)
        object.__setattr__(out, "_spec", spec)
        if td._check_cache is not None:  # (the only write _marks.py does not make: dynamo)
            object.__setattr__(out, "_check_cache", td._check_cache)
        return out
    out = new_unchecked(vals, td._batch_size)  # from_parts without its dynamo test
    set_spec_slot(out, spec)  # same keys and ranks: share the cached spec
    carry(td, out)  # same keys and shapes: a module's params check holds too
    return out


def same_keys(a: TensorDict, b: TensorDict) -> bool:
    """Whether ``a`` and ``b`` have the same keys at every level (and the same entries
    nested), whatever their batch sizes."""
    if not (a._spec is not None and a._spec is b._spec) and a._data.keys() != b._data.keys():
        return False
    data = b._data
    for k, v in a._data.items():
        if type(v) is TensorDict:  # (TensorDict has no subclasses)
            if type(data[k]) is not TensorDict or not same_keys(v, data[k]):  # type: ignore[arg-type]
                return False
        elif type(data[k]) is TensorDict:
            return False
    return True


# ------------------------------------------------------------------ optree
def _optree_flatten(td: TensorDict):
    leaves, spec = _flatten(td)
    return leaves, spec, spec.keys


def _unflatten_optree(spec: _Spec, children) -> TensorDict:
    return _unflatten(children, spec)


optree.register_pytree_node(
    TensorDict,
    _optree_flatten,  # type: ignore[arg-type]
    _unflatten_optree,  # type: ignore[arg-type]
    path_entry_type=optree.MappingEntry,
    namespace=NAMESPACE,
)

tree = optree.pytree.reexport(namespace=NAMESPACE, module="functd.tree")


# ------------------------------------------------------------------ torch
def _to_dumpable(spec: _Spec) -> str:
    return json.dumps(
        {
            "keys": list(spec.keys),
            "ranks": list(spec.ranks),
            "full": list(spec.full),
            "order": None if spec.order is None else list(spec.order),
            "bs": spec.batch_size,
        }
    )


def _from_dumpable(s: str) -> _Spec:
    d = json.loads(s)
    bs = tuple(d["bs"]) if d["bs"] is not None else None
    order = None if d.get("order") is None else tuple(d["order"])
    return _Spec(tuple(d["keys"]), tuple(d["ranks"]), bs, tuple(d["full"]), order)


def _flatten_with_keys(td: TensorDict):
    leaves, spec = _flatten(td)
    return [(torch_pytree.MappingKey(k), v) for k, v in zip(spec.keys, leaves)], spec


torch_pytree.register_pytree_node(
    TensorDict,
    _flatten,
    _unflatten,
    serialized_type_name="functd.TensorDict",
    to_dumpable_context=_to_dumpable,
    from_dumpable_context=_from_dumpable,
    flatten_with_keys_fn=_flatten_with_keys,
)

# torch.load(weights_only=True) may rebuild TensorDicts (see TensorDict.__reduce__)
torch.serialization.add_safe_globals([TensorDict])
