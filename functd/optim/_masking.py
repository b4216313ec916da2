"""Treat parts of the params differently: ``masked``, ``multi_transform``, ``set_to_zero``.

optax's combinators for TensorDicts. Which leaves a transformation sees is said
by a *filter* or a *label function*, ``(path, leaf) -> bool | label`` (``path`` a
tuple of str, as ``fd.partition`` takes and ``fd.trainable(model)`` is), or by a
nested dict of bools / labels whose entries cover the params (an entry at a node
covers everything below it, as optax's prefix masks).

Example:
    >>> decay = fd.optim.masked(fd.optim.add_decayed_weights(0.1), lambda path, x: x.ndim > 1)
    >>> opt = fd.optim.multi_transform(
    ...     {"train": fd.optim.adam(1e-3), "freeze": fd.optim.set_to_zero()},
    ...     lambda path, x: "freeze" if path[0] == "embeddings" else "train",
    ... )
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any

import torch

from .._errors import fmt_key
from .._td import TensorDict
from .._td._partition import combine, partition
from .._td._tree import flat_leaves, tree, unflatten_like
from . import _listops as L
from ._base import GradientTransformation, transformation

__all__ = ["masked", "multi_transform", "set_to_zero"]

Path = tuple[str, ...]


def _lookup(where: str, spec: Mapping[Any, Any], path: Path, what: str) -> Any:
    """The entry of a nested dict ``spec`` covering ``path`` (the first non-dict met)."""
    node: Any = spec
    for i, part in enumerate(path):
        if not isinstance(node, Mapping):
            return node
        if part not in node:
            raise ValueError(
                f"{where}: the {what} has no entry for the params entry {fmt_key(path)} (at "
                f"{fmt_key(path[: i + 1])}); give one for every entry, or a function "
                "(path, leaf) -> value."
            )
        node = node[part]
    if isinstance(node, Mapping):
        raise ValueError(
            f"{where}: the {what} gives a dict at {fmt_key(path)}, which is a tensor of the "
            "params; give a value there."
        )
    return node


def _as_fn(where: str, spec: Any, what: str) -> Callable[[Path, Any], Any]:
    if callable(spec):
        return spec
    if isinstance(spec, Mapping):
        return lambda path, leaf: _lookup(where, spec, path, what)
    return lambda path, leaf: spec  # one value for every leaf (a bool, a label)


#: The params paths that an enclosing ``masked`` / ``multi_transform`` keeps from the
#: transformation it wraps, while that transformation's ``init`` runs. optax keeps
#: them in the tree as ``MaskedNode`` placeholders, so an inner mask may name them
#: (optax#271); functd passes the sub-TensorDict of the selected leaves and lets
#: the inner check count these paths as the params'. Set only around ``init``
#: (the one place that checks a mask's keys), reset on the way out. dynamo cannot
#: trace a ContextVar: under ``torch.compile`` neither is done, and the check of
#: extra mask keys is skipped (an extra key changes no leaf's value; a missing
#: one is still an error, raised by the lookup).
_HIDDEN: ContextVar[frozenset[Path]] = ContextVar("functd_optim_hidden", default=frozenset())


def _init_hiding(inner: GradientTransformation, kept: TensorDict, params: TensorDict) -> TensorDict:
    """``inner.init(kept)``, the paths of ``params`` that ``kept`` lacks counted as
    the params' by the masks inside ``inner``."""
    if torch.compiler.is_compiling():
        return inner.init(kept)
    hidden = frozenset(tree.paths(params)) - frozenset(tree.paths(kept))  # type: ignore[arg-type]
    token = _HIDDEN.set(_HIDDEN.get() | hidden)
    try:
        return inner.init(kept)
    finally:
        _HIDDEN.reset(token)


def _check_cover(where: str, spec: Any, params: TensorDict, what: str) -> None:
    """Every entry of a nested-dict ``spec`` must name params entries (no extra keys);
    the entries an enclosing mask keeps away count as the params' (``_HIDDEN``)."""
    if not isinstance(spec, Mapping) or torch.compiler.is_compiling():
        return
    paths = [*tree.paths(params), *_HIDDEN.get()]  # type: ignore[arg-type]
    prefixes = {p[:i] for p in paths for i in range(1, len(p) + 1)}

    def walk(node: Mapping[Any, Any], prefix: Path) -> None:
        for k, v in node.items():
            path = (*prefix, k)
            if path not in prefixes:
                raise ValueError(
                    f"{where}: the {what} names {fmt_key(path)}, which the params lack."
                )
            if isinstance(v, Mapping):
                walk(v, path)

    walk(spec, ())


