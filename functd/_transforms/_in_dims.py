"""``fd.vmap``'s in_dims: one dim (or None) per leaf of the arguments, checked.

Two steps. ``prefix`` walks the in_dims tree against the arguments, only as deep as
in_dims (or an int meeting a plain container) goes: it checks the dims (names the
path when they do not fit), resolves an int where it meets a TensorDict (negative:
from its last batch dim; only batch dims can be mapped) or a tensor, turns a mapping
given for a TensorDict into a TensorDict of dims, and lists every mapped tensor and
TensorDict for the size check. Then optree's prefix broadcasting
(``optree.broadcast_prefix``, functd's namespace, None a leaf as in torch's pytree)
gives each leaf of ``optree.tree_flatten(args)`` its dim. The broadcast depends only
on the two structures, so it is cached by ``(prefix, treespec)`` (``MAX_CACHED``
entries, the oldest dropped first); a TensorDict's treespec compares its keys, which
is all the broadcast reads.

Example:
    >>> leaves, dims, spec = in_leaves("f", (ens, td), (0, None))
    >>> dims                       # ens's leaves mapped over dim 0, td's not
    (0, 0, 0, 0, 0, 0, None)
    >>> spec.unflatten(leaves)     # (ens, td) again
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import optree
import torch
import torch.utils._pytree as torch_pytree

from .._td import TensorDict, from_parts
from .._td._tree import NAMESPACE, spec_of
from ._paths import fmt_path

__all__ = ["MAX_CACHED", "in_leaves", "is_dim"]

#: How many (prefix, treespec) broadcasts are kept (a process maps few layouts).
MAX_CACHED = 64
_CACHE: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_EMPTY_BS = torch.Size([])
_Tensor = torch.Tensor


def is_dim(d: Any) -> bool:
    """An int (not a bool) or None."""
    return d is None or (isinstance(d, int) and not isinstance(d, bool))


def in_leaves(name: str, args: Any, in_dims: Any) -> tuple[list[Any], Sequence[Any], Any]:
    """``(leaves, dims, treespec)`` of ``args``: optree's leaves (namespace functd, None
    a leaf), one in_dim per leaf, and the treespec that puts them back."""
    dims = _top_dims(name, args, in_dims)
    mapped: list[Any] = []
    pre = prefix(name, args, dims, (), mapped)
    if not mapped:
        raise ValueError(
            f"fd.vmap({name}): in_dims={in_dims!r} maps no tensor of the inputs; at least one "
            "input must be mapped (an int in_dims for a tensor or TensorDict argument)."
        )
    _check_sizes(name, mapped)
    leaves: list[Any]
    leaves, spec = optree.tree_flatten(args, none_is_leaf=True, namespace=NAMESPACE)
    return leaves, _broadcast(pre, args, spec), spec


def _top_dims(name: str, args: Any, in_dims: Any) -> Any:
    if is_dim(in_dims):
        return in_dims
    if isinstance(in_dims, tuple | list):
        if len(in_dims) != len(args):
            raise ValueError(
                f"fd.vmap({name}): in_dims has {len(in_dims)} entries but the function was "
                f"called with {len(args)} positional argument(s); give one in_dim per argument "
                "(or one int/None for all)."
            )
        return tuple(in_dims)
    raise TypeError(
        f"fd.vmap({name}): in_dims must be an int, None, or a tuple with one entry per "
        f"positional argument; got a {type(in_dims).__name__}. (For one TensorDict "
        "argument write in_dims=({'a': 0, 'b': None},).)"
    )


def _broadcast(pre: Any, args: Any, spec: Any) -> tuple[Any, ...]:
    """One dim per leaf: ``pre`` broadcast over ``args`` (cached by the structures)."""
    if pre is None or type(pre) is int:  # one dim for every leaf
        return (pre,) * spec.num_leaves
    if torch.compiler.is_compiling():  # (no cache in the graph's guards)
        return tuple(optree.broadcast_prefix(pre, args, none_is_leaf=True, namespace=NAMESPACE))
    pleaves, pspec = optree.tree_flatten(pre, none_is_leaf=True, namespace=NAMESPACE)
    key = (tuple(pleaves), pspec, spec)
    dims = _CACHE.get(key)
    if dims is None:
        dims = tuple(optree.broadcast_prefix(pre, args, none_is_leaf=True, namespace=NAMESPACE))
        if len(_CACHE) >= MAX_CACHED:
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                del _CACHE[next(iter(_CACHE))]  # the oldest (another thread may drop it first)
        _CACHE[key] = dims
    return dims


# ------------------------------------------------------------------ the prefix
def prefix(name: str, value: Any, dims: Any, path: tuple[Any, ...], mapped: list[Any]) -> Any:
    """in_dims at ``value`` as a prefix of its structure (see the module docstring);
    appends ``(path, tensor or TensorDict, dim)`` to ``mapped`` for each mapped one."""
    if dims is None or value is None:  # (a None argument is a leaf never mapped)
        return None
    if isinstance(value, TensorDict):
        return _td_prefix(name, value, dims, path, mapped)
    if isinstance(value, _Tensor):
        if type(dims) is not int and not is_dim(dims):
            raise _dim_type_error(name, path, dims, value)
        d = _tensor_dim(name, path, value, dims)
        mapped.append((path, value, d))
        return d
    if type(value) in (list, tuple) or (isinstance(value, tuple) and hasattr(value, "_fields")):
        return _seq_prefix(name, value, dims, path, mapped)
    if type(value) is dict:
        if isinstance(dims, Mapping | TensorDict):
            dims = _mapping_dims(name, path, dims, value, "dict")
            subs = {k: prefix(name, v, dims[k], (*path, k), mapped) for k, v in value.items()}
        elif is_dim(dims):
            subs = {k: prefix(name, v, dims, (*path, k), mapped) for k, v in value.items()}
        else:
            raise _dim_type_error(name, path, dims, value)
        return dims if _all_are(subs.values(), dims) else subs
    return _other_prefix(name, value, dims, path, mapped)


def _all_are(subs: Any, dims: Any) -> bool:
    """Whether every sub-prefix is the int ``dims`` (then ``dims`` stands for them all)."""
    return type(dims) is int and all(type(s) is int and s == dims for s in subs)


def _tensor_dim(name: str, path: tuple[Any, ...], t: torch.Tensor, dims: int) -> int:
    d = dims + t.ndim if dims < 0 else dims
    if not 0 <= d < t.ndim:
        raise ValueError(
            f"fd.vmap({name}): in_dims maps dim {dims} of {fmt_path(path)}, a tensor of "
            f"shape {list(t.shape)} ({t.ndim} dims); choose a dim in "
            f"[{-t.ndim}, {t.ndim - 1}] or None."
        )
    return d


def _td_prefix(
    name: str, td: TensorDict, dims: Any, path: tuple[Any, ...], mapped: list[Any]
) -> Any:
    nb = len(td._batch_size)
    if type(dims) is int or is_dim(dims):  # an int (None was handled)
        d = dims
        if d < 0:  # counts from the last batch dim
            if d + nb < 0:
                _raise_not_batch(name, path, td, dims)
            d += nb
        if nb:  # all entries share the batch dims: one test for all of them
            if d >= nb:
                _check_td(name, path, td, list(_leaf_dims(td, d, path)))
            if any((td._spec or spec_of(td)).full):
                mapped.append((path, td, d))
            return d
        subs = {k: prefix(name, v, d, (*path, k), mapped) for k, v in td._data.items()}
    elif isinstance(dims, Mapping | TensorDict):
        dims = _mapping_dims(name, path, dims, td._data, "TensorDict")
        subs = {k: prefix(name, v, dims[k], (*path, k), mapped) for k, v in td._data.items()}
    else:
        raise _dim_type_error(name, path, dims, td)
    vals = list(subs.values())
    first = vals[0] if vals else None
    if (
        all(v is first or (type(v) is int and v == first) for v in vals)
        and type(first) is not TensorDict
    ):
        if nb and first is not None and first >= nb:
            _check_td(name, path, td, list(_leaf_dims(td, first, path)))
        return first
    if nb:  # entries mapped differently: raises
        _check_td(name, path, td, list(_leaf_dims(td, from_parts(subs, _EMPTY_BS), path)))
    return from_parts(subs, _EMPTY_BS)  # a TensorDict of dims: the prefix of a TensorDict


def _seq_prefix(name: str, value: Any, dims: Any, path: tuple[Any, ...], mapped: list[Any]) -> Any:
    if is_dim(dims):
        subs = [prefix(name, v, dims, (*path, i), mapped) for i, v in enumerate(value)]
    elif isinstance(dims, list | tuple) and len(dims) == len(value):
        subs = [prefix(name, v, d, (*path, i), mapped) for i, (v, d) in enumerate(zip(value, dims))]
    else:
        n = len(dims) if isinstance(dims, list | tuple) else None
        raise ValueError(
            f"fd.vmap({name}): in_dims at {fmt_path(path)} is {dims!r}"
            + (f" ({n} entries)" if n is not None else "")
            + f" but the input there is a {type(value).__name__} of {len(value)}; give one "
            "int/None for all of it or a tuple with one entry per element."
        )
    if _all_are(subs, dims):
        return dims
    return type(value)(subs) if type(value) in (list, tuple) else type(value)(*subs)


def _other_prefix(
    name: str, value: Any, dims: Any, path: tuple[Any, ...], mapped: list[Any]
) -> Any:
    """Another pytree node, or a leaf: its tensors take ``dims`` whole (torch.func maps
    a node that only torch's pytree knows; functd's registry sees a leaf there)."""
    if not is_dim(dims):
        raise _dim_type_error(name, path, dims, value)
    leaves = optree.tree_leaves(value, none_is_leaf=True, namespace=NAMESPACE)
    if len(leaves) == 1 and leaves[0] is value:
        leaves = torch_pytree.tree_leaves(value)
    for i, leaf in enumerate(leaves):
        sub = path if len(leaves) == 1 and leaf is value else (*path, i)
        if not isinstance(leaf, _Tensor):
            raise TypeError(
                f"fd.vmap({name}): {fmt_path(sub)} is a {type(leaf).__name__}, not a tensor, "
                f"so it cannot be mapped (in_dims {dims}); give it in_dims=None, e.g. "
                "in_dims=(0, None), or pass it as a keyword argument (never mapped)."
            )
        mapped.append((sub, leaf, _tensor_dim(name, sub, leaf, dims)))
    return dims


# ------------------------------------------------------------------ checks
def _check_sizes(name: str, mapped: list[Any]) -> None:
    size = _size(*mapped[0][1:])
    for path, value, d in mapped[1:]:
        if _size(value, d) != size:
            (pa, a, da), (pb, b, db) = _leaf_of(*mapped[0]), _leaf_of(path, value, d)
            raise ValueError(
                f"fd.vmap({name}): the mapped dims have different sizes: {fmt_path(pa)} has "
                f"size {size} in dim {da} (shape {list(a.shape)}) but {fmt_path(pb)} has size "
                f"{b.shape[db]} in dim {db} (shape {list(b.shape)}). Every mapped input needs "
                "the same size."
            )


def _size(value: Any, d: int) -> int:
    return value._batch_size[d] if isinstance(value, TensorDict) else value.shape[d]


def _leaf_of(path: tuple[Any, ...], value: Any, d: int) -> tuple[Any, ...]:
    """A mapped TensorDict's first tensor leaf (in leaf order) stands for it in messages."""
    if isinstance(value, TensorDict):
        return next((p, t, dd) for p, t, dd in _leaf_dims(value, d, path) if t is not None)
    return path, value, d


