"""Data parallelism as an optimizer step: ``mean_updates()`` and ``sum_updates()``.

As in optax, the cross-replica reduction of the gradients is a (stateless)
gradient transformation, so it chains with the rest of the optimizer and the
training step stays the one of a single process:

    >>> opt = fd.optim.chain(fd.distributed.mean_updates(), fd.optim.clip_by_global_norm(1.0),
    ...                      fd.optim.adam(1e-3))
    >>> step = fd.train_step(loss_fn, opt)   # each rank: its shard of the batch

``mean_updates`` averages the plain-tensor updates over the ranks (one bucketed
all-reduce, see :func:`functd.distributed.all_reduce`), which is what DDP does
to the gradients of a mean loss; clipping after it sees the global norm.

DTensor updates are reduced by DTensor itself: a leaf with a ``Partial``
placement (the gradient of a global loss over a sharded batch) is
redistributed to ``Replicate``, which *is* the gradient of the global loss; it
is not divided again. Other DTensor leaves (Replicate, Shard) are already
global and pass unchanged. The hook is :func:`resolve_partial`.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .._td import TensorDict
from .._td._tree import tree as fdtree
from .._td._tree import unflatten_like
from ..optim import _listops as L
from ..optim._base import GradientTransformation, transformation
from ..optim._errors import not_a_td
from ._collectives import _DEFAULT_CAP_MB, _all_reduce, _is_dtensor, all_reduce
from ._fast import reduce_td

__all__ = ["mean_updates", "sum_updates", "resolve_partial"]


def resolve_partial(x: Tensor) -> Tensor:
    """A DTensor with ``Partial`` placements redistributed to ``Replicate`` on
    those mesh dims (the reduction DTensor owes); other placements unchanged.

    Example:
        >>> g = resolve_partial(g)  # Partial(sum) -> Replicate: the summed gradient
    """
    placements = x.placements  # type: ignore[attr-defined]
    if not any(p.is_partial() for p in placements):
        return x
    from torch.distributed.tensor import Replicate

    new = [Replicate() if p.is_partial() else p for p in placements]
    return x.redistribute(x.device_mesh, new)  # type: ignore[attr-defined]


def _init(params, *, name: str, **hp: Any):
    L.check_params(f"fd.distributed.{name}.init", params)
    return L.state_td({})


def _update(updates, state, params=None, *, name: str, op: str, group: Any, bucket_cap_mb):
    where = f"fd.distributed.{name}.update"
    L.check_state(where, state, ())
    if not isinstance(updates, TensorDict):
        raise TypeError(not_a_td(where, "grads", updates))
    fast = reduce_td(where, updates, op, group, bucket_cap_mb)  # the eager hot path
    if fast is not None:
        return unflatten_like(updates, fast), state
    leaves, spec = fdtree.flatten(updates)  # type: ignore[arg-type, var-annotated]
    dtensors = [i for i, x in enumerate(leaves) if _is_dtensor(x)]
    if not dtensors:  # the common case: one bucketed all-reduce, named errors
        out = _all_reduce(where, updates, op, group, bucket_cap_mb, "first", (leaves, spec))
        return unflatten_like(updates, out), state
    out = list(leaves)
    for i in dtensors:
        out[i] = resolve_partial(leaves[i])
    plain = [i for i, x in enumerate(leaves) if not _is_dtensor(x)]
    if plain:
        reduced = all_reduce([leaves[i] for i in plain], op, group, bucket_cap_mb=bucket_cap_mb)
        for i, r in zip(plain, reduced):
            out[i] = r
    return unflatten_like(updates, out), state


def mean_updates(
    group: Any = None, *, bucket_cap_mb: float = _DEFAULT_CAP_MB
) -> GradientTransformation:
    """The mean of the updates over the ranks of ``group`` (stateless), as DDP.

    Put it first in the chain, so everything after it (clipping, Adam) sees the
    gradient of the whole batch. ``group=None`` is the default process group.

    Example:
        >>> opt = fd.optim.chain(fd.distributed.mean_updates(), fd.optim.adam(1e-3))
    """
    return transformation(
        "mean_updates", _init, _update, op="mean", group=group, bucket_cap_mb=bucket_cap_mb
    )


def sum_updates(
    group: Any = None, *, bucket_cap_mb: float = _DEFAULT_CAP_MB
) -> GradientTransformation:
    """The sum of the updates over the ranks of ``group`` (stateless): for a loss
    that is a sum over the examples, or a per-rank mean already scaled by ``1/W``.

    Example:
        >>> opt = fd.optim.chain(fd.distributed.sum_updates(), fd.optim.sgd(0.1))
    """
    return transformation(
        "sum_updates", _init, _update, op="sum", group=group, bucket_cap_mb=bucket_cap_mb
    )
