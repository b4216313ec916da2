"""Gradient accumulation: ``MultiSteps`` and ``apply_every`` (optax's, for TensorDicts).

Both decide per step with ``torch.where`` on count tensors (no Python branch on a
tensor, no sync), so a step compiles once and runs under ``vmap`` (per member).

Example:
    >>> opt = fd.optim.MultiSteps(fd.optim.adam(1e-3), every_k_schedule=4)
    >>> state = opt.init(params)            # 4 mini-batches per Adam step
    >>> updates, state = opt.update(grads, state, params)   # zeros on 3 steps of 4
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor

from .._td import TensorDict
from .._td._tree import tree, unflatten_like
from . import _checks as C
from . import _listops as L
from ._base import GradientTransformation, transformation

__all__ = ["MultiSteps", "apply_every", "skip_large_updates", "skip_not_finite"]

_KEYS = ("acc_grads", "gradient_step", "inner_state", "mini_step")


def _ms_init(params: TensorDict, *, name: str, inner, every_k, mean, skip, dtype) -> TensorDict:
    leaves = L.check_params(f"fd.optim.{name}.init", params)
    zero = L.new_count(leaves)
    acc = [torch.zeros_like(x, dtype=_acc_dtype(x.dtype, dtype)) for x in leaves]
    entries = {
        "acc_grads": unflatten_like(params, acc),
        "gradient_step": zero,
        "inner_state": inner.init(params),
        "mini_step": zero.clone(),
    }
    if skip is not None:  # optax calls it on zero updates to lay out its skip_state
        zeros = unflatten_like(params, L.zeros_like(leaves))
        _, info = _skip_result(f"fd.optim.{name}.init", skip(zeros, zero, params), None)
        if info is not None:
            entries["skip_state"] = info
    return L.state_td(entries)


def _acc_dtype(leaf: torch.dtype, dtype: torch.dtype | None) -> torch.dtype:
    """The accumulator's dtype: ``dtype``, or by default float32 or the leaf's when wider."""
    return dtype if dtype is not None else torch.promote_types(leaf, torch.float32)


def _skip_result(where: str, out: Any, has_info: bool | None) -> tuple[Tensor, Any]:
    """``(should_skip, info)`` of a ``should_skip_update_fn`` result: a bool (tensor of
    shape ``()``), or optax's pair ``(bool, info)``; ``info`` a TensorDict or a dict."""
    info = None
    if isinstance(out, tuple) and len(out) == 2:
        out, info = out
        if not isinstance(info, TensorDict):
            info = L.state_td(dict(info)) if isinstance(info, dict) else None
    if isinstance(out, bool):
        out = torch.tensor(out)
    if not isinstance(out, Tensor) or out.dtype != torch.bool or out.shape != ():
        got = (
            f"{out.dtype} tensor of shape {list(out.shape)}"
            if isinstance(out, Tensor)
            else (f"a {type(out).__name__}")
        )
        raise ValueError(
            f"{where}: should_skip_update_fn must return a bool tensor of shape [] (or "
            f"optax's pair (should_skip, info)), got {got}; reduce it, e.g. "
            "`~torch.isfinite(x).all()`, or use fd.optim.skip_not_finite."
        )
    if has_info is not None and has_info != (info is not None):
        raise ValueError(
            f"{where}: should_skip_update_fn returned {'a pair' if info is not None else 'a bool'}"
            f" now but {'a pair' if has_info else 'a bool'} at init; it must return the same "
            "kind of result at every call."
        )
    return out, info


def _where(cond: Tensor, a: Any, b: Any) -> Any:
    """``a`` where ``cond`` else ``b``, leaf by leaf (two trees of one structure), in
    ``b``'s dtypes (so no state's dtype drifts)."""
    la, spec = tree.flatten(a)
    lb = tree.leaves(b)
    return tree.unflatten(spec, [torch.where(cond, x, y).to(y.dtype) for x, y in zip(la, lb)])


