"""Target networks: ``incremental_update`` (Polyak averaging) and ``periodic_update``.

Pure functions of two TensorDicts of one layout (online and target params), as
``optax.incremental_update``/``optax.periodic_update``: they compile and run
under ``vmap``; the period's choice is a ``torch.where`` on the step tensor.

Example:
    >>> target = fd.optim.incremental_update(online, target, step_size=0.005)
    >>> target = fd.optim.periodic_update(online, target, steps, update_period=100)
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._td import TensorDict
from .._td._tree import unflatten_like
from . import _listops as L

__all__ = ["incremental_update", "periodic_update"]


def _pair(where: str, new: TensorDict, old: TensorDict):
    n, nspec = L.checked_leaves(where, "new_tensors", new)
    o, ospec = L.checked_leaves(where, "old_tensors", old)
    L.check_same(where, "new_tensors", n, nspec, "old_tensors", o, ospec, new, old)
    return n, o


def incremental_update(
    new_tensors: TensorDict, old_tensors: TensorDict, step_size: float | Tensor
) -> TensorDict:
    """``step_size * new + (1 - step_size) * old``, leaf by leaf (in ``old``'s layout).

    Raises:
        TypeError, ValueError: an argument is not a TensorDict, or their keys or
            shapes differ (the message names the key).

    Example:
        >>> target = fd.optim.incremental_update(online, target, 0.01)
    """
    n, o = _pair("fd.optim.incremental_update", new_tensors, old_tensors)
    return unflatten_like(
        old_tensors, [step_size * x + (1.0 - step_size) * y for x, y in zip(n, o)]
    )


def periodic_update(
    new_tensors: TensorDict, old_tensors: TensorDict, steps: int | Tensor, update_period: int
) -> TensorDict:
    """``new`` when ``steps % update_period == 0``, else ``old``.

    Raises:
        ValueError: ``update_period`` below 1; the layouts differ.

    Example:
        >>> target = fd.optim.periodic_update(online, target, state["count"], 1000)
    """
    where = "fd.optim.periodic_update"
    if isinstance(update_period, bool) or not isinstance(update_period, int) or update_period < 1:
        raise ValueError(f"{where}: update_period must be an int >= 1, got {update_period!r}.")
    n, o = _pair(where, new_tensors, old_tensors)
    if not isinstance(steps, Tensor):
        return new_tensors if steps % update_period == 0 else old_tensors
    now = steps % update_period == 0
    return unflatten_like(old_tensors, [torch.where(now, x, y) for x, y in zip(n, o)])
