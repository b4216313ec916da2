"""Call signatures: the cache key of ``fd.jit`` and ``fd.cuda_graph``.

A call's signature is, per argument: its optree structure (namespace "functd"),
the batch sizes of its TensorDicts (tree structures compare keys only, and the
same leaf shapes can split into batch and feature dims in more than one way),
per tensor ``(shape, dtype, stride)``, its devices (per tensor when they are
several), and its non-tensor leaves (hashable; their type too, so ``1`` and
``1.0`` differ; a float or complex by its bits, so ``0.0`` and ``-0.0`` differ and
``nan`` equals itself: ``leaf_part``). A TensorDict argument's description is memoised by identity:
passing the same params object again costs nothing to describe.

``describe_change`` says in words what differs between two signatures (the
warnings of both wrappers name it).

Example:
    >>> signature((torch.zeros(2),), {}) == signature((torch.ones(2),), {})
    True
"""

from __future__ import annotations

import struct as _struct
from typing import Any

import optree
import torch

from .._td import TensorDict, from_parts
from .._td._tree import NAMESPACE
from ._paths import fmt_call_path

__all__ = [
    "Bits",
    "Desc",
    "Flat",
    "by_bits",
    "describe_change",
    "leaf_part",
    "shown",
    "signature",
    "skeleton",
    "unhashable",
]


_PACK_D, _PACK_DD = _struct.Struct("<d"), _struct.Struct("<dd")  # float, complex bits


class Bits:
    """A float or complex leaf of a signature, compared and hashed by its bits: ``==``
    would make ``0.0`` and ``-0.0`` one signature (the code traced with one gives the
    other's answer: ``x / -0.0`` is -inf) and ``nan`` a new signature per call. Shown
    as the value.

    Example:
        >>> Bits(0.0) == Bits(-0.0), Bits(float("nan")) == Bits(float("nan"))
        (False, True)
    """

    __slots__ = ("bits", "value")

    def __init__(self, value: Any) -> None:
        self.value = value
        if isinstance(value, float):  # (numpy's float64 too)
            self.bits: bytes = _PACK_D.pack(value)
        elif isinstance(value, complex):
            self.bits = _PACK_DD.pack(value.real, value.imag)
        else:  # another numpy float or complex scalar
            self.bits = value.tobytes()

    def __eq__(self, other: object) -> bool:
        return type(other) is Bits and self.bits == other.bits

    def __hash__(self) -> int:
        return hash(self.bits)

    def __repr__(self) -> str:
        return repr(self.value)


def leaf_part(v: Any) -> tuple[Any, ...]:
    """A non-tensor leaf's part of a signature: ``(type, value)``; a float or complex
    ``(type, its bytes)`` (a numpy one ``(type, Bits)``), so that ``0.0`` and ``-0.0``
    are two signatures and ``nan`` one. ``shown`` gives the value back."""
    t = type(v)
    if t is float:
        return (t, _PACK_D.pack(v))
    if t is complex:
        return (t, _PACK_DD.pack(v.real, v.imag))
    return (t, Bits(v)) if _inexact(v) else (t, v)


def shown(part: tuple[Any, ...]) -> str:
    """``repr`` of the value of a non-tensor leaf's ``leaf_part``."""
    t, v = part
    if t is float and type(v) is bytes:
        return repr(_PACK_D.unpack(v)[0])
    if t is complex and type(v) is bytes:
        return repr(complex(*_PACK_DD.unpack(v)))
    return repr(v)


def _inexact(v: Any) -> bool:
    """Whether ``v`` is a Python or numpy float/complex scalar."""
    if isinstance(v, float | complex):
        return True
    return type(v).__module__ == "numpy" and getattr(getattr(v, "dtype", None), "kind", "") in (
        "f",
        "c",
    )


def by_bits(v: Any) -> Any:
    """``v`` with its float and complex scalars (also inside tuples and frozensets)
    as ``Bits``: a value that compares and hashes them by their bits. Any other value
    is returned as it is; a tuple is tagged with its type (a named tuple differs from
    a plain one).

    Example:
        >>> by_bits((1, 0.0)) == by_bits((1, -0.0))
        False
    """
    if _inexact(v):
        return Bits(v)
    if isinstance(v, tuple):
        return (type(v), *map(by_bits, v))
    if isinstance(v, frozenset):
        return frozenset(map(by_bits, v))
    return v


