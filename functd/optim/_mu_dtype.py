"""Adam's ``mu_dtype``: the first moment stored in another dtype (optax's option).

The wrapped transformation's state is the plain optimizer's (``count``,
``exp_avg``, ``exp_avg_sq``...) with ``exp_avg`` in ``mu_dtype``. Each update casts
``exp_avg`` to the dtype of ``exp_avg_sq`` (the params'), runs the plain step there
and stores the new ``exp_avg`` back in ``mu_dtype``: the step is computed at the
params' precision, only the stored moment is rounded (bfloat16 moments halve its
memory).

Example:
    >>> opt = fd.optim.adam(1e-3, mu_dtype=torch.bfloat16)
    >>> opt.init(params)["exp_avg", "w"].dtype
    torch.bfloat16
"""

from __future__ import annotations

from typing import Any

import torch

from .._td import TensorDict
from .._td._tree import flat_leaves, unflatten_like
from . import _listops as L
from ._base import GradientTransformation, transformation

__all__ = ["with_mu_dtype"]


def _cast(state: TensorDict, like: TensorDict | None, dtype: torch.dtype | None) -> TensorDict:
    """``state`` with its ``exp_avg`` leaves cast to ``dtype`` or, when None, to the
    dtypes of the matching ``like`` leaves (``exp_avg_sq``)."""
    mu = state._data["exp_avg"]
    if not isinstance(mu, TensorDict):
        return state  # a wrong state: the plain optimizer's own check names it
    ref = flat_leaves(like) if like is not None else None
    leaves = flat_leaves(mu)
    if ref is not None and len(ref) != len(leaves):
        return state
    new = [x.to(dtype if ref is None else r.dtype) for x, r in zip(leaves, ref or leaves)]
    return L.state_td({**state._data, "exp_avg": unflatten_like(mu, new)})


def _init(params: TensorDict, *, name: str, inner: GradientTransformation, mu_dtype: Any):
    return _cast(inner.init(params), None, mu_dtype)


def _update(updates, state, params=None, *, name: str, inner: GradientTransformation, mu_dtype):
    wide = state
    nu = state._data.get("exp_avg_sq") if isinstance(state, TensorDict) else None
    if isinstance(nu, TensorDict):
        wide = _cast(state, nu, None)
    updates, new = inner.update(updates, wide, params)
    return updates, _cast(new, None, mu_dtype)


def with_mu_dtype(
    name: str, inner: GradientTransformation, mu_dtype: torch.dtype | None
) -> GradientTransformation:
    """``inner`` (an Adam-kernel transformation) storing ``exp_avg`` in ``mu_dtype``;
    ``inner`` itself when ``mu_dtype`` is None (internal helper)."""
    if mu_dtype is None:
        return inner
    return transformation(name, _init, _update, inner=inner, mu_dtype=mu_dtype)
