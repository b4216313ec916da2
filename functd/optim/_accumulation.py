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
from . import _listops as L
from ._base import GradientTransformation, transformation

__all__ = ["MultiSteps", "apply_every"]

_KEYS = ("acc_grads", "gradient_step", "inner_state", "mini_step")


def _ms_init(params: TensorDict, *, name: str, inner, every_k, mean, skip) -> TensorDict:
    leaves = L.check_params(f"fd.optim.{name}.init", params)
    zero = L.new_count(leaves)
    acc = unflatten_like(params, L.zeros_like(leaves))
    return L.state_td(
        {
            "acc_grads": acc,
            "gradient_step": zero,
            "inner_state": inner.init(params),
            "mini_step": zero.clone(),
        }
    )


def _where(cond: Tensor, a: Any, b: Any) -> Any:
    """``a`` where ``cond`` else ``b``, leaf by leaf (two trees of one structure)."""
    la, spec = tree.flatten(a)
    lb = tree.leaves(b)
    return tree.unflatten(spec, [torch.where(cond, x, y) for x, y in zip(la, lb)])


def _ms_update(updates, state, params=None, *, name: str, inner, every_k, mean, skip):
    where = f"fd.optim.{name}.update"
    L.check_state(where, state, _KEYS)
    g, spec = L.checked_leaves(where, "grads", updates)
    d = state._data
    mini, step = d["mini_step"], d["gradient_step"]
    k = every_k(step) if callable(every_k) else every_k
    k = (  # a fill, not a host copy, for an int: it can be recorded by fd.cuda_graph
        k.to(dtype=mini.dtype, device=mini.device)
        if isinstance(k, torch.Tensor)
        else torch.full((), k, dtype=mini.dtype, device=mini.device)
    )
    acc_old = L.checked_leaves(where, "opt_state['acc_grads']", d["acc_grads"])[0]
    if mean:  # Welford's running mean, as optax
        n = (mini + 1).to(L.scalar_dtype(g))
        acc = [a + (x - a) / n for x, a in zip(g, acc_old)]
    else:
        acc = [a + x for x, a in zip(g, acc_old)]
    acc_td = unflatten_like(spec, acc)
    final, inner_new = inner.update(acc_td, d["inner_state"], params)
    emit = mini == k - 1
    new_state = {
        "mini_step": torch.where(emit, torch.zeros_like(mini), mini + 1),
        "gradient_step": torch.where(emit, step + 1, step),
        "inner_state": _where(emit, inner_new, d["inner_state"]),
        "acc_grads": unflatten_like(spec, [torch.where(emit, torch.zeros_like(a), a) for a in acc]),
    }
    out = [torch.where(emit, u, torch.zeros_like(u)) for u in tree.leaves(final)]
    out_td = unflatten_like(spec, out)
    if skip is not None:  # a rejected mini-step: as if it never happened
        bad = torch.as_tensor(skip(updates, step, params), device=mini.device)
        out_td = _where(bad, unflatten_like(spec, L.zeros_like(out)), out_td)
        new_state = {k: _where(bad, d[k], v) for k, v in new_state.items()}
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
        should_skip_update_fn: ``(updates, gradient_step, params) -> bool tensor``;
            a mini-step for which it is true changes nothing (zero updates, state
            kept), e.g. one with a non-finite gradient.

    Raises:
        TypeError: ``inner`` is not a GradientTransformation.
        ValueError: an int ``every_k_schedule`` below 1.

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
    ) -> MultiSteps:
        if not isinstance(inner, GradientTransformation):
            raise TypeError(
                f"fd.optim.MultiSteps wraps a GradientTransformation, got a {type(inner).__name__}."
            )
        if isinstance(every_k_schedule, int) and every_k_schedule < 1:
            raise ValueError(
                f"fd.optim.MultiSteps: every_k_schedule must be >= 1, got {every_k_schedule}."
            )
        gt = transformation(
            "MultiSteps", _ms_init, _ms_update, inner=inner, every_k=every_k_schedule,
            mean=bool(use_grad_mean), skip=should_skip_update_fn,
        )  # fmt: skip
        return tuple.__new__(cls, gt)

    def __init__(
        self,
        inner: GradientTransformation,
        every_k_schedule: int | Callable[[Tensor], Any],
        use_grad_mean: bool = True,
        should_skip_update_fn: Callable[..., Any] | None = None,
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