def _td_layout(x: Any) -> tuple[Any, ...]:
    """The batch sizes of the TensorDicts in ``x`` (found inside TensorDicts, tuples,
    lists and dicts), in a fixed walk order."""
    out = []
    stack = [x]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is TensorDict:
            out.append(v._batch_size)
            stack.extend(w for w in v._data.values() if type(w) is TensorDict)
        elif t is tuple or t is list:
            stack.extend(v)
        elif t is dict:
            stack.extend(v.values())
    return tuple(out)


class _Key:
    """One argument's signature with its hash computed once (it is memoised with it)."""

    __slots__ = ("hash", "value")

    def __init__(self, value: tuple[Any, ...]) -> None:
        self.value = value
        self.hash: int | None
        try:
            self.hash = hash(value)
        except TypeError:
            self.hash = None  # unhashable static leaf: reported when looked up

    def __hash__(self) -> int:
        if self.hash is None:
            raise TypeError("unhashable signature")
        return self.hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            type(other) is _Key and self.hash == other.hash and self.value == other.value
        )


class Desc:
    """One argument, described: its signature part (``key``), its leaves, its tensor
    leaves, their devices, and whether one requires grad.

    The structure part of the key is the argument's optree structure, except for the
    two hot cases, walked directly: a bare tensor (``"tensor"``) and a TensorDict,
    whose leaves are then listed in *insertion* order (depth first) and whose
    structure is the preorder of its nodes, each as (keys in insertion order, the
    type of each entry, batch size): that determines the tree, and costs no sort.
    (Two TensorDicts with the same keys inserted in another order are two
    signatures.) ``rebuild`` puts new leaves back in that layout."""

    __slots__ = ("_spec", "devices", "grad", "key", "kind", "leaves", "tensors", "value")

    def __init__(self, a: Any) -> None:
        self.value, self._spec = a, None
        t = type(a)
        if t is TensorDict:
            nodes: list[Any] = []
            leaves: list[Any] = []
            _walk(a, nodes, leaves)
            self.kind, tensors, struct, layout = "td", leaves, tuple(nodes), ()
        elif t is torch.Tensor or t is torch.nn.Parameter:
            self.kind, leaves, tensors, struct, layout = "tensor", [a], [a], "tensor", ()  # type: ignore[assignment]
        else:
            leaves, self._spec = optree.tree_flatten(a, namespace=NAMESPACE)
            tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
            self.kind, struct, layout = "tree", self._spec, _td_layout(a)  # type: ignore[assignment]
        parts = []
        devices = set()
        grad = False
        if len(tensors) == len(leaves):
            for v in tensors:
                parts.append((v.shape, v.dtype, v.stride()))
                devices.add(v.device)
                if v.requires_grad:
                    grad = True
        else:
            for v in leaves:
                if isinstance(v, torch.Tensor):
                    parts.append((v.shape, v.dtype, v.stride()))
                    devices.add(v.device)
                    grad = grad or v.requires_grad
                else:
                    parts.append(leaf_part(v))
        where = tuple([v.device for v in tensors]) if len(devices) > 1 else tuple(devices)
        self.key = _Key((struct, where, layout, tuple(parts)))
        self.leaves, self.tensors, self.devices, self.grad = leaves, tensors, devices, grad

    @property
    def spec(self) -> optree.PyTreeSpec:
        """The argument's optree structure (namespace "functd")."""
        if self._spec is None:
            self._spec = optree.tree_structure(self.value, namespace=NAMESPACE)
        return self._spec

    def paths(self) -> list[tuple[Any, ...]]:
        """The key path of every leaf, in the order of ``leaves``."""
        if self.kind == "tensor":
            return [()]
        if self.kind == "td":
            return _td_paths(self.key.value[0])
        return self.spec.paths()

    def rebuild(self, leaves: list[Any]) -> Any:
        """The argument with ``leaves`` (in the order of ``self.leaves``) in its place."""
        if self.kind == "tensor":
            return leaves[0]
        if self.kind == "td":
            return _rebuild_td(self.value, iter(leaves))
        return optree.tree_unflatten(self.spec, leaves)


def _walk(td: TensorDict, nodes: list[Any], leaves: list[Any]) -> None:
    data = td._data
    types = tuple(map(type, data.values()))
    nodes.append((tuple(data), types, td._batch_size))
    if TensorDict not in types:
        leaves.extend(data.values())
        return
    for v in data.values():
        if type(v) is TensorDict:
            _walk(v, nodes, leaves)
        else:
            leaves.append(v)


