"""``tree_map_params``: map a function over the params-shaped parts of an optimizer
state (optax's ``tree_map_params``), e.g. to cast the moments or shard them like
their params.

How the params-shaped parts are found (optax runs ``init`` on a placeholder; a
TensorDict state needs tensors): the params' layout is the first of ``rest`` when
given, else the sub-TensorDict of the state for which ``initable.init``, run on a
copy on the ``meta`` device (no memory, no compute), lays out a state with the keys
of ``state``. ``init`` then runs once more on that layout plus a probe entry: the
parts of its state that hold the probe are the params-shaped ones (so a
hyper-parameter that happens to look like the params is not one). Where that
second run fails (a mask that names every key), the parts with exactly the params'
keys and floating leaves are taken.

Example:
    >>> state = fd.optim.tree_map_params(opt, lambda x: x.to(torch.bfloat16), state)
    >>> specs = fd.optim.tree_map_params(opt, lambda x, spec: ..., state, param_specs)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._errors import fmt_key
from .._td import TensorDict, from_parts
from .._td._tree import flat_leaves, same_keys, tree, unflatten_like
from . import _errors as E

__all__ = ["tree_map_params"]

_WHERE = "fd.optim.tree_map_params"


def _subtrees(
    td: TensorDict, path: tuple[Any, ...] = ()
) -> list[tuple[tuple[Any, ...], TensorDict]]:
    """Every nested TensorDict of ``td`` (itself first), with its key path."""
    out = [(path, td)]
    for k in sorted(td._data):
        v = td._data[k]
        if type(v) is TensorDict:
            out.extend(_subtrees(v, (*path, k)))
    return out


def _floating(td: TensorDict) -> bool:
    leaves = flat_leaves(td)
    return bool(leaves) and all(x.is_floating_point() for x in leaves)


def _on_meta(td: TensorDict) -> TensorDict:
    def meta(x: Tensor) -> Tensor:
        dtype = x.dtype if x.is_floating_point() else torch.float32
        return torch.empty(x.shape, dtype=dtype, device="meta")

    return unflatten_like(td, [meta(x) for x in flat_leaves(td)])


def _lays_out(init: Callable[[TensorDict], Any], params: TensorDict, state: TensorDict) -> bool:
    try:
        probe = init(_on_meta(params))
    except Exception:  # not this layout: init refused it
        return False
    return isinstance(probe, TensorDict) and same_keys(probe, state)


def _layout(init: Callable[[TensorDict], Any], state: TensorDict, rest: tuple[Any, ...]) -> Any:
    if rest:
        if not _lays_out(init, rest[0], state):
            raise ValueError(
                f"{_WHERE}: initable.init on params laid out as rest[0] does not give a "
                "state with the keys of `state`; pass the optimizer that made `state` and "
                "trees with the params' keys as `rest`."
            )
        return rest[0]
    cands = [t for _, t in _subtrees(state)[1:] if _floating(t)]
    cands.sort(key=lambda t: -len(flat_leaves(t)))
    seen: list[TensorDict] = []
    for cand in cands:
        if any(same_keys(cand, s) for s in seen):
            continue
        seen.append(cand)
        if _lays_out(init, cand, state):
            return cand
    return None  # no params-shaped part (e.g. sgd without momentum: {"count"})


_PROBE = "__tree_map_params_probe__"


def _positions(
    init: Callable[[TensorDict], Any], layout: TensorDict
) -> list[tuple[Any, ...]] | None:
    """The key paths at which ``init`` puts params-shaped TensorDicts (None: unknown)."""
    meta = _on_meta(layout)
    probe = torch.empty((*meta._batch_size, 1), device="meta")
    try:
        state = init(from_parts({**meta._data, _PROBE: probe}, meta._batch_size))
    except Exception:  # e.g. a mask naming the params' keys: fall back on the keys
        return None
    if not isinstance(state, TensorDict):
        return None
    return [path for path, t in _subtrees(state) if _PROBE in t._data]


def _map(
    td: TensorDict,
    is_params: Callable[..., Any],
    f: Callable[..., Any],
    rest: tuple[Any, ...],
    other,
    path: tuple[Any, ...],
):
    if path and is_params(path, td):
        leaves = flat_leaves(td)
        rls = [flat_leaves(r) for r in rest]
        out = [f(x, *(r[i] for r in rls)) for i, x in enumerate(leaves)]
        _check_tensors(out, td, path, "f")
        return unflatten_like(td, out)
    vals = {}
    for k, v in td._data.items():
        if type(v) is TensorDict:
            vals[k] = _map(v, is_params, f, rest, other, (*path, k))
        else:
            vals[k] = other(v) if other is not None else v
            _check_tensors([vals[k]], None, (*path, k), "transform_non_params")
    return from_parts(vals, td._batch_size)


def _check_tensors(out: list[Any], td: TensorDict | None, path: tuple[Any, ...], what: str) -> None:
    for i, x in enumerate(out):
        if not isinstance(x, Tensor):
            at = path if td is None else (*path, *tree.paths(td)[i])  # type: ignore[arg-type]
            raise TypeError(
                f"{_WHERE}: {what} returned a {type(x).__name__} for state entry "
                f"{fmt_key(at)}; it must return a tensor (the state is a TensorDict). "
                "To build a tree of other values (e.g. sharding specs), map over "
                "fd.tree.leaves / fd.tree.map of the returned state instead."
            )


def tree_map_params(
    initable: Any,
    f: Callable[..., Tensor],
    state: TensorDict,
    /,
    *rest: TensorDict,
    transform_non_params: Callable[[Tensor], Tensor] | None = None,
) -> TensorDict:
    """Apply ``f`` to every leaf of the params-shaped parts of an optimizer state, as
    ``optax.tree_map_params``.

    ``f(leaf, *rest_leaves)`` is called with each leaf of every sub-TensorDict of
    ``state`` laid out as the params (Adam's ``exp_avg`` and ``exp_avg_sq``, a
    chain's or ``inject_hyperparams``' inner moments...) and the matching leaves of
    ``rest`` (TensorDicts with the params' keys); the other leaves (counts,
    hyper-parameters, ``found_nan``...) go through ``transform_non_params`` (default:
    kept). ``f`` must return tensors: a functd state is a TensorDict. A ``masked``
    optimizer's statistics cover a subset of the params: they are not params-shaped
    here (optax needs ``is_leaf`` there).

    Args:
        initable: the optimizer that made ``state`` (or its ``init`` function).
        f: ``(leaf, *rest_leaves) -> tensor``.
        state: the optimizer state.
        *rest: TensorDicts with the params' keys (e.g. the params themselves).
        transform_non_params: ``leaf -> tensor`` for the other leaves.

    Raises:
        TypeError: ``state`` or a ``rest`` is not a TensorDict; ``initable`` has no
            ``init``; ``f`` returned something else than a tensor.
        ValueError: ``rest[0]`` is not laid out as the params ``state`` came from.

    Example:
        >>> opt = fd.optim.adam(1e-3)
        >>> state = opt.init(params)
        >>> half = fd.optim.tree_map_params(opt, lambda m: m.to(torch.bfloat16), state)
        >>> half["exp_avg", "w"].dtype, half["count"].dtype
        (torch.bfloat16, torch.int64)
    """
    init = getattr(initable, "init", initable)
    if not callable(init):
        raise TypeError(
            f"{_WHERE}: initable must be the optimizer that made the state (or its init "
            f"function), got a {type(initable).__name__}."
        )
    if not isinstance(state, TensorDict):
        raise TypeError(E.not_a_td(_WHERE, "state", state))
    for i, r in enumerate(rest):
        if not isinstance(r, TensorDict):
            raise TypeError(E.not_a_td(_WHERE, f"rest[{i}]", r))
        if i and not same_keys(r, rest[0]):
            raise ValueError(E.layout_mismatch(_WHERE, "rest[0]", rest[0], f"rest[{i}]", r))
    layout = _layout(init, state, rest)
    if layout is None:
        return _map(state, lambda path, td: False, f, rest, transform_non_params, ())
    where = _positions(init, layout)

    def is_params(path: tuple[Any, ...], td: TensorDict) -> bool:
        if not same_keys(td, layout):
            return False
        return path in where if where is not None else _floating(td)

    return _map(state, is_params, f, rest, transform_non_params, ())
