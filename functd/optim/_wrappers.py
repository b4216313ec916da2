"""Wrappers of a transformation: ``skip_nonfinite``.

Without a wrapper, a NaN or inf gradient flows through like any number, as in
``torch.optim``: the moments and the params become NaN (and stay so). Wrap the
optimizer to skip such steps instead.

Example:
    >>> opt = fd.optim.skip_nonfinite(fd.optim.adam(1e-3))
"""

from __future__ import annotations

import torch

from .._td import TensorDict
from .._td._tree import tree
from . import _listops as L
from ._base import GradientTransformation, transformation


def _init(params: TensorDict, *, name: str, inner: GradientTransformation) -> TensorDict:
    leaves = L.check_params(f"fd.optim.{name}.init", params)
    return L.state_td({"inner_state": inner.init(params), "nonfinite_count": L.new_count(leaves)})


def _all_finite(xs: list[torch.Tensor]) -> torch.Tensor:
    if not xs:
        return torch.ones((), dtype=torch.bool)
    return torch.stack([torch.isfinite(x).all() for x in xs]).all()


def _update(updates, state, params=None, *, name: str, inner: GradientTransformation):
    where = f"fd.optim.{name}.update"
    L.check_state(where, state, ("inner_state", "nonfinite_count"))
    g, _ = L.checked_leaves(where, "grads", updates)
    old_inner = state._data["inner_state"]
    new_updates, new_inner = inner.update(updates, old_inner, params)
    u, spec = tree.flatten(new_updates)  # type: ignore[arg-type, var-annotated]
    ok = _all_finite(g) & _all_finite(u)
    u = [torch.where(ok, x, torch.zeros_like(x)) for x in u]
    s_new, s_spec = tree.flatten(new_inner)  # type: ignore[arg-type, var-annotated]
    s_old = tree.leaves(old_inner)
    kept = [torch.where(ok, a, b) for a, b in zip(s_new, s_old)]
    count = state._data["nonfinite_count"] + (~ok).to(torch.int64)
    new = {"inner_state": tree.unflatten(s_spec, kept), "nonfinite_count": count}
    return tree.unflatten(spec, u), L.state_td(new)


def skip_nonfinite(inner: GradientTransformation) -> GradientTransformation:
    """Skip the steps whose gradients (or resulting updates) hold a NaN or inf.

    On such a step the updates are zeros and the inner state is kept as it was
    (its ``count`` too); ``state["nonfinite_count"]`` counts the skipped steps.
    The choice is made with ``torch.where`` (no sync, no Python branch), so it
    compiles and works under ``vmap`` (per member).

    optax's names for the same idea: :func:`skip_not_finite` is the test itself, as a
    ``should_skip_update_fn`` of :class:`MultiSteps` (it skips one mini-step there);
    ``skip_nonfinite`` applies it to any optimizer's step, and also checks the
    updates the optimizer returns. :func:`zero_nans` zeroes the NaN elements instead
    of skipping the step.

    Raises:
        TypeError: ``inner`` is not a GradientTransformation.

    Example:
        >>> opt = fd.optim.skip_nonfinite(fd.optim.sgd(0.1))
        >>> state = opt.init(params)
        >>> updates, state = opt.update(nan_grads, state)   # zeros; state kept
    """
    if not isinstance(inner, GradientTransformation):
        raise TypeError(
            f"fd.optim.skip_nonfinite wraps a GradientTransformation such as "
            f"fd.optim.adam(1e-3), got a {type(inner).__name__}."
        )
    return transformation("skip_nonfinite", _init, _update, inner=inner)