def _ms_update(updates, state, params=None, *, name: str, inner, every_k, mean, skip, dtype):
    where = f"fd.optim.{name}.update"
    d: dict[str, Any] = state._data if isinstance(state, TensorDict) else {}
    has_info = "skip_state" in d
    L.check_state(where, state, _KEYS + ("skip_state",) * has_info)
    g, spec = L.checked_leaves(where, "grads", updates)
    mini, step = d["mini_step"], d["gradient_step"]
    k = every_k(step) if callable(every_k) else every_k
    k = (  # a fill, not a host copy, for an int: it can be recorded by fd.cuda_graph
        k.to(dtype=mini.dtype, device=mini.device)
        if isinstance(k, torch.Tensor)
        else torch.full((), k, dtype=mini.dtype, device=mini.device)
    )
    acc_old, aspec = L.checked_leaves(where, "opt_state['acc_grads']", d["acc_grads"])
    L.check_same(where, "grads", g, spec, "opt_state['acc_grads']", acc_old, aspec, updates, aspec)
    if mean:  # Welford's running mean, as optax
        n = (mini + 1).to(L.scalar_dtype(g))
        acc = [a + (x - a) / n for x, a in zip(g, acc_old)]
    else:
        acc = [a + x for x, a in zip(g, acc_old)]
    # the inner optimizer sees the mean in the gradients' dtype (optax's cast_like)
    acc_td = unflatten_like(spec, [a.to(x.dtype) for a, x in zip(acc, g)])
    final, inner_new = inner.update(acc_td, d["inner_state"], params)
    emit = mini == k - 1
    kept = [torch.where(emit, torch.zeros_like(a), a).to(o.dtype) for a, o in zip(acc, acc_old)]
    new_state = {
        "mini_step": torch.where(emit, torch.zeros_like(mini), mini + 1),
        "gradient_step": torch.where(emit, step + 1, step),
        "inner_state": _where(emit, inner_new, d["inner_state"]),
        "acc_grads": unflatten_like(aspec, kept),
    }
    out = [torch.where(emit, u, torch.zeros_like(u)) for u in tree.leaves(final)]
    out_td = unflatten_like(spec, out)
    if skip is not None:  # a rejected mini-step: as if it never happened
        bad, info = _skip_result(where, skip(updates, step, params), has_info)
        bad = bad.to(mini.device)
        out_td = _where(bad, unflatten_like(spec, L.zeros_like(out)), out_td)
        new_state = {k: _where(bad, d[k], v) for k, v in new_state.items()}
        if info is not None:
            new_state["skip_state"] = info
    return out_td, L.state_td(new_state)


class MultiSteps(GradientTransformation):
    """Accumulate gradients over ``k`` mini-steps, then step ``inner`` once on them.

    As ``optax.MultiSteps``: on the first ``k - 1`` mini-steps the updates are zeros
    and the inner state is kept; on the ``k``-th, ``inner`` is given the mean (or,
    with ``use_grad_mean=False``, the sum) of the ``k`` gradients. ``k`` may change
    over training: ``every_k_schedule(gradient_step)``. This is a
    GradientTransformation itself (``.init``, ``.update``).

    Args:
        inner: the optimizer stepped every ``k`` mini-steps.
        every_k_schedule: ``k``, an int, or ``gradient_step -> k`` (a tensor function).
        use_grad_mean: average the accumulated gradients (True) or sum them.
        should_skip_update_fn: ``(updates, gradient_step, params) -> should_skip``,
            a bool tensor of shape ``[]``, or optax's pair ``(should_skip, info)``
            whose ``info`` (a TensorDict or dict of tensors) is kept as
            ``state["skip_state"]``. A mini-step for which it is true changes
            nothing (zero updates, state kept), e.g. :func:`skip_not_finite` or
            ``functools.partial(skip_large_updates, max_squared_norm=42.0)``.
        accumulator_dtype: the dtype of ``state["acc_grads"]``; default (None):
            float32, or the params' dtype where wider (optax: float32 always). The
            inner optimizer is given the mean in the gradients' dtype.

    Raises:
        TypeError: ``inner`` is not a GradientTransformation.
        ValueError: an int ``every_k_schedule`` below 1.
        TypeError: ``accumulator_dtype`` is not a floating torch.dtype.

    Example:
        >>> opt = fd.optim.MultiSteps(fd.optim.sgd(0.1), every_k_schedule=4)
        >>> opt.has_updated(state)    # True right after a step of ``inner``
    """

    __slots__ = ()

    def __new__(
        cls,
        inner: GradientTransformation,
        every_k_schedule: int | Callable[[Tensor], Any],
        use_grad_mean: bool = True,
        should_skip_update_fn: Callable[..., Any] | None = None,
        accumulator_dtype: torch.dtype | None = None,
    ) -> MultiSteps:
        if not isinstance(inner, GradientTransformation):
            raise TypeError(
                f"fd.optim.MultiSteps wraps a GradientTransformation, got a {type(inner).__name__}."
            )
        if isinstance(every_k_schedule, int) and every_k_schedule < 1:
            raise ValueError(
                f"fd.optim.MultiSteps: every_k_schedule must be >= 1, got {every_k_schedule}."
            )
        C.float_dtype("fd.optim.MultiSteps", "accumulator_dtype", accumulator_dtype)
        gt = transformation(
            "MultiSteps", _ms_init, _ms_update, inner=inner, every_k=every_k_schedule,
            mean=bool(use_grad_mean), skip=should_skip_update_fn, dtype=accumulator_dtype,
        )  # fmt: skip
        return tuple.__new__(cls, gt)  # type: ignore[arg-type]  # (typeshed: a tuple of functions)

    def __init__(
        self,
        inner: GradientTransformation,
        every_k_schedule: int | Callable[[Tensor], Any],
        use_grad_mean: bool = True,
        should_skip_update_fn: Callable[..., Any] | None = None,
        accumulator_dtype: torch.dtype | None = None,
    ) -> None:
        """(Built by ``__new__``; the signature documents the arguments.)"""

    def has_updated(self, state: TensorDict) -> Tensor:
        """Whether the last ``update`` stepped ``inner`` (a bool tensor)."""
        mini = cast(Tensor, state._data["mini_step"])
        step = cast(Tensor, state._data["gradient_step"])
        return (mini == 0) & (step > 0)