def _leaf_dims(td: TensorDict, pre: Any, path: tuple[Any, ...]):
    """``(path, leaf, dim)`` of each leaf of ``td`` in leaf order, ``pre`` its prefix (for
    the messages: the slow path of a failed check)."""
    for k in spec_of(td).keys:
        v, d = td._data[k], pre._data[k] if isinstance(pre, TensorDict) else pre
        if isinstance(v, TensorDict):
            yield from _leaf_dims(v, d, (*path, k))
        else:
            yield (*path, k), v, d


def _check_td(name: str, path: tuple[Any, ...], td: TensorDict, leaves: list[Any]) -> None:
    """Inside vmap each TensorDict must stay valid: entries share its batch dims, so all
    of them are mapped over the same batch dim, or none is (a TensorDict with
    batch_size [] may hold independently mapped entries, e.g. {'params': 0, 'td': None}).
    ``leaves``: ``(path, leaf, dim)`` in leaf order."""
    k = len(td._batch_size)
    if k == 0 or not leaves:
        return
    fp, _, fd_ = leaves[0]
    for lp, leaf, d in leaves:
        if d is not None and d >= k:
            raise ValueError(
                f"fd.vmap({name}): in_dims maps dim {d} of {fmt_path(lp)} (shape "
                f"{list(leaf.shape)}), but the TensorDict at {fmt_path(path)} has "
                f"batch_size {list(td._batch_size)}, so dim {d} is not one of its batch "
                f"dims: only batch dims can be mapped. Choose a dim in [0, {k - 1}], or move "
                f"the dim into the batch first (e.g. td.apply(lambda x: x.movedim({d}, 0), "
                f"batch_size=[...]))."
            )
        if d != fd_:
            raise ValueError(
                f"fd.vmap({name}): entries of the TensorDict at {fmt_path(path)} (batch_size "
                f"{list(td._batch_size)}) are mapped differently: {fmt_path(fp)} over "
                f"dim {fd_} but {fmt_path(lp)} over dim {d}. The entries of "
                "a TensorDict share its batch dims: map all of them over the same batch dim, or "
                "none (None). To map entries independently, put them in separate TensorDicts "
                "(e.g. a batch_size-[] TensorDict {'params': ens, 'data': td} with in_dims "
                "{'params': 0, 'data': None})."
            )