# ------------------------------------------------------------------ masked
def _masked_init(params: TensorDict, *, name: str, inner: GradientTransformation, mask: Any):
    where = f"fd.optim.{name}.init"
    L.check_params(where, params)
    _check_cover(where, mask, params, "mask")
    kept, _ = partition(params, _keep(where, mask))
    return L.state_td({"inner_state": _init_hiding(inner, kept, params)})


def _keep(where: str, mask: Any) -> Callable[[Path, Any], bool]:
    fn = _as_fn(where, mask, "mask")

    def keep(path: Path, leaf: Any) -> bool:
        m = fn(path, leaf)
        if not isinstance(m, bool):
            raise TypeError(
                f"{where}: the mask gives {m!r} for {fmt_key(path)}; it must give a bool."
            )
        return m

    return keep


def _masked_update(updates, state, params=None, *, name: str, inner, mask):
    where = f"fd.optim.{name}.update"
    L.check_state(where, state, ("inner_state",))
    L.checked_leaves(where, "grads", updates)
    keep = _keep(where, mask)
    kept, rest = partition(updates, keep)
    p = None if params is None else partition(params, keep)[0]
    new, inner_state = inner.update(kept, state._data["inner_state"], p)
    return _like(updates, combine(new, rest)), L.state_td({"inner_state": inner_state})


def _like(template: TensorDict, td: TensorDict) -> TensorDict:
    """``td``'s leaves in ``template``'s layout (its key order and batch sizes)."""
    return unflatten_like(template, flat_leaves(td))


def masked(inner: GradientTransformation, mask: Any) -> GradientTransformation:
    """Apply ``inner`` to the leaves ``mask`` selects; the others pass through unchanged.

    As ``optax.masked``: the inner state covers the selected leaves only, and the
    updates of the others are returned as they came (not zeroed: to freeze
    leaves, give them ``set_to_zero()`` with ``multi_transform``).

    Args:
        inner: the transformation of the selected leaves.
        mask: ``(path, leaf) -> bool`` (``fd.trainable(model)`` is one), a nested dict
            of bools covering the params (a bool at a node covers its subtree), or one
            bool.

    Raises:
        TypeError: ``inner`` is not a GradientTransformation; a mask value is not a bool.
        ValueError: a nested-dict mask lacks an entry of the params, or names one
            the params lack.

    Example:
        >>> opt = fd.optim.chain(
        ...     fd.optim.masked(fd.optim.add_decayed_weights(1e-2), lambda p, x: x.ndim > 1),
        ...     fd.optim.adam(1e-3),
        ... )   # weight decay on matrices only
    """
    if not isinstance(inner, GradientTransformation):
        raise TypeError(
            f"fd.optim.masked wraps a GradientTransformation, got a {type(inner).__name__}."
        )
    return transformation("masked", _masked_init, _masked_update, inner=inner, mask=_frozen(mask))


def _frozen(spec: Any) -> Any:
    """A nested dict as nested tuples of pairs (hashable: transformations compare by
    value); functions and single values as they are."""
    if isinstance(spec, Mapping):
        return _Spec(tuple((k, _frozen(v)) for k, v in spec.items()))
    return spec


class _Spec(Mapping[Any, Any]):
    """A frozen nested mapping (the hashable form of a dict mask or label tree)."""

    __slots__ = ("_items",)

    def __init__(self, items: tuple[Any, ...]) -> None:
        self._items = items

    def __getitem__(self, k: str) -> Any:
        for key, v in self._items:
            if key == k:
                return v
        raise KeyError(k)

    def __iter__(self):
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Spec) and self._items == other._items

    def __repr__(self) -> str:
        return repr({k: v for k, v in self._items})


# ------------------------------------------------------------------ multi_transform
def _multi_init(params: TensorDict, *, name: str, transforms: tuple[Any, ...], labels: Any):
    where = f"fd.optim.{name}.init"
    L.check_params(where, params)
    _check_cover(where, labels, params, "labels")
    parts = _by_label(where, params, transforms, labels)
    return L.state_td({str(lab): _init_hiding(tx, parts[lab], params) for lab, tx in transforms})


