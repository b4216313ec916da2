"""The usual optimizers, with ``torch.optim``'s formulas and defaults.

Each returns one :class:`GradientTransformation` whose state is a TensorDict
``{"count": int64 scalar, <statistic>: like params, ...}``, named as in
``torch.optim``'s per-parameter state (``exp_avg``, ``momentum_buffer``...). The
updates are ``-lr * direction``: add them with ``apply_updates``. ``lr`` (and
any numeric hyper-parameter) may be a schedule ``count -> value``; with
``inject_hyperparams`` they may be tensors held in the state.

Where torch.optim and optax differ, these follow torch.optim (each docstring
says how), so a model trained with ``torch.optim.X`` trains the same here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from . import _checks as C
from ._base import GradientTransformation
from ._kernels import kernel_transformation
from ._mu_dtype import with_mu_dtype

Schedule = Callable[[Tensor], Tensor]
Hyper = float | Tensor
LR = float | Tensor | Schedule


def _lr(where: str, key: str, value: Any) -> None:
    C.lr(where, value)


# How each argument given as a Python number is checked, by name (an argument not
# named here is not; tensors and schedules are not: see _checks).
_RULES: dict[str, Callable[[str, str, Any], None]] = {
    "lr": _lr,
    **dict.fromkeys(("b1", "b2", "alpha"), C.beta),
    **dict.fromkeys(
        ("eps", "weight_decay", "momentum", "lr_decay", "initial_accumulator_value"), C.nonneg
    ),
}


def _nesterov(where: str, hparams: dict[str, Any]) -> None:
    momentum, dampening = hparams["momentum"], hparams["dampening"]
    if hparams["nesterov"] and (C.is_zero(momentum) or (C.is_number(dampening) and dampening != 0)):
        raise ValueError(
            f"{where}(nesterov=True) needs momentum > 0 and dampening = 0 (as "
            f"torch.optim.SGD); got momentum={momentum!r}, dampening={dampening!r}."
        )


# name -> (the kernel it runs, whether its weight decay is decoupled)
_KERNELS = {
    "sgd": ("sgd", False),
    "adam": ("adam", False),
    "adamw": ("adam", True),
    "rmsprop": ("rmsprop", False),
    "adagrad": ("adagrad", False),
    "lion": ("lion", True),
}


def _optimizer(
    name: str, hparams: dict[str, Any], check: Callable[[str, dict[str, Any]], None] | None = None
) -> GradientTransformation:
    """Check an optimizer's arguments and build its transformation.

    ``hparams`` is the factory's ``locals()`` taken first thing: its arguments in
    signature order, which is the order they are checked in (so the first bad one
    is named) and the order of the transformation's ``repr``. ``check`` (a rule
    across arguments) runs after the rules of each.
    """
    where = f"fd.optim.{name}"
    for key, value in hparams.items():
        rule = _RULES.get(key)
        if rule is not None:
            rule(where, key, value)
    if check is not None:
        check(where, hparams)
    kernel, decoupled = _KERNELS[name]
    hparams = dict(hparams)
    mu_dtype = hparams.pop("mu_dtype", None)
    C.float_dtype(where, "mu_dtype", mu_dtype)
    tx = kernel_transformation(name, kernel, decoupled=decoupled, **hparams)
    return with_mu_dtype(name, tx, mu_dtype)


def sgd(
    lr: LR = 1e-3,
    momentum: Hyper = 0.0,
    dampening: Hyper = 0.0,
    weight_decay: Hyper = 0.0,
    nesterov: bool = False,
) -> GradientTransformation:
    """Stochastic gradient descent, as ``torch.optim.SGD``.

    ``weight_decay`` is L2: ``weight_decay * params`` is added to the gradient.
    With momentum, the buffer is the gradient itself at the first step (torch's
    rule; optax's ``trace`` starts from zero) and ``dampening`` scales the new
    gradient afterwards. State: ``count`` (+ ``momentum_buffer`` when momentum is
    not 0).

    Raises:
        ValueError: negative ``lr``, ``momentum``, ``weight_decay``; nesterov
            without momentum or with dampening.

    Example:
        >>> opt = fd.optim.sgd(0.1, momentum=0.9, nesterov=True)
    """
    return _optimizer("sgd", locals(), _nesterov)


def adam(
    lr: LR = 1e-3,
    b1: Hyper = 0.9,
    b2: Hyper = 0.999,
    eps: Hyper = 1e-8,
    weight_decay: Hyper = 0.0,
    amsgrad: bool = False,
    mu_dtype: torch.dtype | None = None,
) -> GradientTransformation:
    """Adam, as ``torch.optim.Adam`` (``betas=(b1, b2)``).

    ``weight_decay`` is L2, added to the gradient before the moments (torch's
    Adam; for decoupled decay use :func:`adamw`). ``eps`` is added to
    ``sqrt(v_hat)``, as in both torch and optax. State: ``count``, ``exp_avg``,
    ``exp_avg_sq`` (+ ``max_exp_avg_sq`` with amsgrad).

    ``mu_dtype`` (optax's option) stores ``exp_avg`` in that dtype, e.g.
    ``torch.bfloat16`` to halve its memory; the step itself is computed in the
    params' dtype (optax computes it in the wider of ``mu_dtype`` and the
    gradients'), and only the stored moment is rounded. Default: the params' dtype.

    Raises:
        ValueError: negative ``lr``/``eps``/``weight_decay``, betas outside [0, 1).
        TypeError: ``mu_dtype`` is not a floating torch.dtype.

    Example:
        >>> opt = fd.optim.adam(1e-3)
        >>> state = opt.init(params)
    """
    return _optimizer("adam", locals())


def adamw(
    lr: LR = 1e-3,
    b1: Hyper = 0.9,
    b2: Hyper = 0.999,
    eps: Hyper = 1e-8,
    weight_decay: Hyper = 1e-2,
    amsgrad: bool = False,
    mu_dtype: torch.dtype | None = None,
) -> GradientTransformation:
    """AdamW, as ``torch.optim.AdamW`` (default ``weight_decay=1e-2``, as torch;
    optax's default is 1e-4).

    The decay is decoupled: the update is ``-lr * (adam_direction + weight_decay *
    params)``, i.e. torch's ``params *= 1 - lr * weight_decay`` then the Adam step.
    ``mu_dtype``: the dtype ``exp_avg`` is stored in, as :func:`adam`'s.

    Example:
        >>> opt = fd.optim.adamw(1e-3, weight_decay=0.05)
    """
    return _optimizer("adamw", locals())


def rmsprop(
    lr: LR = 1e-2,
    alpha: Hyper = 0.99,
    eps: Hyper = 1e-8,
    weight_decay: Hyper = 0.0,
    momentum: Hyper = 0.0,
    centered: bool = False,
) -> GradientTransformation:
    """RMSprop, as ``torch.optim.RMSprop``.

    Direction ``g / (sqrt(v) + eps)`` with ``v = alpha * v + (1 - alpha) * g**2``
    (torch puts ``eps`` outside the root, optax inside; ``v`` starts at 0 as in
    torch, optax's ``initial_scale`` is 0 too). ``weight_decay`` is L2 (added to the
    gradient). With momentum the buffer accumulates the direction. State:
    ``count``, ``square_avg`` (+ ``grad_avg`` when centered, ``momentum_buffer``
    with momentum).

    Example:
        >>> opt = fd.optim.rmsprop(1e-2, centered=True)
    """
    return _optimizer("rmsprop", locals())


def adagrad(
    lr: LR = 1e-2,
    lr_decay: Hyper = 0.0,
    weight_decay: Hyper = 0.0,
    initial_accumulator_value: Hyper = 0.0,
    eps: Hyper = 1e-10,
) -> GradientTransformation:
    """Adagrad, as ``torch.optim.Adagrad``.

    ``sum += g**2``; direction ``g / (sqrt(sum) + eps)`` (eps outside the root, as
    torch; optax's ``scale_by_rss`` puts it inside and starts the sum at 0.1),
    scaled by ``lr / (1 + (count - 1) * lr_decay)``. ``weight_decay`` is L2. State:
    ``count``, ``sum``.

    Example:
        >>> opt = fd.optim.adagrad(0.1)
    """
    return _optimizer("adagrad", locals())


def lion(
    lr: LR = 1e-4,
    b1: Hyper = 0.9,
    b2: Hyper = 0.99,
    weight_decay: Hyper = 0.0,
) -> GradientTransformation:
    """Lion (Chen et al., 2023; not in torch.optim): ``-lr * (sign(b1 * m + (1 - b1) *
    g) + weight_decay * params)``, then ``m = b2 * m + (1 - b2) * g``.

    The decay is decoupled (as in the paper and optax). State: ``count``,
    ``exp_avg``.

    Example:
        >>> opt = fd.optim.lion(1e-4, weight_decay=1.0)
    """
    return _optimizer("lion", locals())
