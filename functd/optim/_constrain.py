"""``zero_nans``: replace NaN updates by zeros, recording where it happened (optax's).

Example:
    >>> opt = fd.optim.chain(fd.optim.zero_nans(), fd.optim.adam(1e-3))
    >>> updates, state = opt.update(grads, state, params)
    >>> state["0", "found_nan"]      # per params entry: a bool, True if it held a NaN
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from .._td import TensorDict, from_parts
from .._td._tree import same_keys, unflatten_like
from . import _errors as E
from . import _listops as L
from ._base import GradientTransformation, transformation

__all__ = ["zero_nans"]


def _scalars_like(td: TensorDict, it: Iterator[Tensor]) -> TensorDict:
    """A TensorDict with ``td``'s keys (nested alike) holding scalars from ``it`` in
    ``flat_leaves`` order, every level of batch size ``[]``."""
    vals = {}
    for k in sorted(td._data):
        v = td._data[k]
        vals[k] = _scalars_like(v, it) if type(v) is TensorDict else next(it)
    return from_parts(vals, torch.Size([]))


def _init(params: TensorDict, *, name: str) -> TensorDict:
    leaves = L.check_params(f"fd.optim.{name}.init", params)
    found = (torch.zeros((), dtype=torch.bool, device=x.device) for x in leaves)
    return L.state_td({"found_nan": _scalars_like(params, found)})


def _update(updates, state, params=None, *, name: str):
    where = f"fd.optim.{name}.update"
    L.check_state(where, state, ("found_nan",))
    g, spec = L.checked_leaves(where, "grads", updates)
    _, old = L.checked_leaves(where, "opt_state['found_nan']", state._data["found_nan"])
    if not same_keys(updates, old):
        raise ValueError(E.layout_mismatch(where, "grads", updates, "opt_state['found_nan']", old))
    nan = [torch.isnan(x) for x in g]
    out = [torch.where(m, torch.zeros_like(x), x) for m, x in zip(nan, g)]
    found = _scalars_like(updates, iter([m.any() for m in nan]))
    return unflatten_like(spec, out), L.state_td({"found_nan": found})


def zero_nans() -> GradientTransformation:
    """Replace the NaN elements of the updates by zeros, as ``optax.zero_nans``.

    Infinities pass unchanged. The state ``{"found_nan"}`` has the params' keys, each
    a bool scalar: True iff that entry of the last updates held a NaN (the state is
    a record for you; the transformation does not read it). To skip a whole step
    instead, see :func:`skip_nonfinite`.

    Example:
        >>> opt = fd.optim.zero_nans()
        >>> updates, state = opt.update(fd.TensorDict({"w": torch.tensor([1.0, nan])}), state)
        >>> updates["w"], state["found_nan", "w"]
        (tensor([1., 0.]), tensor(True))
    """
    return transformation("zero_nans", _init, _update)
