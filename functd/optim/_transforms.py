"""Building blocks to ``chain``: scaling, weight decay, clipping, and the
directions of the usual optimizers without their learning rate.

Example:
    >>> opt = fd.optim.chain(
    ...     fd.optim.clip_by_global_norm(1.0),
    ...     fd.optim.scale_by_adam(),
    ...     fd.optim.add_decayed_weights(1e-2),
    ...     fd.optim.scale_by_learning_rate(fd.optim.cosine_decay(1e-3, 1000)),
    ... )   # AdamW with clipping and a cosine schedule
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._td import TensorDict
from .._td._tree import unflatten_like
from . import _checks as C
from . import _errors as E
from . import _listops as L
from ._base import GradientTransformation, transformation
from ._kernels import kernel_transformation
from ._mu_dtype import with_mu_dtype

Hyper = float | Tensor


# ------------------------------------------------------------------ stateless
def _empty_init(params: TensorDict, *, name: str, **hp: Any) -> TensorDict:
    L.check_params(f"fd.optim.{name}.init", params)
    return L.state_td({})


def _map_update(updates, state, params=None, *, name: str, fn: Callable[..., Any], **hp: Any):
    where = f"fd.optim.{name}.update"
    L.check_state(where, state, ())
    g, spec = L.checked_leaves(where, "grads", updates)
    p = None
    if fn is _decay:
        if params is None:
            raise ValueError(E.needs_params(where, "add_decayed_weights"))
        p, pspec = L.checked_leaves(where, "params", params)
        L.check_same(where, "grads", g, spec, "params", p, pspec, updates, params)
    return unflatten_like(spec, fn(g, p, L.foreach(g), **hp)), state


def _scale(g, p, fe, *, step_size):
    return L.scale(step_size, g, fe)


def _decay(g, p, fe, *, weight_decay):
    return L.axpy(weight_decay, p, g, fe)


def _clip(g, p, fe, *, max_delta):
    if fe:
        return torch._foreach_clamp_max(torch._foreach_clamp_min(g, -max_delta), max_delta)
    return [torch.clamp(x, -max_delta, max_delta) for x in g]


def _clip_norm(g, p, fe, *, max_norm):
    # torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), capped at 1
    norm = L.global_norm(g, fe)
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    return L.mul(g, coef.to(L.scalar_dtype(g)), fe) if g else g


def scale(step_size: Hyper) -> GradientTransformation:
    """Multiply the updates by ``step_size`` (stateless).

    Example:
        >>> fd.optim.chain(fd.optim.scale_by_adam(), fd.optim.scale(-1e-3))  # Adam
    """
    return transformation("scale", _empty_init, _map_update, fn=_scale, step_size=step_size)


def add_decayed_weights(weight_decay: Hyper = 0.0) -> GradientTransformation:
    """Add ``weight_decay * params`` to the updates (stateless; needs ``params``).

    Before ``scale_by_adam`` this is torch's L2 ``weight_decay`` of Adam/SGD;
    after it (and before the learning rate), AdamW's decoupled decay.

    Raises:
        ValueError: negative ``weight_decay``; at update, ``params`` missing.

    Example:
        >>> fd.optim.add_decayed_weights(1e-4)
    """
    C.nonneg("fd.optim.add_decayed_weights", "weight_decay", weight_decay)
    return transformation(
        "add_decayed_weights", _empty_init, _map_update, fn=_decay, weight_decay=weight_decay
    )


def clip(max_delta: float) -> GradientTransformation:
    """Clamp every update element to ``[-max_delta, max_delta]`` (as
    ``torch.nn.utils.clip_grad_value_``; stateless).

    Example:
        >>> fd.optim.clip(1.0)
    """
    C.nonneg("fd.optim.clip", "max_delta", max_delta)
    return transformation("clip", _empty_init, _map_update, fn=_clip, max_delta=max_delta)


def clip_by_global_norm(max_norm: float) -> GradientTransformation:
    """Scale the updates so that their global 2-norm is at most ``max_norm``.

    As ``torch.nn.utils.clip_grad_norm_``: the factor is
    ``min(1, max_norm / (norm + 1e-6))`` (optax's has no 1e-6). Under ``vmap`` the
    norm is per member; on a stacked ensemble without ``vmap`` it spans all members.

    Example:
        >>> fd.optim.chain(fd.optim.clip_by_global_norm(1.0), fd.optim.adam(1e-3))
    """
    C.nonneg("fd.optim.clip_by_global_norm", "max_norm", max_norm)
    return transformation(
        "clip_by_global_norm", _empty_init, _map_update, fn=_clip_norm, max_norm=max_norm
    )


# ------------------------------------------------------------------ counted
def _count_init(params: TensorDict, *, name: str, **hp: Any) -> TensorDict:
    leaves = L.check_params(f"fd.optim.{name}.init", params)
    return L.state_td({"count": L.new_count(leaves)})


def _schedule_update(
    updates, state, params=None, *, name: str, schedule: Callable[..., Any], sign: int
):
    where = f"fd.optim.{name}.update"
    L.check_state(where, state, ("count",))
    g, spec = L.checked_leaves(where, "grads", updates)
    count = state._data["count"]
    value = schedule(count.to(L.scalar_dtype(g)))
    out = unflatten_like(spec, L.scale(value if sign > 0 else -value, g, L.foreach(g)))
    return out, L.state_td({"count": count + 1})


def scale_by_schedule(schedule: Callable[[Tensor], Tensor]) -> GradientTransformation:
    """Multiply the updates by ``schedule(count)``; state ``{"count"}``.

    The count is the number of updates done so far (0 at the first one), as
    torch's ``lr_scheduler.step()`` after each ``optimizer.step()``.

    Example:
        >>> fd.optim.scale_by_schedule(fd.optim.exponential_decay(1.0, 100, 0.5))
    """
    return transformation(
        "scale_by_schedule", _count_init, _schedule_update, schedule=schedule, sign=1
    )


def scale_by_learning_rate(
    lr: float | Tensor | Callable[[Tensor], Tensor],
) -> GradientTransformation:
    """Multiply the updates by ``-lr``; ``lr`` a number (stateless) or a schedule
    of the step count (state ``{"count"}``).

    Raises:
        ValueError: a negative number.

    Example:
        >>> fd.optim.scale_by_learning_rate(1e-3)
    """
    C.lr("fd.optim.scale_by_learning_rate", lr)
    if callable(lr):
        return transformation(
            "scale_by_learning_rate", _count_init, _schedule_update, schedule=lr, sign=-1
        )
    return transformation(
        "scale_by_learning_rate", _empty_init, _map_update, fn=_scale, step_size=-lr
    )


# ------------------------------------------------------------------ directions
def trace(
    momentum: Hyper = 0.9, dampening: Hyper = 0.0, nesterov: bool = False
) -> GradientTransformation:
    """torch.optim.SGD's momentum without the learning rate (see :func:`sgd`).

    State: ``count``, ``momentum_buffer``.

    Example:
        >>> fd.optim.chain(fd.optim.trace(0.9), fd.optim.scale_by_learning_rate(0.1))
    """
    C.nonneg("fd.optim.trace", "momentum", momentum)
    return kernel_transformation(
        "trace", "sgd", momentum=momentum, dampening=dampening, nesterov=nesterov
    )


def scale_by_adam(
    b1: Hyper = 0.9,
    b2: Hyper = 0.999,
    eps: Hyper = 1e-8,
    amsgrad: bool = False,
    mu_dtype: torch.dtype | None = None,
) -> GradientTransformation:
    """Adam's direction without the learning rate (see :func:`adam`; ``mu_dtype``:
    the dtype ``exp_avg`` is stored in, as ``optax.scale_by_adam(mu_dtype=...)``).

    Example:
        >>> fd.optim.chain(fd.optim.scale_by_adam(), fd.optim.scale_by_learning_rate(1e-3))
    """
    where = "fd.optim.scale_by_adam"
    C.beta(where, "b1", b1)
    C.beta(where, "b2", b2)
    C.nonneg(where, "eps", eps)
    C.float_dtype(where, "mu_dtype", mu_dtype)
    tx = kernel_transformation("scale_by_adam", "adam", b1=b1, b2=b2, eps=eps, amsgrad=amsgrad)
    return with_mu_dtype("scale_by_adam", tx, mu_dtype)


def scale_by_rms(
    alpha: Hyper = 0.99, eps: Hyper = 1e-8, momentum: Hyper = 0.0, centered: bool = False
) -> GradientTransformation:
    """RMSprop's direction without the learning rate (see :func:`rmsprop`).

    Example:
        >>> fd.optim.scale_by_rms(0.9)
    """
    C.beta("fd.optim.scale_by_rms", "alpha", alpha)
    return kernel_transformation(
        "scale_by_rms", "rmsprop", alpha=alpha, eps=eps, momentum=momentum, centered=centered
    )


def scale_by_lion(b1: Hyper = 0.9, b2: Hyper = 0.99) -> GradientTransformation:
    """Lion's direction ``sign(...)`` without the learning rate (see :func:`lion`).

    Example:
        >>> fd.optim.chain(fd.optim.scale_by_lion(), fd.optim.scale_by_learning_rate(1e-4))
    """
    C.beta("fd.optim.scale_by_lion", "b1", b1)
    C.beta("fd.optim.scale_by_lion", "b2", b2)
    return kernel_transformation("scale_by_lion", "lion", b1=b1, b2=b2)
