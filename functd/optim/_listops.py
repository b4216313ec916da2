"""Leaf-list helpers of the optimizers: input checks, and list ops.

The optimizers work on the flat list of leaves of a TensorDict (optree order,
namespace ``"functd"``): ``functd._td._tree.flat_leaves`` lists them and
``unflatten_like`` puts new ones back into the TensorDict's layout. The list ops
call ``torch._foreach_*`` (one dispatch for all leaves) on plain eager tensors,
and fall back to one op per leaf under ``torch.compile`` (inductor fuses them
anyway) and under ``torch.func`` transforms (``vmap`` has no batching rule for
the foreach ops). Both paths compute the same thing: the foreach op *is* the
per-tensor op, and no op here is in-place, so nothing given is ever written.

Example:
    >>> leaves, template = checked_leaves("fd.optim.sgd.update", "grads", grads)
    >>> unflatten_like(template, scale(-0.1, leaves, foreach(leaves)))
"""

from __future__ import annotations

from numbers import Number
from typing import Any

import torch
from torch import Tensor

from .._eager import plain
from .._td import TensorDict, from_parts
from .._td._tree import flat_leaves, same_keys, tree
from .._torch import FOREACH_LERP_DTENSOR
from . import _errors as E

Scalar = float | Tensor
_STRIDED = torch.strided


# ------------------------------------------------------------------ checks
def checked_leaves(where: str, what: str, td: Any) -> tuple[list[Tensor], TensorDict]:
    """The leaves of a TensorDict (``flat_leaves``) and the TensorDict itself (the
    template for ``unflatten_like``); raises a clear TypeError for anything else."""
    if not isinstance(td, TensorDict):
        raise TypeError(E.not_a_td(where, what, td))
    leaves = flat_leaves(td)
    if what == "grads" and not all(x.layout is _STRIDED for x in leaves):
        path = next(p for p, x in zip(tree.paths(td), leaves) if x.layout is not _STRIDED)  # type: ignore[arg-type]
        raise TypeError(E.sparse_grad(where, path, leaves[tree.paths(td).index(path)].layout))  # type: ignore[arg-type]
    return leaves, td


def check_params(where: str, params: Any) -> list[Tensor]:
    """The leaves of ``params``; every one must be a floating-point tensor."""
    leaves, _ = checked_leaves(where, "params", params)
    if not all(x.is_floating_point() for x in leaves):
        paths = tree.paths(params)
        for path, x in zip(paths, leaves):
            if not x.is_floating_point():
                raise TypeError(E.non_floating(where, path, x.dtype))
    return leaves


def check_state(where: str, state: Any, keys: tuple[str, ...]) -> None:
    """``state`` must be a TensorDict with exactly the entries ``keys``."""
    if not isinstance(state, TensorDict):
        raise TypeError(E.not_a_td(where, "opt_state", state))
    if tuple(sorted(state._data)) != tuple(sorted(keys)):
        raise ValueError(E.wrong_state(where, keys, tuple(state._data)))


def check_same(where, a_name, a, a_spec, b_name, b, b_spec, a_td, b_td) -> None:
    """Two flattened TensorDicts must have the same keys and leaf shapes."""
    if (
        len(a) == len(b)
        and all(x.shape == y.shape for x, y in zip(a, b))
        and (a_spec is b_spec or same_keys(a_spec, b_spec))
    ):
        return
    raise ValueError(E.layout_mismatch(where, a_name, a_td, b_name, b_td))


def zeros_like(leaves: list[Tensor]) -> list[Tensor]:
    return [torch.zeros_like(x) for x in leaves]


def new_count(leaves: list[Tensor]) -> Tensor:
    """A fresh int64 step count on the device of the params."""
    device = leaves[0].device if leaves else None
    return torch.zeros((), dtype=torch.int64, device=device)


def scalar_dtype(leaves: list[Tensor]) -> torch.dtype:
    """The dtype in which step-dependent scalars are computed: the widest floating
    dtype of the leaves, at least float32."""
    return torch.float64 if any(x.dtype == torch.float64 for x in leaves) else torch.float32


def state_td(entries: dict[str, Any]) -> TensorDict:
    """An optimizer state: a TensorDict of batch size ``[]`` (entries not checked)."""
    return from_parts(entries, torch.Size([]))


# ------------------------------------------------------------------ list ops
def foreach(xs: list[Tensor]) -> bool:
    """Whether the ``torch._foreach_*`` ops may run on ``xs``: plain eager tensors,
    and at least one (the foreach ops refuse an empty list; the per-leaf path of
    an empty list is the empty list, so an empty params tree steps as a no-op)."""
    return len(xs) > 0 and plain(xs)  # (not bool(xs): dynamo 2.11/2.12 cannot trace it)