def _td_paths(nodes: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    it = iter(nodes)

    def rec(prefix: tuple[Any, ...]) -> list[Any]:
        keys, types, _ = next(it)
        out: list[Any] = []
        for k, ty in zip(keys, types):
            if ty is TensorDict:
                out += rec((*prefix, k))
            else:
                out.append((*prefix, k))
        return out

    return rec(())


def _rebuild_td(td: TensorDict, it) -> TensorDict:
    """A TensorDict with ``td``'s keys (same order) holding the leaves of ``it``; its
    batch size is read from its first entry (symbolic under a symbolic trace)."""
    data = {
        k: _rebuild_td(v, it) if type(v) is TensorDict else next(it) for k, v in td._data.items()
    }
    n = len(td._batch_size)
    first = next(iter(data.values()), None)
    if first is None:
        bs = td._batch_size
    else:
        bs = first.shape[:n] if isinstance(first, torch.Tensor) else first._batch_size[:n]
    return from_parts(data, torch.Size(bs))


def skeleton(d: Desc) -> tuple[Any, ...]:
    """``d``'s signature part without sizes and strides: what a symbolic dim keeps."""
    struct, where, layout, parts = d.key.value
    if d.kind == "td":
        struct = tuple((keys, types, len(bs)) for keys, types, bs in struct)
    else:
        struct = (struct, tuple(len(b) for b in layout))
    leaves = tuple((len(p[0]), p[1]) if isinstance(p[0], torch.Size) else p for p in parts)
    return (struct, where, leaves)


class Flat:
    """A call's arguments, flattened one by one. A TensorDict argument's description
    is memoised by identity in ``memo`` (a TensorDict never changes its leaves, and
    a tensor never changes its shape, dtype or device), so passing the same params
    object again costs no flattening.

    ``sig`` is the call's signature (hashable unless a static leaf is not);
    ``tensors`` the tensor leaves of all arguments in order."""

    __slots__ = ("descs", "grad", "nargs", "sig", "tensors")

    def __init__(self, args: tuple[Any, ...], kwargs: dict[Any, Any], memo: dict[Any, Any]) -> None:
        descs = []
        for i, a in enumerate((*args, *kwargs.values()) if kwargs else args):
            hit = memo.get(i)
            if hit is not None and hit[0] is a:
                descs.append(hit[1])
                continue
            d = Desc(a)
            if type(a) is TensorDict:
                memo[i] = (a, d)
            descs.append(d)
        self.descs = descs
        self.nargs = len(args)
        self.sig = (len(args), tuple(kwargs), *[d.key for d in descs])
        if len(descs) == 1:
            self.tensors, self.grad = descs[0].tensors, descs[0].grad
        else:
            tensors: list[Any] = []
            grad = False
            for d in descs:
                tensors += d.tensors
                grad = grad or d.grad
            self.tensors, self.grad = tensors, grad

    @property
    def devices(self) -> set[Any]:
        """The devices of all tensor leaves."""
        return set().union(*(d.devices for d in self.descs)) if self.descs else set()

    def rebuild(self, args: tuple[Any, ...], kwargs: dict[Any, Any], leaves_of) -> tuple[Any, ...]:
        """(args, kwargs) with every argument's leaves replaced by ``leaves_of(desc)``."""
        vals = [d.rebuild(leaves_of(d)) for d in self.descs]
        return tuple(vals[: len(args)]), dict(zip(kwargs, vals[len(args) :]))

    def paths(self) -> list[str]:
        """The path of every tensor leaf, in order: ``args[1]['obs', 'pos']``..."""
        names = _names(self.nargs, self.sig[1])
        out = []
        for n, d in zip(names, self.descs):
            for p, v in zip(d.paths(), d.leaves):
                if isinstance(v, torch.Tensor):
                    out.append(n + "".join(f"[{k!r}]" for k in p))
        return out


def signature(args: tuple[Any, ...], kwargs: dict[Any, Any]) -> tuple[Any, ...]:
    """The cache key of a call: per argument its tree structure, the batch sizes of its
    TensorDicts, per tensor ``(shape, dtype, stride)``, its devices, and its non-tensor
    leaves (which must be hashable).

    Raises:
        TypeError: a non-tensor leaf is not hashable.

    Example:
        >>> signature((torch.zeros(2),), {}) == signature((torch.ones(2),), {})
        True
    """
    sig = Flat(args, kwargs, {}).sig
    try:
        hash(sig)
    except TypeError:
        raise unhashable("signature", args, kwargs) from None
    return sig


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def unhashable(where: str, args: tuple[Any, ...], kwargs: dict[Any, Any]) -> TypeError:
    """The error for a call whose signature cannot be hashed: names the first
    non-tensor leaf that is not hashable."""
    leaves = optree.tree_leaves((args, kwargs), namespace=NAMESPACE)  # type: ignore[arg-type, var-annotated]
    paths = optree.tree_paths((args, kwargs), namespace=NAMESPACE)  # type: ignore[arg-type]
    bad = next(
        (
            fmt_call_path(p)
            for p, v in zip(paths, leaves)
            if not isinstance(v, torch.Tensor) and not _hashable(v)
        ),
        "?",
    )
    return TypeError(
        f"{where}: the non-tensor input {bad} is not hashable; non-tensor inputs are "
        "part of the signature the compiled code is cached under. Pass it as a tensor, or "
        "as a hashable value (a tuple rather than a list)."
    )


# ------------------------------------------------------------------ what changed
def _fmt_keys(paths: set[Any]) -> str:
    return ", ".join(repr(p[0] if len(p) == 1 else p) for p in sorted(paths, key=str)) or "none"


def _names(nargs: int, kwargs: tuple[Any, ...]) -> list[str]:
    return [f"args[{i}]" for i in range(nargs)] + [f"{k}=" for k in kwargs]


def describe_change(old: tuple[Any, ...], new: tuple[Any, ...]) -> str:
    """What differs between two signatures (``Flat.sig``), in words: the first
    argument that changed and how (keys gained or lost, a batch size, a leaf's
    shape, dtype, stride or device, a static value).

    Example:
        >>> describe_change(signature((td4,), {}), signature((td5,), {}))
        'args[0]: batch size [4] -> [5]'
    """
    if old[:2] != new[:2]:
        return (
            f"the call's arguments changed: {old[0]} positional {list(old[1])} "
            f"-> {new[0]} positional {list(new[1])}"
        )
    for name, a, b in zip(_names(new[0], new[1]), old[2:], new[2:]):
        if a != b:
            return name + _arg_change(a.value, b.value)
    return "nothing (the same signature)"


def _struct_paths(struct: Any) -> list[tuple[Any, ...]]:
    """The leaf paths of an argument's structure part (see ``Desc``)."""
    if struct == "tensor":
        return [()]
    if type(struct) is tuple:
        return _td_paths(struct)
    return struct.paths()


def _layout(struct: Any, layout: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(n[2] for n in struct) if type(struct) is tuple else layout


def _arg_change(a: tuple[Any, ...], b: tuple[Any, ...]) -> str:
    """How one argument's signature changed: ``": ..."`` for the argument, or
    ``"['x']: ..."`` for one of its leaves."""
    (spec_a, dev_a, lay_a, parts_a), (spec_b, dev_b, lay_b, parts_b) = a, b
    lay_a, lay_b = _layout(spec_a, lay_a), _layout(spec_b, lay_b)
    paths_a, paths_b = _struct_paths(spec_a), _struct_paths(spec_b)
    if lay_a != lay_b and len(lay_a) == len(lay_b) and paths_a == paths_b:
        if len(lay_a) == 1:
            return f": batch size {list(lay_a[0])} -> {list(lay_b[0])}"
        return f": batch sizes {[list(s) for s in lay_a]} -> {[list(s) for s in lay_b]}"
    if spec_a != spec_b:
        before, now = set(paths_a), set(paths_b)
        if before != now:
            return f": key set gained {_fmt_keys(now - before)}, lost {_fmt_keys(before - now)}"
        if paths_a != paths_b:
            return ": the keys' insertion order changed (each order is its own signature)"
        return ": tree structure changed"
    for path, x, y in zip(paths_b, parts_a, parts_b):
        if x == y:
            continue
        at = "".join(f"[{p!r}]" for p in path)
        if isinstance(x[0], torch.Size) and isinstance(y[0], torch.Size):
            for what, i in (("shape", 0), ("dtype", 1), ("stride", 2)):
                if x[i] != y[i]:
                    u, v = (list(x[0]), list(y[0])) if i == 0 else (x[i], y[i])
                    return f"{at}: {what} {u} -> {v}"
        return f"{at}: {_leaf(x)} -> {_leaf(y)}"
    return f": devices {[str(d) for d in dev_a]} -> {[str(d) for d in dev_b]}"


def _leaf(part: tuple[Any, ...]) -> str:
    if isinstance(part[0], torch.Size):
        return f"a {part[1]} tensor of shape {list(part[0])}"
    return shown(part)