# ------------------------------------------------------------------ apply_every
def _every_init(params: TensorDict, *, name: str, k: int) -> TensorDict:
    leaves = L.check_params(f"fd.optim.{name}.init", params)
    return L.state_td(
        {"count": L.new_count(leaves), "grad_acc": unflatten_like(params, L.zeros_like(leaves))}
    )


def _every_update(updates, state, params=None, *, name: str, k: int):
    where = f"fd.optim.{name}.update"
    L.check_state(where, state, ("count", "grad_acc"))
    g, spec = L.checked_leaves(where, "grads", updates)
    count = state._data["count"]
    c = count % k
    keep = c != 0
    old = tree.leaves(state._data["grad_acc"])
    acc = [torch.where(keep, a, torch.zeros_like(a)) + x for x, a in zip(g, old)]
    emit = c == k - 1
    out = [torch.where(emit, a, torch.zeros_like(a)) for a in acc]
    new = {"count": (count + 1) % k, "grad_acc": unflatten_like(spec, acc)}
    return unflatten_like(spec, out), L.state_td(new)


def apply_every(k: int = 1) -> GradientTransformation:
    """Sum the updates over ``k`` steps and emit the sum every ``k``-th step (zeros
    in between), as ``optax.apply_every``.

    Raises:
        ValueError: ``k`` is not an int >= 1.

    Example:
        >>> opt = fd.optim.chain(fd.optim.sgd(0.1), fd.optim.apply_every(4))
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"fd.optim.apply_every: k must be an int >= 1, got {k!r}.")
    return transformation("apply_every", _every_init, _every_update, k=k)


# ------------------------------------------------------------------ should_skip_update_fn
def skip_not_finite(
    updates: TensorDict, gradient_step: Tensor | int, params: TensorDict | None
) -> tuple[Tensor, TensorDict]:
    """Whether ``updates`` hold an inf or a NaN: a ``should_skip_update_fn`` of
    :class:`MultiSteps`, as ``optax.skip_not_finite``.

    Returns ``(should_skip, info)``: a bool tensor of shape ``[]``, and a TensorDict
    ``{"should_skip", "num_not_finite"}`` (the count of inf and NaN elements, int64)
    that MultiSteps keeps as ``state["skip_state"]``. To skip non-finite steps of any
    optimizer (not only a MultiSteps' mini-steps), wrap it with :func:`skip_nonfinite`.

    Example:
        >>> opt = fd.optim.MultiSteps(fd.optim.sgd(1.0), 2,
        ...                           should_skip_update_fn=fd.optim.skip_not_finite)
    """
    del gradient_step, params
    leaves, _ = L.checked_leaves("fd.optim.skip_not_finite", "updates", updates)
    device = leaves[0].device if leaves else None
    num = torch.zeros((), dtype=torch.int64, device=device)
    for x in leaves:
        num = num + (~torch.isfinite(x)).sum()
    bad = num > 0
    return bad, L.state_td({"should_skip": bad, "num_not_finite": num})


def skip_large_updates(
    updates: TensorDict,
    gradient_step: Tensor | int,
    params: TensorDict | None,
    max_squared_norm: float | Tensor,
) -> tuple[Tensor, TensorDict]:
    """Whether the squared global norm of ``updates`` is not below ``max_squared_norm``
    (NaN included), as ``optax.skip_large_updates``; bind the bound with
    ``functools.partial`` to make it a ``should_skip_update_fn`` of :class:`MultiSteps`.

    Returns ``(should_skip, info)``: a bool tensor of shape ``[]`` and a TensorDict
    ``{"should_skip", "norm_squared"}``.

    Example:
        >>> skip = functools.partial(fd.optim.skip_large_updates, max_squared_norm=42.0)
        >>> opt = fd.optim.MultiSteps(fd.optim.adam(1e-3), 4, should_skip_update_fn=skip)
    """
    del gradient_step, params
    leaves, _ = L.checked_leaves("fd.optim.skip_large_updates", "updates", updates)
    dtype = L.scalar_dtype(leaves)
    device = leaves[0].device if leaves else None
    norm_sq = torch.zeros((), dtype=dtype, device=device)
    for x in leaves:
        norm_sq = norm_sq + (x.to(dtype) ** 2).sum()
    bad = ~(norm_sq < max_squared_norm)
    return bad, L.state_td({"should_skip": bad, "norm_squared": norm_sq})