# ------------------------------------------------------------------ messages
def _dim_type_error(name: str, path: tuple[Any, ...], dims: Any, value: Any) -> TypeError:
    what = type(value).__name__
    return TypeError(
        f"fd.vmap({name}): in_dims at {fmt_path(path)} is {dims!r} but the input there is a "
        f"{what}; give an int (the dim to map), None (not mapped), or, for a TensorDict or "
        "dict, a dict with the same keys (e.g. {'params': 0, 'td': None})."
    )


def _mapping_dims(
    name: str, path: tuple[Any, ...], dims: Any, keys: Any, what: str
) -> Mapping[Any, Any]:
    if isinstance(dims, TensorDict):
        dims = dims._data
    got, want = set(dims), set(keys)
    if got != want:
        raise ValueError(
            f"fd.vmap({name}): in_dims at {fmt_path(path)} does not match the {what} there: "
            f"in_dims has keys {sorted(got, key=str)} but the input has "
            f"{sorted(want, key=str)} (missing {sorted(want - got, key=str)}, unexpected "
            f"{sorted(got - want, key=str)}). Give one entry per key, or one int/None for all."
        )
    return dims


def _raise_not_batch(name: str, path: tuple[Any, ...], td: TensorDict, dim: int):
    bs = list(td._batch_size)
    entry = next(iter(td.items(True, True)), None)
    ex = ""
    if entry is not None:
        ex = f" (entry {fmt_path((*path, *_as_tuple(entry[0])))} has shape {list(entry[1].shape)})"
    raise ValueError(
        f"fd.vmap({name}): in_dims maps dim {dim} of the TensorDict at {fmt_path(path)}, which "
        f"has batch_size {bs}: only batch dims can be mapped{ex}. Choose a dim "
        f"in [{-len(bs)}, {len(bs) - 1}], or None."
    )


def _as_tuple(k) -> tuple[Any, ...]:
    return k if isinstance(k, tuple) else (k,)