def _map(op: str, fe: bool, *args: Any) -> list[Tensor]:
    if fe:
        return getattr(torch, "_foreach_" + op)(*args)
    f = getattr(torch, op)
    n = len(args[0])
    return [f(*(a[i] if isinstance(a, list) else a for a in args)) for i in range(n)]


def add(xs: list[Tensor], ys: list[Tensor] | Scalar, fe: bool | None = None) -> list[Tensor]:
    return _map("add", foreach(xs) if fe is None else fe, xs, ys)


def sub(xs: list[Tensor], ys: list[Tensor], fe: bool | None = None) -> list[Tensor]:
    return _map("sub", foreach(xs) if fe is None else fe, xs, ys)


def mul(xs: list[Tensor], ys: list[Tensor] | Scalar, fe: bool | None = None) -> list[Tensor]:
    return _map("mul", foreach(xs) if fe is None else fe, xs, ys)


def div(xs: list[Tensor], ys: list[Tensor] | Scalar, fe: bool | None = None) -> list[Tensor]:
    return _map("div", foreach(xs) if fe is None else fe, xs, ys)


def maximum(xs: list[Tensor], ys: list[Tensor], fe: bool | None = None) -> list[Tensor]:
    return _map("maximum", foreach(xs) if fe is None else fe, xs, ys)


def sqrt(xs: list[Tensor], fe: bool | None = None) -> list[Tensor]:
    return _map("sqrt", foreach(xs) if fe is None else fe, xs)


def sign(xs: list[Tensor], fe: bool | None = None) -> list[Tensor]:
    return _map("sign", foreach(xs) if fe is None else fe, xs)


def axpy(a: Scalar, xs: list[Tensor], ys: list[Tensor], fe: bool) -> list[Tensor]:
    """``a * xs + ys``."""
    if isinstance(a, Number):
        if a == 0:
            return ys
        if fe:
            return torch._foreach_add(ys, xs, alpha=a)  # type: ignore[arg-type, return-value]
        return [torch.add(y, x, alpha=a) for x, y in zip(xs, ys)]  # type: ignore[arg-type]
    return _map("add", fe, _map("mul", fe, xs, a), ys)


def scale(a: Scalar, xs: list[Tensor], fe: bool) -> list[Tensor]:
    """``a * xs`` (returns ``xs`` itself when ``a`` is the number 1)."""
    if isinstance(a, Number) and a == 1:
        return xs
    return _map("mul", fe, xs, a)


def ema(decay: Scalar, avg: list[Tensor], xs: list[Tensor], fe: bool) -> list[Tensor]:
    """``decay * avg + (1 - decay) * xs`` (as torch.optim's ``lerp(xs, 1 - decay)``)."""
    if isinstance(decay, Number) and fe:
        if FOREACH_LERP_DTENSOR or all(type(a) is Tensor for a in avg):
            return torch._foreach_lerp(avg, xs, 1 - decay)  # type: ignore[arg-type, return-value]
        return [torch.lerp(a, x, 1 - decay) for a, x in zip(avg, xs)]  # DTensors, torch < 2.13
    return _map("add", fe, _map("mul", fe, avg, decay), _map("mul", fe, xs, 1 - decay))


def ema_sq(decay: Scalar, avg: list[Tensor], xs: list[Tensor], fe: bool) -> list[Tensor]:
    """``decay * avg + (1 - decay) * xs**2``."""
    if isinstance(decay, Number) and fe:
        out = torch._foreach_mul(avg, decay)
        torch._foreach_addcmul_(out, xs, xs, value=1 - decay)  # type: ignore[arg-type]
        return out  # type: ignore[return-value]
    sq = _map("mul", fe, xs, xs)
    return _map("add", fe, _map("mul", fe, avg, decay), _map("mul", fe, sq, 1 - decay))


def scale_fresh(xs: list[Tensor], a: Scalar | None, fe: bool, fresh: bool) -> list[Tensor]:
    """``a * xs``, in place when ``xs`` is ``fresh`` (allocated by the caller, shared
    with nothing) and the foreach path runs; ``a=None`` means 1."""
    if a is None or (isinstance(a, Number) and a == 1):
        return xs
    if fe and fresh:
        torch._foreach_mul_(xs, a)
        return xs
    return _map("mul", fe, xs, a)


def add_fresh(xs: list[Tensor], ys: list[Tensor] | Scalar, fe: bool, fresh: bool) -> list[Tensor]:
    """``xs + ys``, in place on ``xs`` when it is ``fresh`` (see ``scale_fresh``)."""
    if fe and fresh:
        torch._foreach_add_(xs, ys)
        return xs
    return _map("add", fe, xs, ys)


def global_norm(xs: list[Tensor], fe: bool) -> Tensor:
    """The 2-norm of all leaves together (0 for no leaves)."""
    if not xs:
        return torch.zeros(())
    norms = torch._foreach_norm(xs) if fe else [torch.linalg.vector_norm(x) for x in xs]
    return torch.linalg.vector_norm(torch.stack(norms))
