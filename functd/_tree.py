"""Pytree registration of TensorDict with optree (namespace "functd") and torch.

Both registries give the same leaves in the same canonical order: keys sorted,
nested TensorDicts flattened in place. The static part (the "spec") holds the
sorted keys and, for each entry, its rank beyond the batch dims; two specs are
equal when their keys are, so TensorDicts with the same keys have equal tree
structures whatever their batch size or construction order.

The batch size is *not* static: unflattening derives it from the first tensor
leaf (its ndim minus its feature rank). So inside ``torch.func.vmap`` the
mapped dim drops out of ``batch_size`` by itself, and ``torch.compile`` does not
specialise on it.

Example:
    >>> leaves, spec = fd.tree.flatten(td)          # optree, namespace "functd"
    >>> fd.tree.unflatten(spec, leaves)
    >>> torch.utils._pytree.tree_flatten(td)        # same leaves, same order
"""

from __future__ import annotations

import json

import optree
import optree.pytree
import torch
import torch.utils._pytree as torch_pytree

from ._td import TensorDict, _new

__all__ = ["NAMESPACE", "tree"]

NAMESPACE = "functd"


class _Spec:
    """Static part of a flattened TensorDict; compares and hashes by its keys only."""

    __slots__ = ("batch_size", "keys", "ranks")

    def __init__(self, keys: tuple, ranks: tuple, batch_size: tuple | None) -> None:
        self.keys = keys  # sorted entry names
        self.ranks = ranks  # per entry: ndim beyond the batch dims (None: not a tensor)
        self.batch_size = batch_size  # only kept for a TensorDict without entries

    def __eq__(self, other: object) -> bool:
        return type(other) is _Spec and other.keys == self.keys

    def __hash__(self) -> int:
        return hash(self.keys)

    def __repr__(self) -> str:
        return f"TensorDictSpec(keys={list(self.keys)})"


def _spec(td: TensorDict) -> _Spec:
    spec = td._spec
    if spec is None:
        data = td._data
        keys = tuple(sorted(data))
        n = len(td._batch_size)
        ranks = tuple(_rank(data[k], n) for k in keys)
        spec = _Spec(keys, ranks, None if keys else tuple(td._batch_size))
        object.__setattr__(td, "_spec", spec)
    return spec


def _rank(v, n: int):
    if isinstance(v, torch.Tensor):
        return v.ndim - n
    if isinstance(v, TensorDict):
        return len(v._batch_size) - n
    return None


def _flatten(td: TensorDict):
    spec = _spec(td)
    data = td._data
    return [data[k] for k in spec.keys], spec


def _unflatten(values, spec: _Spec) -> TensorDict:
    values = list(values)
    for v, r in zip(values, spec.ranks):
        if isinstance(v, torch.Tensor):
            shape = v.shape
            break
        if isinstance(v, TensorDict):
            shape = v._batch_size
            break
    else:  # no tensor among the leaves (a tree of ints, None...)
        return _new(dict(zip(spec.keys, values)), torch.Size(spec.batch_size or ()))
    return _new(dict(zip(spec.keys, values)), shape[: len(shape) - r])


# ------------------------------------------------------------------ optree
def _optree_flatten(td: TensorDict):
    leaves, spec = _flatten(td)
    return leaves, spec, spec.keys


optree.register_pytree_node(
    TensorDict,
    _optree_flatten,
    lambda spec, children: _unflatten(children, spec),
    path_entry_type=optree.MappingEntry,
    namespace=NAMESPACE,
)

tree = optree.pytree.reexport(namespace=NAMESPACE, module="functd.tree")


# ------------------------------------------------------------------ torch
def _to_dumpable(spec: _Spec) -> str:
    return json.dumps({"keys": list(spec.keys), "ranks": list(spec.ranks), "bs": spec.batch_size})


def _from_dumpable(s: str) -> _Spec:
    d = json.loads(s)
    bs = tuple(d["bs"]) if d["bs"] is not None else None
    return _Spec(tuple(d["keys"]), tuple(d["ranks"]), bs)


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
