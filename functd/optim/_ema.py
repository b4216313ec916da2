"""``ema``: an exponential moving average of the updates (optax's ``ema``).

``ema = decay * ema + (1 - decay) * updates``; the updates returned are the new
average, divided by ``1 - decay**count`` when ``debias`` (Adam's bias correction:
the average starts at zero). Compare :func:`trace` (torch.optim.SGD's momentum),
``buf = momentum * buf + updates``, which has no ``1 - decay`` factor.

Example:
    >>> opt = fd.optim.chain(fd.optim.ema(0.9), fd.optim.scale_by_learning_rate(0.1))
    >>> state = opt.init(params)        # state["0"]: {"count", "ema"}
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._td import TensorDict
from .._td._tree import unflatten_like
from . import _checks as C
from . import _listops as L
from ._base import GradientTransformation, transformation

__all__ = ["ema"]


def _init(params: TensorDict, *, name: str, decay: Any, debias: bool, dtype: Any) -> TensorDict:
    leaves = L.check_params(f"fd.optim.{name}.init", params)
    zeros = [torch.zeros_like(x, dtype=dtype or x.dtype) for x in leaves]
    return L.state_td({"count": L.new_count(leaves), "ema": unflatten_like(params, zeros)})


def _update(updates, state, params=None, *, name: str, decay: Any, debias: bool, dtype: Any):
    where = f"fd.optim.{name}.update"
    L.check_state(where, state, ("count", "ema"))
    g, spec = L.checked_leaves(where, "grads", updates)
    old, ospec = L.checked_leaves(where, "opt_state['ema']", state._data["ema"])
    L.check_same(where, "grads", g, spec, "opt_state['ema']", old, ospec, updates, ospec)
    # computed in the promoted dtype of the update and the average (as optax), stored
    # in the average's own dtype (so the state's dtypes never drift between steps)
    wide = [torch.promote_types(x.dtype, a.dtype) for x, a in zip(g, old)]
    gw = [x.to(w) for x, w in zip(g, wide)]
    aw = [a.to(w) for a, w in zip(old, wide)]
    fe = L.foreach(g)
    new = L.ema(decay, aw, gw, fe)
    count = state._data["count"] + 1
    out = new
    if debias:
        t = count.to(L.scalar_dtype(gw))
        out = L.div(new, 1 - decay**t, fe) if gw else new
    stored = [x.to(a.dtype) for x, a in zip(new, old)]
    return unflatten_like(spec, out), L.state_td(
        {"count": count, "ema": unflatten_like(ospec, stored)}
    )


def ema(
    decay: float | Tensor, debias: bool = True, accumulator_dtype: torch.dtype | None = None
) -> GradientTransformation:
    """An exponential moving average of the updates, as ``optax.ema``.

    Each step ``ema = decay * ema + (1 - decay) * updates`` (starting from zeros);
    the updates returned are ``ema / (1 - decay**count)`` with ``debias`` (the
    state itself stays biased, as optax's), else ``ema``. State: ``count`` (int64)
    and ``ema`` (shaped like the params, in ``accumulator_dtype``, default the
    params' dtype). The average is computed in the wider dtype of the update and
    the state, then stored in the state's.

    Raises:
        ValueError: ``decay`` outside [0, 1).
        TypeError: ``accumulator_dtype`` is not a floating torch.dtype.

    Example:
        >>> opt = fd.optim.ema(0.9, debias=False)
        >>> state = opt.init(params)
        >>> updates, state = opt.update(grads, state)    # 0.1 * grads at the first step
    """
    C.beta("fd.optim.ema", "decay", decay)
    C.float_dtype("fd.optim.ema", "accumulator_dtype", accumulator_dtype)
    return transformation(
        "ema", _init, _update, decay=decay, debias=bool(debias), dtype=accumulator_dtype
    )
