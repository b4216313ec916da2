"""Schedules: values as a function of the step count, held as a tensor.

A schedule is a frozen, hashable value called as ``schedule(count)`` with the
count as a tensor (int or float; a Python int is accepted too) and returns a
tensor of the count's floating dtype. Only tensor ops, no Python branching on
the count, so a compiled training step never recompiles as the count grows
(and it can be captured in a CUDA graph). Pass one wherever an optimizer takes
``lr``: the count is the number of updates done so far (0 at the first one),
as ``torch.optim.lr_scheduler`` stepped after each ``optimizer.step()``.

Example:
    >>> sched = fd.optim.warmup_cosine_decay(0.0, 1e-3, warmup_steps=100, decay_steps=1000)
    >>> opt = fd.optim.adamw(lr=sched)
    >>> float(sched(torch.tensor(100)))
    0.001
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["constant", "cosine_decay", "exponential_decay", "linear", "warmup_cosine_decay"]


def _float(count: Tensor | int) -> Tensor:
    count = torch.as_tensor(count)
    return count if count.is_floating_point() else count.to(torch.get_default_dtype())


def _check_steps(name: str, arg: str, value: int, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"fd.optim.{name}({arg}={value!r}): {arg} must be an int >= {minimum}.")


@dataclass(frozen=True)
class constant:
    """The same value at every step.

    Example:
        >>> fd.optim.constant(0.1)(torch.tensor(5))
        tensor(0.1000)
    """

    value: float

    def __call__(self, count: Tensor | int) -> Tensor:
        c = _float(count)
        return torch.zeros_like(c) + self.value


@dataclass(frozen=True)
class linear:
    """From ``init_value`` to ``end_value`` linearly over ``transition_steps`` steps
    starting at ``transition_begin``; constant before and after (optax's
    ``linear_schedule``; torch's ``LinearLR`` with ``start_factor``/``end_factor``
    times the base lr).

    Example:
        >>> fd.optim.linear(1.0, 0.0, transition_steps=10)(torch.tensor(5))
        tensor(0.5000)
    """

    init_value: float
    end_value: float
    transition_steps: int
    transition_begin: int = 0

    def __post_init__(self) -> None:
        _check_steps("linear", "transition_steps", self.transition_steps)
        _check_steps("linear", "transition_begin", self.transition_begin, 0)

    def __call__(self, count: Tensor | int) -> Tensor:
        c = _float(count)
        frac = torch.clamp((c - self.transition_begin) / self.transition_steps, 0.0, 1.0)
        return self.init_value + (self.end_value - self.init_value) * frac


@dataclass(frozen=True)
class cosine_decay:
    """``init_value * ((1 - alpha) * (1 + cos(pi * t / decay_steps)) / 2 + alpha)`` with
    ``t = min(count, decay_steps)`` (torch's ``CosineAnnealingLR(T_max=decay_steps,
    eta_min=alpha * init_value)`` up to ``T_max``; after it the value stays at
    ``alpha * init_value`` where torch's would rise again).

    Example:
        >>> fd.optim.cosine_decay(1.0, 100)(torch.tensor(50))
        tensor(0.5000)
    """

    init_value: float
    decay_steps: int
    alpha: float = 0.0

    def __post_init__(self) -> None:
        _check_steps("cosine_decay", "decay_steps", self.decay_steps)

    def __call__(self, count: Tensor | int) -> Tensor:
        c = torch.clamp(_float(count), max=self.decay_steps)
        cosine = 0.5 * (1 + torch.cos(math.pi * c / self.decay_steps))
        return self.init_value * ((1 - self.alpha) * cosine + self.alpha)


@dataclass(frozen=True)
class warmup_cosine_decay:
    """Linear warmup from ``init_value`` to ``peak_value`` over ``warmup_steps``, then a
    cosine decay to ``end_value`` reached at ``decay_steps`` (warmup included), as
    optax's ``warmup_cosine_decay_schedule``.

    Example:
        >>> s = fd.optim.warmup_cosine_decay(0.0, 1.0, warmup_steps=10, decay_steps=110)
        >>> float(s(torch.tensor(5))), float(s(torch.tensor(60)))
        (0.5, 0.5)
    """

    init_value: float
    peak_value: float
    warmup_steps: int
    decay_steps: int
    end_value: float = 0.0

    def __post_init__(self) -> None:
        _check_steps("warmup_cosine_decay", "warmup_steps", self.warmup_steps, 0)
        if not isinstance(self.decay_steps, int) or self.decay_steps <= self.warmup_steps:
            raise ValueError(
                f"fd.optim.warmup_cosine_decay(decay_steps={self.decay_steps!r}): decay_steps "
                f"counts the warmup too, so it must be an int > warmup_steps "
                f"({self.warmup_steps})."
            )

    def __call__(self, count: Tensor | int) -> Tensor:
        c = _float(count)
        w = max(self.warmup_steps, 1)
        warm = self.init_value + (self.peak_value - self.init_value) * torch.clamp(c / w, max=1.0)
        span = self.decay_steps - self.warmup_steps
        t = torch.clamp(c - self.warmup_steps, 0.0, span)
        cosine = 0.5 * (1 + torch.cos(math.pi * t / span))
        decayed = self.end_value + (self.peak_value - self.end_value) * cosine
        return torch.where(c < self.warmup_steps, warm, decayed)


@dataclass(frozen=True)
class exponential_decay:
    """``init_value * decay_rate ** ((count - transition_begin) / transition_steps)``
    from ``transition_begin`` on (the exponent floored when ``staircase``), bounded by
    ``end_value`` when given; as optax's ``exponential_decay``. torch's
    ``ExponentialLR(gamma)`` is ``transition_steps=1, decay_rate=gamma``; its
    ``StepLR(step_size, gamma)`` adds ``staircase=True``.

    Example:
        >>> fd.optim.exponential_decay(1.0, 10, 0.5)(torch.tensor(20))
        tensor(0.2500)
    """

    init_value: float
    transition_steps: int
    decay_rate: float
    transition_begin: int = 0
    staircase: bool = False
    end_value: float | None = None

    def __post_init__(self) -> None:
        _check_steps("exponential_decay", "transition_steps", self.transition_steps)
        _check_steps("exponential_decay", "transition_begin", self.transition_begin, 0)
        if not self.decay_rate > 0:
            raise ValueError(
                f"fd.optim.exponential_decay(decay_rate={self.decay_rate!r}): decay_rate "
                "must be > 0."
            )

    def __call__(self, count: Tensor | int) -> Tensor:
        c = _float(count)
        p = torch.clamp(c - self.transition_begin, min=0.0) / self.transition_steps
        if self.staircase:
            p = torch.floor(p)
        value = self.init_value * torch.pow(torch.full_like(c, self.decay_rate), p)
        if self.end_value is not None:
            bound = torch.clamp_min if self.decay_rate < 1 else torch.clamp_max
            value = bound(value, self.end_value)
        return value