def _by_label(
    where: str, td: TensorDict, transforms: tuple[Any, ...], labels: Any
) -> dict[Any, Any]:
    """``{label: the sub-TensorDict of td's leaves with that label}`` (every label)."""
    fn = _as_fn(where, labels, "labels")
    known = {lab for lab, _ in transforms}

    def label(path: Path, leaf: Any) -> Any:
        lab = fn(path, leaf)
        if lab not in known:
            raise ValueError(
                f"{where}: the params entry {fmt_key(path)} has the label {lab!r}, which has "
                f"no transformation; the transformations are for {sorted(map(str, known))}."
            )
        return lab

    out, rest = {}, td
    for lab, _ in transforms:

        def this(path: Path, leaf: Any, lab: Any = lab) -> bool:
            return label(path, leaf) == lab

        out[lab], rest = partition(rest, this)
    return out


def _multi_update(
    updates, state, params=None, *, name: str, transforms: tuple[Any, ...], labels: Any
):
    where = f"fd.optim.{name}.update"
    L.check_state(where, state, tuple(str(lab) for lab, _ in transforms))
    L.checked_leaves(where, "grads", updates)
    parts = _by_label(where, updates, transforms, labels)
    pparts = None if params is None else _by_label(where, params, transforms, labels)
    new, states = [], {}
    for lab, tx in transforms:
        p = None if pparts is None else pparts[lab]
        u, states[str(lab)] = tx.update(parts[lab], state._data[str(lab)], p)
        new.append(u)
    return _like(updates, combine(*new)), L.state_td(states)


def multi_transform(
    transforms: Mapping[Any, GradientTransformation], param_labels: Any
) -> GradientTransformation:
    """Give each leaf the transformation of its label (optax's ``multi_transform``,
    since renamed ``partition``).

    Args:
        transforms: ``{label: transformation}``.
        param_labels: ``(path, leaf) -> label``, or a nested dict of labels covering the
            params (a label at a node covers its subtree).

    Returns:
        A GradientTransformation whose state has one entry per label, named
        ``str(label)`` (a TensorDict's keys are str: optax's integer labels work).

    Raises:
        TypeError: a value of ``transforms`` is not a GradientTransformation.
        ValueError: two labels have the same ``str`` (``0`` and ``"0"``).
        ValueError: a leaf's label has no transformation; a nested-dict label tree
            lacks an entry of the params or names one they lack.

    Example:
        >>> opt = fd.optim.multi_transform(
        ...     {"adam": fd.optim.adam(1e-3), "sgd": fd.optim.sgd(1e-2)},
        ...     {"encoder": "sgd", "head": "adam"},
        ... )
    """
    items = tuple(transforms.items())
    names = [str(lab) for lab, _ in items]
    if len(set(names)) != len(names):
        raise ValueError(
            f"fd.optim.multi_transform: the labels {[lab for lab, _ in items]!r} name the "
            "state's entries by str(label), and two of them are the same str; use distinct labels."
        )
    for lab, tx in items:
        if not isinstance(tx, GradientTransformation):
            raise TypeError(
                f"fd.optim.multi_transform: transforms[{lab!r}] is a {type(tx).__name__}, "
                "not a GradientTransformation."
            )
    return transformation(
        "multi_transform",
        _multi_init,
        _multi_update,
        transforms=items,
        labels=_frozen(param_labels),
    )


# ------------------------------------------------------------------ set_to_zero
def _zero_init(params: TensorDict, *, name: str) -> TensorDict:
    L.check_params(f"fd.optim.{name}.init", params)
    return L.state_td({})


def _zero_update(updates, state, params=None, *, name: str):
    where = f"fd.optim.{name}.update"
    L.check_state(where, state, ())
    g, spec = L.checked_leaves(where, "grads", updates)
    return unflatten_like(spec, [torch.zeros_like(x) for x in g]), state


def set_to_zero() -> GradientTransformation:
    """Zero updates (stateless): the leaves it is given never move.

    Example:
        >>> fd.optim.multi_transform({"train": fd.optim.adam(1e-3), "frozen": fd.optim.set_to_zero()}, labels)
    """
    return transformation("set_to_zero", _zero_init, _zero_update)
