"""Validation of hyper-parameters given as Python numbers.

Tensors (hyper-parameters injected by ``inject_hyperparams``) and schedules are
not checked here: their values are data, and checking them would need a sync
(and break ``vmap``/``compile``). Validate them where you create them.
"""

from __future__ import annotations

import math
from numbers import Number
from typing import Any

import torch

from . import _errors as E


def is_number(v: Any) -> bool:
    return isinstance(v, Number) and not isinstance(v, bool)


def is_zero(v: Any) -> bool:
    """True only for the number 0 (a tensor hyper-parameter is never "structurally" 0)."""
    return is_number(v) and v == 0


def lr(where: str, value: Any) -> None:
    if callable(value) or not is_number(value):
        return
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(
            E.bad_hparam(
                where,
                "lr",
                value,
                "a finite number >= 0",
                "To maximize an objective, minimize its negative instead.",
            )
        )


def beta(where: str, name: str, value: Any) -> None:
    if is_number(value) and not (0 <= value < 1):
        raise ValueError(E.bad_hparam(where, name, value, "in [0, 1)"))


def nonneg(where: str, name: str, value: Any) -> None:
    if is_number(value) and not (value >= 0 and math.isfinite(value)):
        raise ValueError(E.bad_hparam(where, name, value, "a finite number >= 0"))


def positive(where: str, name: str, value: Any) -> None:
    if is_number(value) and not (value > 0 and math.isfinite(value)):
        raise ValueError(E.bad_hparam(where, name, value, "a finite number > 0"))


def float_dtype(where: str, name: str, value: Any) -> None:
    """``value`` must be None or a floating ``torch.dtype`` (an accumulator's dtype)."""
    if value is None:
        return
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise TypeError(
            f"{where}({name}={value!r}): {name} must be None or a floating torch.dtype "
            "such as torch.float32 or torch.bfloat16."
        )
